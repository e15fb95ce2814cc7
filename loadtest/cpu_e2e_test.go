//go:build linux

package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestBenchMeasuresCPU runs bench briefly (one round, 3,000 measured
// purchases) on one instance of a local cluster, its worker on, and on the
// ceiling server's bare route: each process of the instance's deployment,
// found from the instance's URL and cluster.env's addresses, used CPU per
// answer; bare's server is the one its pid file names; the JSON holds the
// ratios to bare.
func TestBenchMeasuresCPU(t *testing.T) {
	c := startCluster(t, "SECKILL_RATE_LIMIT=off")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	port := ceilingPort(t)
	up := exec.CommandContext(ctx, filepath.Join("..", "scripts", "cluster-up.sh"), "ceiling")
	up.Env = append(os.Environ(), "SECKILL_CLUSTER_DIR="+c.dir, "SECKILL_CLUSTER_CEILING_PORT="+port)
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("cluster-up.sh ceiling: %v\n%s", err, out)
	}
	instance := strings.Fields(c.env["SECKILL_API_URLS"])[0]
	ceilingPID := filepath.Join(c.dir, "run", "ceiling.pid")
	results := filepath.Join(t.TempDir(), "bench.json")
	var stdout, stderr testenv.Buffer
	err := run(ctx, []string{"loadtest", "bench", "--mode", "success", "--rounds", "1", "--requests", "3000", "--warmup", "300", "-c", "32",
		"--target", "seckill=" + instance, "--target", "bare=http://127.0.0.1:" + port + "/bare",
		"--pids", "bare=service:" + ceilingPID, "--json", results,
	}, func(k string) string { return c.env[k] }, &stdout, &stderr)
	t.Logf("bench:\n%s\n%s", stderr.String(), stdout.String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var res []benchResult
	if err := json.Unmarshal(b, &res); err != nil || len(res) != 2 {
		t.Fatalf("%d results, %v:\n%s", len(res), err, b)
	}
	seckill, bare := res[0], res[1]
	if seckill.Unexpected != 0 || bare.Unexpected != 0 {
		t.Errorf("unexpected answers: seckill %d, bare %d", seckill.Unexpected, bare.Unexpected)
	}
	labels := func(figs []cpuFigure) []string {
		var out []string
		for _, f := range figs {
			out = append(out, f.Label)
		}
		return out
	}
	if got, want := labels(seckill.CPU), []string{"service", "redis", "locks", "database", "total"}; !slices.Equal(got, want) {
		t.Fatalf("seckill's processes %v, want %v", got, want)
	}
	for _, f := range seckill.CPU {
		if f.Median <= 0 || len(f.Runs) != 1 || f.Base != "bare" {
			t.Errorf("seckill's %s: %+v; want CPU per answer > 0 compared with bare", f.Label, f)
		}
	}
	if svc := seckill.CPU[0]; !slices.Equal(svc.PIDs, []int{c.pid(t, "api-1")}) || svc.Ratio <= 0 {
		t.Errorf("seckill's service %+v: want api-1 (pid %d), a ratio to bare's", svc, c.pid(t, "api-1"))
	}
	if svc := bare.CPU[0]; svc.Label != "service" || !slices.Equal(svc.PIDs, []int{c.pid(t, "ceiling")}) || svc.Median <= 0 || svc.Ratio != 1 {
		t.Errorf("bare's service %+v: want the ceiling server (pid %d), CPU per answer > 0", svc, c.pid(t, "ceiling"))
	}
	if !strings.Contains(stdout.String(), "CPU µs per answer") {
		t.Errorf("no CPU table in the text output")
	}
}

// ceilingPort is a free loopback port p whose p+10000 is free too:
// cluster-up.sh ceiling serves the ceiling's pprof there.
func ceilingPort(t testing.TB) string {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		if p+10000 <= 65535 {
			if ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000)); err == nil {
				ln2.Close()
				ln.Close()
				return strconv.Itoa(p)
			}
		}
		ln.Close()
	}
	t.Fatal("no free port p with p+10000 free")
	return ""
}
