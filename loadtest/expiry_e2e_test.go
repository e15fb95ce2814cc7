//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/loadtest/load"
)

// TestExpiryCommandOnCluster runs `loadtest expiry` as documented: the
// local cluster with SECKILL_ROLE=api instances and a pay window of
// seconds, one round of a small burst on a free voucher and one on a
// priced voucher, each drained by a worker the command starts with
// `scripts/cluster-up.sh worker` and stops. Every priced unit must be back
// in Redis after its deadline, and every invariant hold.
func TestExpiryCommandOnCluster(t *testing.T) {
	c := startCluster(t,
		"SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000", "SECKILL_RATE_LIMIT=off",
		"SECKILL_ROLE=api", "SECKILL_PAY_WINDOW=2s", "SECKILL_EXPIRY_SWEEP=2s", "SECKILL_WORKER_BLOCK=100ms",
	)
	if c.env["SECKILL_PAY_WINDOW"] != "2s" || c.env["SECKILL_PAY_PROVIDER"] != "dev" {
		t.Fatalf("cluster.env carries pay window %q and provider %q, want 2s and dev", c.env["SECKILL_PAY_WINDOW"], c.env["SECKILL_PAY_PROVIDER"])
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	worker := fmt.Sprintf("SECKILL_CLUSTER_DIR='%s' SECKILL_CLUSTER_WORKER_PORT=%s SECKILL_ADMIN_ADDR=off SECKILL_LOG_LEVEL=warn '%s/scripts/cluster-up.sh' worker",
		c.dir, testenv.FreePort(t), root)
	out := filepath.Join(t.TempDir(), "expiry.json")
	var stdout, stderr testenv.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err = run(ctx, []string{"loadtest", "expiry", "--units", "150", "--rounds", "1", "-c", "16",
		"--worker", worker, "--cluster-dir", c.dir, "--expiry-timeout", "90s", "--json", out},
		func(k string) string { return c.env[k] }, &stdout, &stderr)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatalf("loadtest expiry: %v", err)
	}

	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res load.ExpiryResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if !res.OK || len(res.Bursts) != 2 {
		t.Fatalf("OK %v, %d bursts, violations %v", res.OK, len(res.Bursts), res.Violations)
	}
	for _, bu := range res.Bursts {
		if bu.Accepted != 150 || bu.Drain.Orders != 150 || bu.Drain.Rate <= 0 || !bu.Check.OK {
			t.Errorf("%s burst: %d accepted, drain %+v, check %+v", bu.Kind, bu.Accepted, bu.Drain, bu.Check)
		}
		switch bu.Kind {
		case load.BurstFree:
			if bu.Expiry != nil || bu.Check.ByState["paid"] != 150 || bu.Check.RedisStock != 0 {
				t.Errorf("free burst: expiry %+v, states %v, Redis stock %d; want 150 paid, none back", bu.Expiry, bu.Check.ByState, bu.Check.RedisStock)
			}
		case load.BurstPriced:
			e := bu.Expiry
			if e == nil || e.Orders != 150 || bu.Check.ByState["cancelled"] != 150 || bu.Check.RedisStock != 150 {
				t.Fatalf("priced burst: expiry %+v, states %v, Redis stock %d; want 150 expired, all back", e, bu.Check.ByState, bu.Check.RedisStock)
			}
			// Back after the deadline, never before; the window as set.
			if e.BackLate.Min < 0 || e.BackLate.Max < e.BackLate.P99 || e.Window < 1.9 || e.Window > 2.1 {
				t.Errorf("priced burst: unit back after deadline %+v, window %.3fs", e.BackLate, e.Window)
			}
		}
	}
	if res.BackLate.N != 150 || res.FreeDrainRate <= 0 || res.PricedDrainRate <= 0 {
		t.Errorf("summary: %+v", res)
	}
	// The command stopped the workers it started.
	if left, _ := filepath.Glob(filepath.Join(c.dir, "run", "worker-*.pid")); len(left) != 0 {
		t.Errorf("worker pid files left: %v", left)
	}
}
