package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"seckill/loadtest/load"
)

// runOptions are the run command's settings outside load.Config.
type runOptions struct {
	jsonPath string
}

func envInt(getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil {
		return n
	}
	return def
}

// parseRun reads the run command's flags into a load configuration.
func parseRun(args []string, getenv func(string) string, stderr io.Writer) (load.Config, runOptions, error) {
	var cfg load.Config
	var opts runOptions
	var check load.CheckConfig
	var tokensFile string
	var repeat float64
	var verify, quiet bool
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", cmp.Or(getenv("SECKILL_URL"), "http://127.0.0.1:18080"), "target: nginx or one instance (SECKILL_URL)")
	fs.Int64Var(&cfg.VoucherID, "voucher", 0, "voucher to buy; 0 creates one with --stock")
	fs.IntVar(&cfg.Stock, "stock", 500, "stock of the voucher created")
	fs.IntVar(&cfg.Vouchers, "vouchers", 1, "create this many vouchers with --stock each, buyer u buying voucher u mod n (their shards spread over a Redis Cluster's masters); more than 1 needs --verify=false")
	fs.IntVar(&cfg.Users, "users", 2000, "distinct buyers, one token each")
	fs.IntVar(&cfg.Requests, "requests", 0, "purchases in all; more than --users means repeats (default: from --repeat, else --users)")
	fs.Float64Var(&repeat, "repeat", 0, "share of purchases that repeat a buyer's press, 0 to 0.99 (sets --requests when it is not given)")
	fs.IntVar(&cfg.Warmup, "warmup", 0, "purchases sent first and left out of the figures")
	fs.IntVar(&cfg.Concurrency, "c", 64, "connections, and purchases in flight")
	fs.Float64Var(&cfg.Rate, "rate", 0, "purchases per second (open loop); 0: as fast as -c allows")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "bound on the firing")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "per purchase")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "order of the purchases")
	fs.Int64Var(&cfg.UserBase, "user-base", 100_000, "user id of the first buyer")
	fs.StringVar(&cfg.Secret, "secret", getenv("SECKILL_TOKEN_SECRET"), "token secret to mint tokens (SECKILL_TOKEN_SECRET)")
	fs.StringVar(&cfg.AdminToken, "admin-token", getenv("SECKILL_ADMIN_TOKEN"), "admin token to create the voucher (SECKILL_ADMIN_TOKEN; default minted)")
	fs.StringVar(&tokensFile, "tokens", "", "read buyer tokens from this file (one per line, user --user-base first) instead of minting")
	fs.BoolVar(&verify, "verify", true, "after the run, wait for the drain and check the invariants (needs --redis and --mysql)")
	fs.StringVar(&check.RedisURL, "redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment: redis://host:port/db, or redis-cluster://host:port?addr=host:port... for a Redis Cluster (SECKILL_REDIS_URL)")
	fs.StringVar(&check.MySQLDSN, "mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment (SECKILL_MYSQL_DSN)")
	fs.StringVar(&check.KeyPrefix, "key-prefix", cmp.Or(getenv("SECKILL_KEY_PREFIX"), "seckill"), "SECKILL_KEY_PREFIX of the deployment")
	fs.IntVar(&check.Shards, "shards", envInt(getenv, "SECKILL_SHARDS", 1), "SECKILL_SHARDS of the deployment")
	fs.DurationVar(&check.DrainTimeout, "drain-timeout", 2*time.Minute, "bound on the wait for the pipeline to drain")
	fs.StringVar(&opts.jsonPath, "json", "", "also write the summary as JSON to this file (- for stdout)")
	fs.BoolVar(&quiet, "quiet", false, "no progress lines")
	if err := fs.Parse(args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if repeat < 0 || repeat > 0.99 {
		return cfg, opts, fmt.Errorf("--repeat must be from 0 to 0.99")
	}
	if cfg.Requests == 0 {
		cfg.Requests = int(float64(cfg.Users)/(1-repeat) + 0.5)
	}
	if tokensFile != "" {
		toks, err := readTokens(tokensFile)
		if err != nil {
			return cfg, opts, err
		}
		if len(toks) < cfg.Users {
			return cfg, opts, fmt.Errorf("%s holds %d tokens for %d users", tokensFile, len(toks), cfg.Users)
		}
		cfg.Tokens = toks
	}
	cfg.Log = stderr
	if quiet {
		cfg.Progress = -1
	}
	if verify {
		if check.RedisURL == "" || check.MySQLDSN == "" {
			fmt.Fprintln(stderr, "no --redis and --mysql (SECKILL_REDIS_URL, SECKILL_MYSQL_DSN): the pipeline will not be checked")
		} else {
			cfg.Check = &check
		}
	}
	return cfg, opts, nil
}

// execute runs the load, prints the summary and reports a failed check as
// errCheckFailed.
func execute(ctx context.Context, cfg load.Config, opts runOptions, stdout io.Writer) error {
	res, err := load.Run(ctx, cfg)
	if err != nil {
		return err
	}
	res.Summary.Print(stdout)
	if err := writeJSON(opts.jsonPath, stdout, res.Summary); err != nil {
		return err
	}
	if res.Summary.Check != nil && !res.Summary.Check.OK {
		return errCheckFailed
	}
	return nil
}

func writeJSON(path string, stdout io.Writer, v any) error {
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func readTokens(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			out = append(out, t)
		}
	}
	return out, sc.Err()
}

// tokens writes buyer tokens, one per line: line i is user --user-base + i.
func tokens(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	users := fs.Int("users", 2000, "how many buyers")
	base := fs.Int64("user-base", 100_000, "user id of the first buyer")
	secret := fs.String("secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	out := fs.String("out", "-", "file to write, - for stdout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	toks, err := load.MintTokens(*secret, *base, *users)
	if err != nil {
		return err
	}
	text := strings.Join(toks, "\n") + "\n"
	if *out == "-" {
		_, err = io.WriteString(stdout, text)
		return err
	}
	if err := os.WriteFile(*out, []byte(text), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %d tokens for users %d..%d to %s\n", *users, *base, *base+int64(*users)-1, *out)
	return nil
}

// targetFlag collects repeated --target name=url.
type targetFlag []target

type target struct{ name, url string }

func (t *targetFlag) String() string { return fmt.Sprint(*t) }
func (t *targetFlag) Set(s string) error {
	name, url, ok := strings.Cut(s, "=")
	if !ok || name == "" || url == "" {
		return fmt.Errorf("want name=url, got %q", s)
	}
	*t = append(*t, target{name, url})
	return nil
}

// benchResult is one target's runs in a bench.
type benchResult struct {
	Name   string         `json:"name"`
	URL    string         `json:"url"`
	Runs   []load.Summary `json:"runs"`
	RPS    float64        `json:"median_requests_per_second"`
	P50    float64        `json:"median_p50_ms"`
	P99    float64        `json:"median_p99_ms"`
	Ratio  float64        `json:"ratio_to_previous,omitempty"`
	Errors int            `json:"non_202_answers"`
}

// bench runs the same load on each target in turn, round after round, so
// that the machine's noise spreads over all of them, and compares medians.
// Every purchase is a new buyer on a fresh voucher: each one reserves and
// appends to the stream, the costly path.
func bench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var targets targetFlag
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&targets, "target", "name=url, repeated; ratios are to the target before (e.g. ceiling, straight, nginx)")
	requests := fs.Int("requests", 30000, "measured purchases per run")
	warmup := fs.Int("warmup", 3000, "purchases before each run, not measured")
	conc := fs.Int("c", 256, "connections")
	rate := fs.Float64("rate", 0, "purchases per second (open loop); 0: closed loop")
	rounds := fs.Int("rounds", 3, "runs per target")
	vouchers := fs.Int("vouchers", 1, "fresh vouchers per run, buyer u buying voucher u mod n: one voucher lives on one shard, so several spread the load over a Redis Cluster's masters")
	secret := fs.String("secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	jsonPath := fs.String("json", "", "also write the results as JSON to this file (- for stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if len(targets) == 0 {
		return fmt.Errorf("no --target")
	}
	users := *requests + *warmup
	fmt.Fprintf(stderr, "minting %d tokens\n", users)
	toks, err := load.MintTokens(*secret, 100_000, users)
	if err != nil {
		return err
	}
	results := make([]benchResult, len(targets))
	for r := range *rounds {
		for i, t := range targets {
			fmt.Fprintf(stderr, "round %d/%d: %s (%s)\n", r+1, *rounds, t.name, t.url)
			res, err := load.Run(ctx, load.Config{
				URL: t.url, Stock: users, Vouchers: *vouchers, Users: users, Requests: *requests, Warmup: *warmup,
				Concurrency: *conc, Rate: *rate, Secret: *secret, Tokens: toks,
				Seed: uint64(r + 1), Progress: -1, Log: stderr,
			})
			if err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			s := res.Summary
			fmt.Fprintf(stderr, "  %.0f/s  p50 %.2fms  p99 %.2fms  %v\n", s.RPS, s.Latency.P50, s.Latency.P99, s.Outcomes)
			results[i].Name, results[i].URL = t.name, t.url
			results[i].Runs = append(results[i].Runs, s)
			results[i].Errors += s.Requests - s.Outcomes["202 accepted"]
		}
	}
	median := func(xs []float64) float64 {
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	fmt.Fprintf(stdout, "\n%d measured purchases per run after %d warm-up, %d connections, %d rounds\n", *requests, *warmup, *conc, *rounds)
	fmt.Fprintf(stdout, "%-10s %-44s %10s %9s %9s %8s %8s\n", "target", "runs/s", "median/s", "p50 ms", "p99 ms", "ratio", "non-202")
	for i := range results {
		var rps, p50, p99 []float64
		var runs []string
		for _, s := range results[i].Runs {
			rps = append(rps, s.RPS)
			p50 = append(p50, s.Latency.P50)
			p99 = append(p99, s.Latency.P99)
			runs = append(runs, fmt.Sprintf("%.0f", s.RPS))
		}
		b := &results[i]
		b.RPS, b.P50, b.P99 = median(rps), median(p50), median(p99)
		ratio := ""
		if i > 0 {
			b.Ratio = b.RPS / results[i-1].RPS
			ratio = fmt.Sprintf("%.0f%%", 100*b.Ratio)
		}
		fmt.Fprintf(stdout, "%-10s %-44s %10.0f %9.2f %9.2f %8s %8d\n", b.Name, strings.Join(runs, " "), b.RPS, b.P50, b.P99, ratio, b.Errors)
	}
	return writeJSON(*jsonPath, stdout, results)
}

// drain times the worker writing one voucher's accepted orders to MySQL:
// start it, then start the worker. The clock starts when the first new
// order appears, so the worker's start-up is not counted.
func drain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	vid := fs.Int64("voucher", 0, "voucher whose orders are drained")
	expect := fs.Int("expect", 0, "orders MySQL must hold when the drain is done")
	redisURL := fs.String("redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment: redis://host:port/db, or redis-cluster://host:port?addr=host:port... for a Redis Cluster (SECKILL_REDIS_URL)")
	dsn := fs.String("mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment (SECKILL_MYSQL_DSN)")
	prefix := fs.String("key-prefix", cmp.Or(getenv("SECKILL_KEY_PREFIX"), "seckill"), "SECKILL_KEY_PREFIX")
	shards := fs.Int("shards", envInt(getenv, "SECKILL_SHARDS", 1), "SECKILL_SHARDS")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the wait")
	jsonPath := fs.String("json", "", "also write the result as JSON to this file (- for stdout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *vid == 0 || *expect == 0 {
		return fmt.Errorf("--voucher and --expect are required")
	}
	res, err := load.Drain(ctx, load.DrainConfig{
		VoucherID: *vid, Expect: *expect, RedisURL: *redisURL, MySQLDSN: *dsn,
		KeyPrefix: *prefix, Shards: *shards, Timeout: *timeout, Log: stderr,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "drained %d orders in %.2fs: %.0f orders/s (first new order seen %.2fs after the watch began)\n",
		res.Orders, res.Seconds, res.Rate, res.WaitSeconds)
	return writeJSON(*jsonPath, stdout, res)
}
