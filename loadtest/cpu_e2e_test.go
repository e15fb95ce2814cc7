//go:build linux

package main

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	if len(seckill.LoadgenRuns) != 1 || seckill.Loadgen <= 0 {
		t.Errorf("the load generator's CPU per answer %v", seckill.LoadgenRuns)
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

// TestDrainMeasuresCPU: on a cluster whose instances do not write orders
// (SECKILL_ROLE=api), 4,000 accepted purchases wait on the stream; drain
// watches them while a worker started afterwards writes them: the worker,
// found from its pid file at the end, is counted from its start, and each
// server of the deployment used CPU per order written. capacity.sh total,
// which ends capacity.sh worker, reads drain's JSON into one line per
// server's figure and, last, total_us_per_order=N, their sum.
func TestDrainMeasuresCPU(t *testing.T) {
	c := startCluster(t, "SECKILL_ROLE=api", "SECKILL_RATE_LIMIT=off",
		"SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	getenv := func(k string) string { return c.env[k] }
	var out testenv.Buffer
	summary := filepath.Join(t.TempDir(), "fill.json")
	cfg, opts, err := parseRun([]string{"--users", "4000", "--stock", "4000", "-c", "32", "--verify=false", "--quiet", "--json", summary}, getenv, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := execute(ctx, cfg, opts, &out); err != nil {
		t.Fatalf("fill: %v\n%s", err, out.String())
	}
	vid := readSummary(t, summary).VoucherID

	workerPID := filepath.Join(c.dir, "run", "worker-1.pid")
	results := filepath.Join(t.TempDir(), "drain.json")
	watching := &lineSignal{want: "start the worker now", seen: make(chan struct{})}
	var stdout testenv.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"loadtest", "drain", "--voucher", strconv.FormatInt(vid, 10), "--expect", "4000", "--timeout", "2m",
			"--pids", "service:" + workerPID, "--json", results}, getenv, &stdout, watching)
	}()
	select {
	case <-watching.seen:
	case err := <-done:
		t.Fatalf("drain ended before its watch began: %v", err)
	}
	up := exec.CommandContext(ctx, filepath.Join("..", "scripts", "cluster-up.sh"), "worker")
	up.Env = append(os.Environ(), "SECKILL_CLUSTER_DIR="+c.dir, "SECKILL_CLUSTER_WORKER_PORT="+testenv.FreePort(t), "SECKILL_ADMIN_ADDR=off")
	if b, err := up.CombinedOutput(); err != nil {
		t.Fatalf("cluster-up.sh worker: %v\n%s", err, b)
	}
	if err := <-done; err != nil {
		t.Fatalf("drain: %v\n%s", err, stdout.String())
	}
	t.Logf("drain:\n%s", stdout.String())
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var res drainOutput
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, r := range res.CPU {
		labels = append(labels, r.Label)
		if r.PerOrder <= 0 {
			t.Errorf("%s: %v µs per order written, want more than 0", r.Label, r.PerOrder)
		}
	}
	if want := []string{"redis", "locks", "database", "service", "total"}; res.Orders != 4000 || !slices.Equal(labels, want) {
		t.Fatalf("%d orders, processes %v; want 4000 and %v:\n%s", res.Orders, labels, want, b)
	}
	if w := res.CPU[3]; !w.SinceStart || !slices.Equal(w.PIDs, []int{c.pid(t, "worker-1")}) {
		t.Errorf("the worker %+v: want pid %d counted from its start", w, c.pid(t, "worker-1"))
	}
	checkCapacityTotal(t, results, map[string]float64{
		"worker_us": res.CPU[3].PerOrder, "redis_us": res.CPU[0].PerOrder, "lock_redis_us": res.CPU[1].PerOrder, "mariadb_us": res.CPU[2].PerOrder,
	})
}

// checkCapacityTotal runs capacity.sh total on a drain's JSON: its line
// before last names each server's CPU per order written, as want has it
// (to the printed tenth), and its last line is total_us_per_order=N with
// N their sum (the parts are rounded apart, so within 0.05 per part).
func checkCapacityTotal(t *testing.T, drainJSON string, want map[string]float64) {
	t.Helper()
	if _, err := exec.LookPath("jq"); err != nil {
		t.Skip("no jq: capacity.sh total not run")
	}
	cmd := exec.Command("./capacity.sh", "total", drainJSON)
	cmd.Env = append(os.Environ(), "CAPACITY_DIR="+t.TempDir())
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("capacity.sh total: %v\n%s", err, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last, ok := strings.CutPrefix(lines[len(lines)-1], "total_us_per_order=")
	total, err := strconv.ParseFloat(last, 64)
	if !ok || err != nil || len(lines) < 2 {
		t.Fatalf("capacity.sh total: want worker_us=... then total_us_per_order=N last, got:\n%s", b)
	}
	var sum float64
	parts := strings.Fields(lines[len(lines)-2])
	for _, p := range parts {
		name, v, _ := strings.Cut(p, "=")
		x, err := strconv.ParseFloat(v, 64)
		w, known := want[name]
		if err != nil || !known || math.Abs(x-w) > 0.051 {
			t.Errorf("capacity.sh total: %s, want %s=%.1f", p, name, w)
		}
		sum += x
	}
	if len(parts) != len(want) || math.Abs(total-sum) > 0.051*float64(len(parts)+1) {
		t.Errorf("capacity.sh total: total_us_per_order=%v, parts %v summing to %.1f; want %d parts and their sum", total, parts, sum, len(want))
	}
	t.Logf("capacity.sh total:\n%s", b)
}

// lineSignal closes seen once a write holds want (writes may be split
// anywhere, so it keeps what it was given).
type lineSignal struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
}

func (l *lineSignal) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if strings.Contains(l.buf.String(), l.want) {
		select {
		case <-l.seen:
		default:
			close(l.seen)
		}
	}
	return len(p), nil
}
