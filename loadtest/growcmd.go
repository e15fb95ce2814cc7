package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"seckill/internal/db"
	"seckill/loadtest/grow"
	"seckill/loadtest/load"
)

// growCmd runs "loadtest grow": how the costs of a sale grow with it.
func growCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("grow", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("mysql", growDSN(getenv("SECKILL_MYSQL_DSN")), "a database of the run's own, created if missing, refused if it holds a table, dropped at the end (default: SECKILL_MYSQL_DSN's server, database seckill_grow)")
	redisURL := fs.String("redis", getenv("SECKILL_REDIS_URL"), "one Redis, redis://host:port/db; keys under a prefix of the run's own, deleted at the end (SECKILL_REDIS_URL)")
	sizes := fs.String("sizes", "10000,100000,1000000", "buyers of the voucher measured, ascending, comma-separated")
	table := fs.Int("table-rows", 0, "then fill the orders table to this many rows (an ended voucher's) and measure the last size again, e.g. 10000000")
	purchases := fs.Int("purchases", 2000, "new buyers that measure a purchase at each size")
	drainOrders := fs.Int("drain", 20000, "with --worker-bin: accepted orders of a voucher of their own that a worker writes at each size, measured")
	w := growWorker{log: stderr, secret: getenv("SECKILL_TOKEN_SECRET")}
	fs.StringVar(&w.bin, "worker-bin", getenv("SECKILL_API_BIN"), "the service's binary (go build ./cmd/api): started as a worker on the run's database and keys for each drain; empty: the drain is not measured (SECKILL_API_BIN)")
	fs.StringVar(&w.locks, "lock-redis", getenv("SECKILL_LOCK_NODES"), "the worker's buyer-lock Redis URLs, comma-separated, measured as locks when on loopback; empty: the sale's Redis (SECKILL_LOCK_NODES)")
	keep := fs.Bool("keep", false, "keep the database and the keys")
	jsonPath := fs.String("json", "", "also write the result as JSON to this file (- for stdout)")
	svgPath := fs.String("svg", "", "also draw the figures over the sizes to this SVG file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg := grow.Config{MySQLDSN: *dsn, RedisURL: *redisURL, TableRows: *table, Purchases: *purchases, DrainOrders: *drainOrders, Keep: *keep, Log: stderr}
	if w.bin != "" {
		cfg.Worker = w.drain
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--sizes: %q is not a number", s)
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	res, err := grow.Run(ctx, cfg)
	if err != nil {
		return err
	}
	printGrow(stdout, res)
	if *svgPath != "" {
		if err := os.WriteFile(*svgPath, grow.SVG(res), 0o644); err != nil {
			return err
		}
	}
	return writeJSON(*jsonPath, stdout, res)
}

// growDSN is dsn with its database named seckill_grow ("" stays "").
func growDSN(dsn string) string {
	cfg, err := db.ParseDSN(dsn)
	if dsn == "" || err != nil {
		return dsn
	}
	cfg.DBName = "seckill_grow"
	return cfg.FormatDSN()
}

// printGrow writes a growth run's steps, their drains when measured, then
// each figure's slopes.
func printGrow(w io.Writer, res grow.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "buyers\ttable rows\trebuild s\tRedis B/buyer\tpurchase Redis µs\tpurchase µs\tfigures ms\tsweep ms\treconcile ms\t")
	for _, s := range res.Steps {
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f\t\n", s.Buyers, s.TableRows, s.RebuildSeconds, s.BytesPerBuyer,
			s.PurchaseRedisMicros, s.PurchaseMicros, s.FiguresMillis, s.SweepMillis, s.ReconcileMillis)
	}
	_ = tw.Flush()
	if len(res.Steps) > 0 && res.Steps[0].Drain.Orders > 0 {
		fmt.Fprintln(w, "drains (CPU µs per order written, utime+stime from /proc over the drain, the worker counted from its start):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "table rows\torders\tseconds\tworker\tRedis\tlock Redis\tMariaDB\ttotal\t")
		for _, s := range res.Steps {
			d := s.Drain
			fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\n", d.TableRows, d.Orders, d.Seconds, d.Worker, d.Redis, d.Locks, d.MariaDB, d.Total)
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(w, "slopes (cost ~ size^k; 0 flat, 1 linear):")
	for _, sl := range res.Slopes {
		fmt.Fprintf(w, "  %-22s over %-10s %-18s k=%.2f\n", sl.Figure, sl.Over, sl.Range, sl.K)
	}
}

// growWorker runs each drain of a growth run: the service's binary started
// as a worker on the run's database and keys once the drain's watch began,
// timed and measured as drain measures one (the worker counted from its
// start, the sale's Redis, the lock Redis and MariaDB found on loopback),
// then stopped.
type growWorker struct {
	bin, locks, secret string
	log                io.Writer
}

func (w growWorker) drain(ctx context.Context, b grow.Backlog) (grow.DrainCost, error) {
	meter, err := newDrainMeter("", deployment{redis: b.RedisURL, locks: w.locks, mysql: b.MySQLDSN}, w.log)
	if err != nil {
		return grow.DrainCost{}, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var worker *exec.Cmd
	defer func() { stopWorker(worker, w.log) }()
	watching := func() {
		var err error
		if worker, err = w.start(b); err != nil {
			cancel(err)
			return
		}
		meter.startedLate(procSpec{"service", strconv.Itoa(worker.Process.Pid)})
	}
	out, err := measureDrain(ctx, load.DrainConfig{
		VoucherID: b.VoucherID, Expect: b.Expect, RedisURL: b.RedisURL, MySQLDSN: b.MySQLDSN,
		KeyPrefix: b.KeyPrefix, Shards: b.Shards, Log: io.Discard, Watching: watching,
	}, meter)
	if err != nil {
		return grow.DrainCost{}, cmp.Or(context.Cause(ctx), err)
	}
	return drainCost(out), nil
}

// start starts the worker with settings of its own only: the run's Redis,
// database and keys; no admin listener; the sweeper's pass (measured apart)
// an hour away, so that none falls in the drain.
func (w growWorker) start(b grow.Backlog) (*exec.Cmd, error) {
	secret := w.secret
	if len(secret) < 32 {
		buf := make([]byte, 32)
		_, _ = rand.Read(buf)
		secret = hex.EncodeToString(buf)
	}
	cmd := exec.Command(w.bin, "serve")
	cmd.Env = []string{
		"SECKILL_ROLE=worker", "SECKILL_REDIS_URL=" + b.RedisURL, "SECKILL_MYSQL_DSN=" + b.MySQLDSN,
		"SECKILL_KEY_PREFIX=" + b.KeyPrefix, "SECKILL_SHARDS=" + strconv.Itoa(b.Shards),
		"SECKILL_TOKEN_SECRET=" + secret, "SECKILL_ADDR=127.0.0.1:0", "SECKILL_ADMIN_ADDR=off",
		"SECKILL_LOG_LEVEL=warn", "SECKILL_EXPIRY_SWEEP=1h",
	}
	if w.locks != "" {
		cmd.Env = append(cmd.Env, "SECKILL_LOCK_NODES="+w.locks)
	}
	cmd.Stdout, cmd.Stderr = w.log, w.log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the worker: %w", err)
	}
	return cmd, nil
}

// stopWorker stops a worker start started: SIGTERM, then SIGKILL if it is
// still running after the service's shutdown bound.
func stopWorker(cmd *exec.Cmd, log io.Writer) {
	if cmd == nil {
		return
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		fmt.Fprintf(log, "grow: the worker (pid %d) ignored SIGTERM for 20s; killed\n", cmd.Process.Pid)
		_ = cmd.Process.Kill()
		<-done
	}
}

// drainCost sums drain's CPU rows by server, as capacity.sh total does:
// the worker (service), the sale's Redis (redis, redis@PORT), the lock
// Redis (locks, locks@PORT) and MariaDB (database).
func drainCost(out drainOutput) grow.DrainCost {
	c := grow.DrainCost{Orders: out.Orders, Seconds: out.Seconds}
	part := map[string]*float64{"service": &c.Worker, "redis": &c.Redis, "locks": &c.Locks, "database": &c.MariaDB}
	for _, p := range out.CPU {
		label, _, _ := strings.Cut(p.Label, "@")
		if f, ok := part[label]; ok {
			*f += p.PerOrder
			c.Total += p.PerOrder
		}
	}
	return c
}
