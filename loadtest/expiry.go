package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"seckill/loadtest/load"
)

// expiry measures what unpaid orders cost: how long after its pay
// deadline an unpaid unit is back on sale, under a burst of deadlines, and
// the drain rate with expiries scheduled (a priced voucher) against
// without (a free one), alternating round after round.
func expiry(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg := load.ExpiryConfig{LoadAverage: loadAverage, Log: stderr}
	fs := flag.NewFlagSet("expiry", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", cmp.Or(getenv("SECKILL_URL"), "http://127.0.0.1:18080"), "target: nginx (SECKILL_URL)")
	fs.IntVar(&cfg.Units, "units", 2000, "units of each voucher, and distinct buyers of each burst (all accepted, none paying)")
	fs.Int64Var(&cfg.Price, "price", 50, "the priced voucher's price in cents (its face value is 100)")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds, each a free burst and a priced one, in alternating order")
	fs.IntVar(&cfg.Concurrency, "c", 64, "connections")
	fs.StringVar(&cfg.Secret, "secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	fs.StringVar(&cfg.AdminToken, "admin-token", getenv("SECKILL_ADMIN_TOKEN"), "admin token to create the vouchers (SECKILL_ADMIN_TOKEN; default minted)")
	fs.StringVar(&cfg.Check.RedisURL, "redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment (SECKILL_REDIS_URL)")
	fs.StringVar(&cfg.Check.MySQLDSN, "mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment (SECKILL_MYSQL_DSN)")
	fs.StringVar(&cfg.Check.KeyPrefix, "key-prefix", cmp.Or(getenv("SECKILL_KEY_PREFIX"), "seckill"), "SECKILL_KEY_PREFIX of the deployment")
	fs.IntVar(&cfg.Check.Shards, "shards", envInt(getenv, "SECKILL_SHARDS", 1), "SECKILL_SHARDS of the deployment")
	fs.DurationVar(&cfg.Check.DrainTimeout, "drain-timeout", 2*time.Minute, "bound on each drain, and on the check's wait for a consistent state")
	fs.DurationVar(&cfg.ExpiryTimeout, "expiry-timeout", 3*time.Minute, "bound on the wait for a priced burst's units to be back")
	workerCmd := fs.String("worker", "scripts/cluster-up.sh worker", "shell command that starts one SECKILL_ROLE=worker instance and writes its pid file to --cluster-dir/run/worker-N.pid, run for each burst once its purchases are accepted and stopped (SIGTERM) once its orders are settled; \"\" when the deployment's own instances write (SECKILL_ROLE=all), the drain then timed while the purchases arrive")
	clusterDir := fs.String("cluster-dir", cmp.Or(getenv("SECKILL_CLUSTER_DIR"), ".cluster"), "state directory of scripts/cluster-up.sh, where --worker's pid file appears (SECKILL_CLUSTER_DIR)")
	jsonPath := fs.String("json", "", "also write the result as JSON to this file (- for stdout)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *workerCmd != "" {
		cfg.Worker = &scriptWorker{cmd: *workerCmd, runDir: filepath.Join(*clusterDir, "run"), log: stderr}
	}
	res, err := load.Expiry(ctx, cfg)
	if err != nil {
		return err
	}
	printExpiry(stdout, res, getenv)
	if err := writeJSON(*jsonPath, stdout, res); err != nil {
		return err
	}
	if !res.OK {
		return errCheckFailed
	}
	return nil
}

// printExpiry writes the bursts, one line each, then the medians.
func printExpiry(w io.Writer, r load.ExpiryResult, getenv func(string) string) {
	fmt.Fprintf(w, "\n%d rounds of %d units and %d buyers per burst, nobody pays; priced voucher %d cents; SECKILL_PAY_WINDOW %s, SECKILL_EXPIRY_SWEEP %s (as this shell has them)\n",
		r.Rounds, r.Units, r.Units, r.Price, cmp.Or(getenv("SECKILL_PAY_WINDOW"), "?"), cmp.Or(getenv("SECKILL_EXPIRY_SWEEP"), "?"))
	fmt.Fprintf(w, "%-5s %-6s %8s %9s %10s %28s %10s %8s %6s  %s\n",
		"round", "kind", "voucher", "fired/s", "drain/s", "unit back after deadline s", "deadlines", "window", "check", "load average")
	fmt.Fprintf(w, "%-5s %-6s %8s %9s %10s %28s %10s %8s %6s\n", "", "", "", "", "", "p50 / p99 / max", "spread s", "s", "")
	for _, b := range r.Bursts {
		back, spread, window := "-", "-", "-"
		if e := b.Expiry; e != nil {
			back = fmt.Sprintf("%.3f / %.3f / %.3f", e.BackLate.P50, e.BackLate.P99, e.BackLate.Max)
			spread, window = fmt.Sprintf("%.3f", e.DeadlineSpread), fmt.Sprintf("%.1f", e.Window)
		}
		ok := "OK"
		if !b.Check.OK {
			ok = "FAILED"
		}
		fmt.Fprintf(w, "%-5d %-6s %8d %9.0f %10.0f %28s %10s %8s %6s  %s\n",
			b.Round, b.Kind, b.VoucherID, b.FireRPS, b.Drain.Rate, back, spread, window, ok, b.LoadAverage)
	}
	rates := func(kind string) string {
		var s []string
		for _, b := range r.Bursts {
			if b.Kind == kind {
				s = append(s, fmt.Sprintf("%.0f", b.Drain.Rate))
			}
		}
		return strings.Join(s, " ")
	}
	fmt.Fprintf(w, "\ndrain, orders/s: free %s (median %.0f); priced %s (median %.0f); priced / free %.2f\n",
		rates(load.BurstFree), r.FreeDrainRate, rates(load.BurstPriced), r.PricedDrainRate, r.DrainRatio)
	q := r.BackLate
	fmt.Fprintf(w, "unit back on sale after its deadline, every priced order of every round (%d): p50 %.3fs p90 %.3fs p99 %.3fs max %.3fs (min %.3fs)\n",
		q.N, q.P50, q.P90, q.P99, q.Max, q.Min)
	fmt.Fprintf(w, "load average at the end: %s\n", r.LoadAverage)
	if r.OK {
		fmt.Fprintf(w, "check: OK in every burst (invariants; every priced unit back in Redis)\n")
		return
	}
	fmt.Fprintf(w, "check FAILED:\n  %s\n", strings.Join(r.Violations, "\n  "))
}

// scriptWorker starts a worker with a shell command that records its pid
// in a pid file of runDir ("pid program", as scripts/cluster-up.sh
// worker writes them), and stops that process by the pid file.
type scriptWorker struct {
	cmd    string
	runDir string
	log    io.Writer
}

// Start runs the command and finds the pid file it added.
func (s *scriptWorker) Start(ctx context.Context) (func(context.Context) error, error) {
	before, err := filepath.Glob(filepath.Join(s.runDir, "worker-*.pid"))
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", s.cmd)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w", s.cmd, err)
	}
	after, err := filepath.Glob(filepath.Join(s.runDir, "worker-*.pid"))
	if err != nil {
		return nil, err
	}
	var added []string
	for _, f := range after {
		if !slices.Contains(before, f) {
			added = append(added, f)
		}
	}
	if len(added) != 1 {
		return nil, fmt.Errorf("%s: want one new pid file in %s, found %q", s.cmd, s.runDir, added)
	}
	pid, exe, err := readPidFile(added[0])
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return stopProcess(ctx, added[0], pid, exe) }, nil
}

// readPidFile reads "pid program".
func readPidFile(path string) (int, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, "", err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, "", fmt.Errorf("%s: want \"pid program\", got %q", path, b)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", path, err)
	}
	return pid, f[1], nil
}

// stopProcess sends SIGTERM to pid while it still runs program exe (its
// pid not reused), waits up to 30s for it to go, then SIGKILLs it, and
// removes its pid file.
func stopProcess(ctx context.Context, pidFile string, pid int, exe string) error {
	running := func() bool {
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return err == nil && got == exe
	}
	if running() {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop worker pid %d: %w", pid, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for running() {
			if time.Now().After(deadline) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
	if err := os.Remove(pidFile); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}
