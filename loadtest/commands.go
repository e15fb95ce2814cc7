package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
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
	fs.StringVar(&cfg.Buckets, "buckets", "1", bucketsDoc)
	fs.Float64Var(&cfg.Skew, "skew", 0, skewDoc)
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
	if err := parseFlags(fs, args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if repeat < 0 || repeat > 0.99 {
		return cfg, opts, fmt.Errorf("--repeat must be from 0 to 0.99")
	}
	if err := checkBuckets(cfg.Buckets, cfg.Skew); err != nil {
		return cfg, opts, err
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

const (
	bucketsDoc = `bucket count of the voucher created: a number, or auto (one per master); sent as "buckets" in the creation request when not 1 (with --voucher: that voucher's count, for --skew)`
	skewDoc    = "0 to 1: this share of the buyers picked with their home in bucket 0 of --buckets (a number), the rest at home elsewhere; 0: buyers --user-base, +1, ..."
)

// checkBuckets refuses a --buckets or --skew the load would refuse, before
// any work.
func checkBuckets(buckets string, skew float64) error {
	nb, err := load.ParseBuckets(buckets)
	switch {
	case err != nil:
		return fmt.Errorf("--buckets: %w", err)
	case skew < 0 || skew > 1:
		return errors.New("--skew must be from 0 to 1")
	case skew > 0 && nb == 0:
		return errors.New("--skew needs --buckets as a number: it picks buyers by their home bucket")
	}
	return nil
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
	if err := parseFlags(fs, args); err != nil {
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

// benchResult is one target's runs in one mode of a bench.
type benchResult struct {
	Mode    string         `json:"mode"`
	Name    string         `json:"name"`
	Buckets string         `json:"buckets"` // of the vouchers it created
	URL     string         `json:"url"`
	Runs    []load.Summary `json:"runs"`
	RPS     float64        `json:"median_requests_per_second"`
	P50     float64        `json:"median_p50_ms"`
	P99     float64        `json:"median_p99_ms"`
	Ratio   float64        `json:"ratio_to_previous,omitempty"`
	Errors  int            `json:"non_202_answers"`
	// Unexpected counts the measured answers other than the mode's own
	// (202 accepted, 409 sold_out, 409 already_purchased).
	Unexpected int `json:"unexpected_answers"`
	// RatioToFirst is this target's median over the first target's.
	RatioToFirst float64 `json:"ratio_to_first,omitempty"`
	// CPU is each measured process's CPU per answer, then their total.
	CPU []cpuFigure `json:"cpu_us_per_answer,omitempty"`
	// LoadgenRuns is the load generator's own CPU per answer in each run
	// (it shares the cores with the target), Loadgen their median.
	LoadgenRuns []float64 `json:"loadgen_us_per_answer_runs,omitempty"`
	Loadgen     float64   `json:"median_loadgen_us_per_answer,omitempty"`
}

// benchMode is what every measured purchase of a bench run meets.
type benchMode struct {
	name   string
	expect string // the answer every measured purchase must get
}

var benchModes = []benchMode{
	{"success", "202 accepted"},
	{"sold-out", "409 sold_out"},
	{"already-purchased", "409 already_purchased"},
}

// modeConfig is one run of a mode: success buys with a new buyer per
// purchase on a voucher with enough stock; sold-out sells a voucher of
// stock units in the warm-up and then sends new buyers, each refused;
// already-purchased has stock buyers each buy once in the warm-up, then
// sends only their repeat presses.
func modeConfig(mode string, stock, requests, warmup int) load.Config {
	switch mode {
	case "sold-out":
		users := stock + warmup + requests
		return load.Config{Stock: stock, Users: users, Warmup: stock + warmup, Requests: requests}
	case "already-purchased":
		return load.Config{Stock: stock, Users: stock, Warmup: stock + warmup, Requests: requests, FirstPressesFirst: true}
	}
	users := requests + warmup
	return load.Config{Stock: users, Users: users, Warmup: warmup, Requests: requests}
}

// parseModes reads --mode: names separated by commas, or all.
func parseModes(s string) ([]benchMode, error) {
	if s == "all" {
		return benchModes, nil
	}
	var out []benchMode
	for name := range strings.SplitSeq(s, ",") {
		i := slices.IndexFunc(benchModes, func(m benchMode) bool { return m.name == name })
		if i < 0 {
			return nil, fmt.Errorf("--mode %q: want success, sold-out, already-purchased (comma-separated) or all", name)
		}
		out = append(out, benchModes[i])
	}
	return out, nil
}

// loadAverage reads /proc/loadavg's first three fields ("" where there is none).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// bench runs the same load on each target in turn, round after round, so
// that the machine's noise spreads over all of them, and compares medians.
// Each run buys a fresh voucher; the mode says what its measured purchases
// meet (modeConfig). Several modes run in one bench: each round runs every
// mode on every target.
func bench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var targets targetFlag
	pids := pidsFlag{}
	var dep deployment
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&targets, "target", "name=url, repeated; ratios are to the target before and of the first to each (e.g. seckill, ceiling, bare=http://127.0.0.1:18090/bare)")
	modeList := fs.String("mode", "success", "success (new buyers, stock for all), sold-out (voucher sold before the measured run), already-purchased (repeat presses of buyers holding an order): comma-separated, or all")
	stock := fs.Int("stock", 1000, "sold-out: units sold before the measured run; already-purchased: buyers holding an order")
	requests := fs.Int("requests", 30000, "measured purchases per run")
	warmup := fs.Int("warmup", 3000, "purchases before each run, not measured (sold-out, already-purchased: besides the --stock first presses)")
	conc := fs.Int("c", 256, "connections")
	rate := fs.Float64("rate", 0, "purchases per second (open loop); 0: closed loop")
	rounds := fs.Int("rounds", 3, "runs per target and mode")
	buckets := fs.String("buckets", "1", bucketsDoc+" (every voucher the bench creates)")
	vouchers := fs.Int("vouchers", 1, "success mode: fresh vouchers per run, buyer u buying voucher u mod n: one voucher lives on one shard, so several spread the load over a Redis Cluster's masters")
	secret := fs.String("secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	jsonPath := fs.String("json", "", "also write the results as JSON to this file (- for stdout)")
	fs.Var(pids, "pids", "target=label:spec,...: processes whose CPU per answer is measured on that target's runs, besides (or, for the same label, instead of) those found by default, repeated per target; "+
		"spec is a pid, a pid file (first field the pid), port:N (whoever listens on loopback port N) or none (leave the label out); target=none measures nothing. "+
		"Found by default: service = the server of a loopback target URL; redis, locks, database = the servers of --redis, --lock-redis, --mysql on loopback")
	baseFlag := fs.String("cpu-base", "", "target each process's CPU is compared with: a target (every process), label=target pairs, or both: bare,redis=ceiling (default: bare when a target is so named, else the first)")
	fs.StringVar(&dep.redis, "redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment, whose servers' CPU is measured when on loopback (SECKILL_REDIS_URL)")
	fs.StringVar(&dep.locks, "lock-redis", getenv("SECKILL_LOCK_NODES"), "lock Redis URLs, comma-separated, measured as locks when on loopback (SECKILL_LOCK_NODES)")
	fs.StringVar(&dep.mysql, "mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment, measured as database when on loopback (SECKILL_MYSQL_DSN)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(targets) == 0 {
		return fmt.Errorf("no --target")
	}
	modes, err := parseModes(*modeList)
	if err != nil {
		return err
	}
	if err := checkBuckets(*buckets, 0); err != nil {
		return err
	}
	base, err := parseCPUBase(*baseFlag)
	if err != nil {
		return err
	}
	meters, err := benchMeters(targets, pids, dep, stderr)
	if err != nil {
		return err
	}
	users := 0
	for _, m := range modes {
		users = max(users, modeConfig(m.name, *stock, *requests, *warmup).Users)
	}
	results := make([]benchResult, len(modes)*len(targets))
	var loads []string
	for r := range *rounds {
		loads = append(loads, loadAverage())
		for mi, m := range modes {
			// Each round and mode buys with buyers of its own: a server
			// that cached an earlier run's tokens would answer them from
			// its cache, and only a round's first run would pay for a new
			// buyer's token (loadtest/README.md, "wrk and bench").
			base := int64(100_000 + (r*len(modes)+mi)*users)
			fmt.Fprintf(stderr, "minting %d tokens for users %d..\n", users, base)
			toks, err := load.MintTokens(*secret, base, users)
			if err != nil {
				return err
			}
			for ti, t := range targets {
				fmt.Fprintf(stderr, "round %d/%d, %s: %s (%s), load average %s\n", r+1, *rounds, m.name, t.name, t.url, loadAverage())
				cfg := modeConfig(m.name, *stock, *requests, *warmup)
				cfg.URL, cfg.Concurrency, cfg.Rate, cfg.Secret, cfg.Tokens, cfg.UserBase = t.url, *conc, *rate, *secret, toks, base
				cfg.Seed, cfg.Progress, cfg.Log, cfg.Buckets = uint64(r+1), -1, stderr, *buckets
				if m.name == "success" {
					cfg.Vouchers = *vouchers
				}
				if err := results[mi*len(targets)+ti].run(ctx, cfg, m, t, meters[ti], stderr); err != nil {
					return fmt.Errorf("%s, %s: %w", m.name, t.name, err)
				}
			}
		}
	}
	loads = append(loads, loadAverage())
	fmt.Fprintf(stdout, "\n%d measured purchases per run after %d warm-up, %d connections, %d rounds, vouchers of %s bucket(s); load average before each round and at the end: %s\n",
		*requests, *warmup, *conc, *rounds, *buckets, strings.Join(loads, " | "))
	for mi, m := range modes {
		mode := results[mi*len(targets) : (mi+1)*len(targets)]
		printMode(stdout, m, mode)
		compareCPU(mode, base, targets)
		printCPU(stdout, mode)
	}
	return writeJSON(*jsonPath, stdout, results)
}

// run runs one target in one mode once, measuring its processes with
// meter, and adds the run to b.
func (b *benchResult) run(ctx context.Context, cfg load.Config, m benchMode, t target, meter *cpuMeter, log io.Writer) error {
	sampled := meter.around(&cfg)
	res, err := load.Run(ctx, cfg)
	if err != nil {
		return err
	}
	s := res.Summary
	fmt.Fprintf(log, "  %.0f/s  p50 %.2fms  p99 %.2fms  %v\n", s.RPS, s.Latency.P50, s.Latency.P99, s.Outcomes)
	us, loadgen, err := sampled.perUnit(s.Requests)
	if err != nil {
		return err
	}
	b.CPU = addCPURun(b.CPU, meter.procs, us)
	b.LoadgenRuns = append(b.LoadgenRuns, loadgen)
	b.Mode, b.Name, b.URL, b.Buckets = m.name, t.name, t.url, s.Buckets
	b.Runs = append(b.Runs, s)
	b.Errors += s.Requests - s.Outcomes["202 accepted"]
	b.Unexpected += s.Requests - s.Outcomes[m.expect]
	return nil
}

// printMode fills one mode's medians and ratios and writes its table.
func printMode(stdout io.Writer, m benchMode, mode []benchResult) {
	fmt.Fprintf(stdout, "\n%s: every measured purchase should answer %s\n", m.name, m.expect)
	fmt.Fprintf(stdout, "%-10s %-44s %10s %9s %9s %8s %10s\n", "target", "runs/s", "median/s", "p50 ms", "p99 ms", "ratio", "unexpected")
	for i := range mode {
		var rps, p50, p99 []float64
		var runs []string
		for _, s := range mode[i].Runs {
			rps = append(rps, s.RPS)
			p50 = append(p50, s.Latency.P50)
			p99 = append(p99, s.Latency.P99)
			runs = append(runs, fmt.Sprintf("%.0f", s.RPS))
		}
		b := &mode[i]
		b.RPS, b.P50, b.P99 = median(rps), median(p50), median(p99)
		ratio := ""
		if i > 0 {
			b.Ratio = b.RPS / mode[i-1].RPS
			b.RatioToFirst = b.RPS / mode[0].RPS
			ratio = fmt.Sprintf("%.0f%%", 100*b.Ratio)
		}
		fmt.Fprintf(stdout, "%-10s %-44s %10.0f %9.2f %9.2f %8s %10d\n", b.Name, strings.Join(runs, " "), b.RPS, b.P50, b.P99, ratio, b.Unexpected)
	}
	if len(mode) > 1 {
		var parts []string
		for _, b := range mode[1:] {
			parts = append(parts, fmt.Sprintf("%s / %s %.2fx (p99 %.2f vs %.2f ms)", mode[0].Name, b.Name, 1/b.RatioToFirst, mode[0].P99, b.P99))
		}
		fmt.Fprintf(stdout, "  %s\n", strings.Join(parts, ";  "))
	}
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
	pidSpecs := fs.String("pids", "", "label:spec,...: processes whose CPU per order written is measured, besides redis, locks and database found on loopback from --redis, --lock-redis, --mysql "+
		"(spec: a pid, a pid file, port:N, or none to drop that label); a process not running when the watch begins (the worker) is looked for at the end and counted from its start; none: no CPU")
	locks := fs.String("lock-redis", getenv("SECKILL_LOCK_NODES"), "lock Redis URLs, comma-separated, measured as locks when on loopback (SECKILL_LOCK_NODES)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *vid == 0 || *expect == 0 {
		return fmt.Errorf("--voucher and --expect are required")
	}
	meter, err := newDrainMeter(*pidSpecs, deployment{redis: *redisURL, locks: *locks, mysql: *dsn}, stderr)
	if err != nil {
		return err
	}
	out, err := measureDrain(ctx, load.DrainConfig{
		VoucherID: *vid, Expect: *expect, RedisURL: *redisURL, MySQLDSN: *dsn,
		KeyPrefix: *prefix, Shards: *shards, Timeout: *timeout, Log: stderr,
	}, meter)
	if err != nil {
		return err
	}
	res := out.DrainResult
	fmt.Fprintf(stdout, "drained %d orders in %.2fs: %.0f orders/s (first new order seen %.2fs after the watch began)\n",
		res.Orders, res.Seconds, res.Rate, res.WaitSeconds)
	for _, c := range out.CPU {
		since := ""
		if c.SinceStart {
			since = ", counted from its start"
		}
		fmt.Fprintf(stdout, "  cpu %-14s %8.1f µs per order written (pid %s, %s%s)\n", c.Label, c.PerOrder, cmp.Or(c.pidList(), "-"), cmp.Or(c.Source, "the rows above"), since)
	}
	return writeJSON(*jsonPath, stdout, out)
}

// newDrainMeter measures, over a drain, the processes of pidSpecs (drain's
// --pids: "" for none besides the deployment's, "none" for no CPU at all)
// and those of the deployment's loopback Redis, lock Redis and MySQL.
func newDrainMeter(pidSpecs string, dep deployment, log io.Writer) (*drainMeter, error) {
	meter := &drainMeter{log: log}
	if pidSpecs == "none" {
		return meter, nil
	}
	if pidSpecs != "" {
		var err error
		if meter.explicit, err = parseProcSpecs(pidSpecs); err != nil {
			return nil, fmt.Errorf("--pids: %w", err)
		}
	}
	meter.specs = mergeSpecs(autoSpecs("", dep), meter.explicit)
	return meter, nil
}

// measureDrain times a drain (load.Drain) and meter's processes over it,
// from the start of the watch to its end; cfg.Watching, when set, runs
// once the meter has sampled (a worker started there is counted from its
// start).
func measureDrain(ctx context.Context, cfg load.DrainConfig, meter *drainMeter) (drainOutput, error) {
	watching := cfg.Watching
	cfg.Watching = func() {
		meter.start()
		if watching != nil {
			watching()
		}
	}
	res, err := load.Drain(ctx, cfg)
	if err != nil {
		return drainOutput{}, err
	}
	out := drainOutput{DrainResult: res}
	out.CPU, err = meter.finish(res.Orders)
	return out, err
}

// drainOutput is what drain writes with --json.
type drainOutput struct {
	load.DrainResult
	CPU []drainCPU `json:"cpu_us_per_order,omitempty"`
}

// procMem is one process's memory during a stampede, in KiB.
type procMem struct {
	PID       int    `json:"pid"`
	Source    string `json:"source"`
	MaxRSSKiB int64  `json:"max_sampled_rss_kib"` // VmRSS sampled every 100 ms
	HWMKiB    int64  `json:"vm_hwm_kib"`          // VmHWM at the end: the peak since the process started
}

// stampedeResult is what stampede writes with --json.
type stampedeResult struct {
	Summary          load.Summary     `json:"summary"`
	Commands         int64            `json:"redis_commands"`        // firing, drain and check
	CommandsFiring   int64            `json:"redis_commands_firing"` // while the purchases were sent
	PerRequest       float64          `json:"redis_commands_per_request"`
	PerRequestFiring float64          `json:"redis_commands_per_request_firing"`
	ByCommand        map[string]int64 `json:"redis_calls_by_command"`
	// ByRedis splits Commands by --count-redis URL: the sale's Redis and
	// the lock Redis are separate processes, each with its own core.
	ByRedis map[string]int64 `json:"redis_commands_by_redis"`
	// ScriptsByMaster is each master of the sale's Redis (--redis): its
	// script calls while the purchases were sent and their share of all
	// (with a voucher in buckets, how evenly its masters sell).
	ScriptsByMaster []masterScripts `json:"scripts_by_master,omitempty"`
	Processes       []procMem       `json:"processes"`
	LoadAverage     []string        `json:"load_average"` // before and after
}

// masterScripts is one master's script calls and their share of all
// the masters'.
type masterScripts struct {
	Addr  string  `json:"addr"`
	Calls int64   `json:"script_calls"`
	Share float64 `json:"script_share"`
}

// statusKiB reads a "Name:  N kB" field of /proc/<pid>/status.
func statusKiB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// resolvePIDs reads --pid values: a process id, or a pid file whose first
// field is one (scripts/cluster-up.sh writes "pid program").
func resolvePIDs(specs []string) ([]procMem, error) {
	var out []procMem
	for _, s := range specs {
		text := s
		if _, err := strconv.Atoi(s); err != nil {
			b, err := os.ReadFile(s)
			if err != nil {
				return nil, err
			}
			text = string(b)
		}
		f := strings.Fields(text)
		if len(f) == 0 {
			return nil, fmt.Errorf("%s: no pid", s)
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s, err)
		}
		if _, err := statusKiB(pid, "VmRSS"); err != nil {
			return nil, fmt.Errorf("%s: pid %d: %w", s, pid, err)
		}
		out = append(out, procMem{PID: pid, Source: s})
	}
	return out, nil
}

// stampede is the sale in full: a voucher of --stock units, --users buyers
// pressing --presses times each, shuffled, through the deployment (nginx),
// then the drain and the check. Around it, it counts the commands every
// Redis of --count-redis ran (INFO commandstats, summed over all commands
// and masters) and samples the memory of the --pid processes (the
// instances).
func stampede(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parseStampede(args, getenv, stderr)
	if err != nil {
		return err
	}
	procs, err := resolvePIDs(o.pidSpecs)
	if err != nil {
		return err
	}
	if len(procs) == 0 {
		fmt.Fprintln(stderr, "no --pid and no .cluster/run/api-N.pid: memory is not measured")
	}

	out := stampedeResult{LoadAverage: []string{loadAverage()}}
	before, owner, err := snapshotEach(ctx, o.counted)
	if err != nil {
		return err
	}
	var fired []nodeStat
	var firedErr error
	rss := sampleRSS(ctx, procs)
	o.run.Fired = func() { fired, firedErr = snapshot(ctx, o.counted) }
	res, err := load.Run(ctx, o.run)
	rss.stop()
	if err != nil {
		return err
	}
	if firedErr != nil {
		return firedErr
	}
	after, err := snapshot(ctx, o.counted)
	if err != nil {
		return err
	}
	for i := range procs {
		procs[i].HWMKiB, _ = statusKiB(procs[i].PID, "VmHWM")
	}
	out.LoadAverage = append(out.LoadAverage, loadAverage())
	out.Summary, out.Processes = res.Summary, procs
	sale := out.count(commandsSeen{before: before, fired: fired, after: after, owner: owner, sale: o.check.RedisURL})
	out.print(stdout, o.counted, sale)
	if err := writeJSON(o.jsonPath, stdout, out); err != nil {
		return err
	}
	if res.Summary.Check != nil && !res.Summary.Check.OK {
		return errCheckFailed
	}
	return nil
}

// stampedeOptions is what stampede's flags ask for.
type stampedeOptions struct {
	run      load.Config
	check    *load.CheckConfig // run.Check
	counted  redisFlag         // the Redis URLs whose commands are counted
	pidSpecs redisFlag         // the instances whose memory is sampled
	jsonPath string
}

// parseStampede reads stampede's flags, with the defaults of --count-redis
// and --pid taken from the environment.
func parseStampede(args []string, getenv func(string) string, stderr io.Writer) (stampedeOptions, error) {
	o := stampedeOptions{check: &load.CheckConfig{}}
	check := o.check
	fs := flag.NewFlagSet("stampede", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", cmp.Or(getenv("SECKILL_URL"), "http://127.0.0.1:18080"), "target: nginx (SECKILL_URL)")
	stock := fs.Int("stock", 1000, "units on sale")
	users := fs.Int("users", 100_000, "buyers")
	presses := fs.Int("presses", 3, "presses per buyer, shuffled among all")
	buckets := fs.String("buckets", "1", bucketsDoc)
	skew := fs.Float64("skew", 0, strings.ReplaceAll(skewDoc, "--user-base", "100000"))
	conc := fs.Int("c", 256, "connections")
	secret := fs.String("secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	fs.Var(&o.counted, "count-redis", "Redis URL whose commands are counted, repeated (default SECKILL_REDIS_URL and each of SECKILL_LOCK_NODES)")
	fs.Var(&o.pidSpecs, "pid", "an instance's pid or pid file, repeated (default: the instances behind nginx, SECKILL_CLUSTER_DIR/run/api-N.pid, or .cluster/run/api-N.pid)")
	fs.StringVar(&check.RedisURL, "redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment, for the check (SECKILL_REDIS_URL)")
	fs.StringVar(&check.MySQLDSN, "mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment (SECKILL_MYSQL_DSN)")
	fs.StringVar(&check.KeyPrefix, "key-prefix", cmp.Or(getenv("SECKILL_KEY_PREFIX"), "seckill"), "SECKILL_KEY_PREFIX of the deployment")
	fs.IntVar(&check.Shards, "shards", envInt(getenv, "SECKILL_SHARDS", 1), "SECKILL_SHARDS of the deployment")
	fs.DurationVar(&check.DrainTimeout, "drain-timeout", 2*time.Minute, "bound on the wait for the pipeline to drain")
	fs.StringVar(&o.jsonPath, "json", "", "also write the result as JSON to this file (- for stdout)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	if err := checkBuckets(*buckets, *skew); err != nil {
		return o, err
	}
	if check.RedisURL == "" || check.MySQLDSN == "" {
		return o, fmt.Errorf("--redis and --mysql are needed for the check (SECKILL_REDIS_URL, SECKILL_MYSQL_DSN)")
	}
	if len(o.counted) == 0 {
		o.counted = saleAndLocks(check.RedisURL, getenv("SECKILL_LOCK_NODES"))
	}
	if len(o.pidSpecs) == 0 {
		o.pidSpecs, _ = filepath.Glob(filepath.Join(cmp.Or(getenv("SECKILL_CLUSTER_DIR"), ".cluster"), "run", "api-[0-9]*.pid"))
	}
	o.run = load.Config{
		URL: *url, Stock: *stock, Users: *users, Presses: *presses, Concurrency: *conc, Buckets: *buckets, Skew: *skew,
		Secret: *secret, AdminToken: getenv("SECKILL_ADMIN_TOKEN"), Log: stderr, Check: check,
	}
	return o, nil
}

// saleAndLocks is the sale's Redis URL and each lock Redis URL of
// lockNodes (comma-separated) that is another.
func saleAndLocks(sale, lockNodes string) redisFlag {
	out := redisFlag{sale}
	for u := range strings.SplitSeq(lockNodes, ",") {
		if u = strings.TrimSpace(u); u != "" && u != sale {
			out = append(out, u)
		}
	}
	return out
}

// snapshotEach snapshots each URL alone, to know which masters are whose
// (master address -> URL).
func snapshotEach(ctx context.Context, urls []string) ([]nodeStat, map[string]string, error) {
	var all []nodeStat
	owner := map[string]string{}
	for _, u := range urls {
		nodes, err := snapshot(ctx, []string{u})
		if err != nil {
			return nil, nil, err
		}
		for _, n := range nodes {
			owner[n.Addr] = u
		}
		all = append(all, nodes...)
	}
	return all, owner, nil
}

// rssSampler keeps each process's largest VmRSS, read every 100 ms until
// stop.
type rssSampler struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// sampleRSS starts sampling procs' VmRSS into their MaxRSSKiB.
func sampleRSS(ctx context.Context, procs []procMem) rssSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := rssSampler{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			for i := range procs {
				if kib, err := statusKiB(procs[i].PID, "VmRSS"); err == nil {
					procs[i].MaxRSSKiB = max(procs[i].MaxRSSKiB, kib)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and waits for its last read.
func (s rssSampler) stop() {
	s.cancel()
	<-s.done
}

// commandsSeen is what the counted Redis servers reported before the
// firing, when it ended and after the drain and the check; owner maps a
// master's address to its URL, sale is the sale's Redis URL.
type commandsSeen struct {
	before, fired, after []nodeStat
	owner                map[string]string
	sale                 string
}

// commandCalls is the calls of nodes, in all and by command.
func commandCalls(nodes []nodeStat) (int64, map[string]int64) {
	var n int64
	by := map[string]int64{}
	for _, node := range nodes {
		for name, c := range node.Commands {
			n += c.Calls
			by[name] += c.Calls
		}
	}
	return n, by
}

// count fills the commands' figures of r and returns the sale's masters
// while firing, with their script shares.
func (r *stampedeResult) count(c commandsSeen) []nodeStat {
	firing := diffStats(c.before, c.fired)
	r.CommandsFiring, _ = commandCalls(firing)
	sale := slices.DeleteFunc(firing, func(n nodeStat) bool { return c.owner[n.Addr] != c.sale })
	withScriptShares(sale)
	for _, n := range sale {
		r.ScriptsByMaster = append(r.ScriptsByMaster, masterScripts{n.Addr, n.ScriptCalls, n.ScriptShare})
	}
	diff := diffStats(c.before, c.after)
	r.Commands, r.ByCommand = commandCalls(diff)
	r.ByRedis = map[string]int64{}
	for _, node := range diff {
		n, _ := commandCalls([]nodeStat{node})
		r.ByRedis[c.owner[node.Addr]] += n
	}
	requests := float64(r.Summary.Requests)
	r.PerRequestFiring = float64(r.CommandsFiring) / requests
	r.PerRequest = float64(r.Commands) / requests
	return sale
}

// print writes the summary, the commands of the counted Redis servers, the
// sale's masters' script shares, the memory and the load.
func (r stampedeResult) print(w io.Writer, counted []string, sale []nodeStat) {
	requests := float64(r.Summary.Requests)
	r.Summary.Print(w)
	fmt.Fprintf(w, "  redis        %d commands while firing (%.4f per request); %d with the drain and the check's reads (%.4f per request), on %s\n",
		r.CommandsFiring, r.PerRequestFiring, r.Commands, r.PerRequest, strings.Join(counted, " "))
	names := slices.Sorted(maps.Keys(r.ByCommand))
	slices.SortStableFunc(names, func(a, b string) int { return cmp.Compare(r.ByCommand[b], r.ByCommand[a]) })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, r.ByCommand[n]))
	}
	fmt.Fprintf(w, "               by command: %s\n", strings.Join(parts, ", "))
	parts = parts[:0]
	for _, u := range counted {
		parts = append(parts, fmt.Sprintf("%s %d (%.4f per request)", u, r.ByRedis[u], float64(r.ByRedis[u])/requests))
	}
	fmt.Fprintf(w, "               by Redis, with the drain: %s\n", strings.Join(parts, "; "))
	if len(sale) > 0 {
		fmt.Fprintf(w, "  while firing, ")
		printShares(w, sale)
	}
	for _, p := range r.Processes {
		fmt.Fprintf(w, "  memory       pid %d (%s): max sampled RSS %.1f MiB, VmHWM %.1f MiB (peak since it started)\n",
			p.PID, p.Source, float64(p.MaxRSSKiB)/1024, float64(p.HWMKiB)/1024)
	}
	fmt.Fprintf(w, "  load average %s before, %s after\n", r.LoadAverage[0], r.LoadAverage[1])
}
