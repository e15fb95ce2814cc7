//go:build linux

package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/loadtest/grow"
)

// TestMain stops the shared Redis and MariaDB that TestGrowDrains starts.
func TestMain(m *testing.M) { testenv.Main(m) }

// TestGrowDrains: loadtest grow with --worker-bin, at two tiny sizes and a
// grown table on the shared Redis and MariaDB: at each step a worker (the
// service's binary, a process of its own) writes the purchases measured,
// then another every order of the drain's voucher; the worker, Redis and MariaDB each used CPU per order written
// (no lock Redis apart: the locks are on the sale's Redis), their sum is
// the total and within reason; each drain figure has a slope over the
// table's rows between every two steps; the text output has the drains.
func TestGrowDrains(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dsn, _, _ := testenv.MissingMySQLDatabase(t, "_growdrain")
	results := filepath.Join(t.TempDir(), "grow.json")
	var stdout, stderr testenv.Buffer
	err := run(ctx, []string{"loadtest", "grow", "--sizes", "200,800", "--table-rows", "5000", "--purchases", "50", "--drain", "3000",
		"--worker-bin", testenv.Binary(t, "seckill/cmd/api"), "--mysql", dsn, "--redis", testenv.RedisURL(t), "--json", results,
	}, func(string) string { return "" }, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var res grow.Result
	if err := json.Unmarshal(b, &res); err != nil || len(res.Steps) != 3 {
		t.Fatalf("%d steps (%v), want 3:\n%s", len(res.Steps), err, b)
	}
	for _, s := range res.Steps {
		d := s.Drain
		// The purchases measured are written before the drain begins.
		if d.Orders != 3000 || d.Seconds <= 0 || d.TableRows != s.TableRows+50 {
			t.Errorf("drain at %d rows (step's %d): %d orders in %.2fs, want all 3,000 written after the 50 purchases measured", d.TableRows, s.TableRows, d.Orders, d.Seconds)
		}
		if d.Worker <= 0 || d.Redis <= 0 || d.MariaDB <= 0 || d.Locks != 0 {
			t.Errorf("drain at %d rows: worker %.1f, Redis %.1f, MariaDB %.1f, lock Redis %.1f µs per order; want the first three above 0, no lock Redis apart",
				s.TableRows, d.Worker, d.Redis, d.MariaDB, d.Locks)
		}
		// A worker started for 3,000 orders carries its start-up: tens of
		// ms spread over them, not seconds. (Fewer orders cost the sale's
		// Redis less than one clock tick of CPU, read as 0, now and then.)
		if sum := d.Worker + d.Redis + d.MariaDB; math.Abs(d.Total-sum) > 1e-6 || d.Total > 20_000 {
			t.Errorf("drain at %d rows: total %.1f µs per order, parts summing to %.1f", s.TableRows, d.Total, sum)
		}
	}
	slopes := map[string]int{}
	for _, sl := range res.Slopes {
		if strings.HasPrefix(sl.Figure, "drain_") && sl.Over == "table_rows" {
			slopes[sl.Figure]++
		}
	}
	for _, f := range grow.Figures {
		if f.OverTable && slopes[f.Name] != 2 {
			t.Errorf("%s: %d slopes over the table's rows, want 2: %+v", f.Name, slopes[f.Name], res.Slopes)
		}
	}
	if !strings.Contains(stdout.String(), "drains (CPU µs per order written") {
		t.Errorf("no drains in the text output:\n%s", stdout.String())
	}
	t.Logf("grow:\n%s", stdout.String())
}
