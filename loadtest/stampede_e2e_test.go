//go:build linux

package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestStampedeOnCluster: a small stampede (300 buyers pressing twice for
// 100 units) through a local cluster's nginx: the check passes; the
// commands of the sale's Redis and the lock Redis are counted while firing
// and with the drain, by command and by Redis, the sale's masters with
// their script shares; both instances' memory is sampled; the text says
// each of these.
func TestStampedeOnCluster(t *testing.T) {
	c := startCluster(t, "SECKILL_RATE_LIMIT=off", "SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	results := filepath.Join(t.TempDir(), "stampede.json")
	var stdout, stderr testenv.Buffer
	err := run(ctx, []string{"loadtest", "stampede", "--stock", "100", "--users", "300", "--presses", "2", "-c", "16",
		"--pid", filepath.Join(c.dir, "run", "api-1.pid"), "--pid", filepath.Join(c.dir, "run", "api-2.pid"), "--json", results,
	}, func(k string) string { return c.env[k] }, &stdout, &stderr)
	t.Logf("stampede:\n%s", stdout.String())
	if err != nil {
		t.Fatalf("stampede: %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var res stampedeResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if s := res.Summary; s.Requests != 600 || s.Outcomes["202 accepted"] != 100 || s.Check == nil || !s.Check.OK {
		t.Errorf("summary: %d requests, %v, check %+v; want 600, 100 accepted, the check OK", s.Requests, s.Outcomes, s.Check)
	}
	counted := []string{c.env["SECKILL_REDIS_URL"], c.env["SECKILL_LOCK_NODES"]}
	var byRedis, byCommand int64
	for _, u := range counted {
		byRedis += res.ByRedis[u]
	}
	for _, n := range res.ByCommand {
		byCommand += n
	}
	if res.CommandsFiring <= 0 || res.CommandsFiring > res.Commands || byRedis != res.Commands || byCommand != res.Commands ||
		len(res.ByRedis) != len(counted) || res.ByRedis[counted[1]] == 0 {
		t.Errorf("commands: %d firing, %d in all, by Redis %v, by command %v; want both Redis servers counted, the splits summing to the whole",
			res.CommandsFiring, res.Commands, res.ByRedis, res.ByCommand)
	}
	if res.PerRequest != float64(res.Commands)/600 || res.PerRequestFiring != float64(res.CommandsFiring)/600 {
		t.Errorf("per request %v and %v firing, want the commands / 600", res.PerRequest, res.PerRequestFiring)
	}
	var share float64
	for _, m := range res.ScriptsByMaster {
		share += m.Share
	}
	if len(res.ScriptsByMaster) == 0 || share < 0.999 || share > 1.001 {
		t.Errorf("scripts by master %+v: want the sale's masters, shares summing to 1", res.ScriptsByMaster)
	}
	if len(res.Processes) != 2 || slices.ContainsFunc(res.Processes, func(p procMem) bool { return p.MaxRSSKiB <= 0 || p.HWMKiB <= 0 }) {
		t.Errorf("processes %+v: want both instances, memory sampled", res.Processes)
	}
	if len(res.LoadAverage) != 2 {
		t.Errorf("load average %v, want before and after", res.LoadAverage)
	}
	for _, want := range []string{"commands while firing", "by command: ", "by Redis, with the drain: ", "while firing, scripts", "memory       pid ", "load average "} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the text says no %q", want)
		}
	}
}
