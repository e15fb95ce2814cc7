package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/loadtest/load"
	"seckill/loadtest/proc"
)

// drawPagesOptions are drawpages's settings outside load.DrawPagesConfig.
type drawPagesOptions struct {
	pids     redisFlag // the API processes whose memory is sampled
	mysql    string    // the deployment's database, sampled for connections
	dbBound  int       // the service's pool bound, for the text
	jsonPath string
}

// parseDrawPages reads drawpages's flags.
func parseDrawPages(args []string, getenv func(string) string, stderr io.Writer) (load.DrawPagesConfig, drawPagesOptions, error) {
	var cfg load.DrawPagesConfig
	var o drawPagesOptions
	check := &load.CheckConfig{}
	var mode string
	var seconds float64
	var verify bool
	fs := flag.NewFlagSet("drawpages", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.URL, "url", cmp.Or(getenv("SECKILL_URL"), "http://127.0.0.1:18080"), "target: an instance or nginx (SECKILL_URL)")
	fs.IntVar(&cfg.Entrants, "entrants", 20_000, "buyers entering the draw; each one's page polls it")
	fs.Int64Var(&cfg.EntrantBase, "entrant-base", 10_000_000, "user id of the first entrant")
	fs.IntVar(&cfg.DrawStock, "draw-stock", 100, "units of the fair voucher: its winners")
	fs.DurationVar(&cfg.Window, "window", 30*time.Second, "from the fair voucher's creation to its close; every entrant must be in before")
	fs.IntVar(&cfg.Conns, "c", 256, "connections the entrants' pages share (entering, then polling): a scheduler hands each page to a free one when it is due")
	fs.IntVar(&cfg.Readers, "readers", 200, "list readers, one connection each")
	fs.IntVar(&cfg.Passes, "passes", 2, "passes of each reader through the whole list once the draw is done")
	fs.IntVar(&cfg.PageLimit, "page-limit", 200, "entries a list page asks for (limit=)")
	fs.DurationVar(&cfg.Every, "every", 500*time.Millisecond, "a page's poll interval (the shop page's)")
	fs.DurationVar(&cfg.Lead, "lead", time.Second, "the purchase stream starts this long before the close")
	fs.DurationVar(&cfg.PagesFor, "pages-timeout", 5*time.Minute, "bound on the pages from the close")
	fs.Float64Var(&cfg.Purchases.Rate, "rate", 300, "purchases per second on the other voucher (open loop)")
	fs.Float64Var(&seconds, "seconds", 30, "length of each round's purchase stream, in seconds")
	fs.IntVar(&cfg.Purchases.Concurrency, "purchase-c", 64, "connections of the purchase stream")
	fs.IntVar(&cfg.Purchases.Stock, "purchase-stock", 0, "stock of each stream's voucher (default: one unit per purchase, every buyer new and accepted)")
	fs.IntVar(&cfg.Rounds, "rounds", 2, "rounds; each runs the modes in turn, every other round in reverse")
	fs.StringVar(&mode, "mode", "both", "both (draw and no-draw alternating), draw, or no-draw (the purchase stream alone)")
	fs.StringVar(&cfg.Secret, "secret", getenv("SECKILL_TOKEN_SECRET"), "token secret (SECKILL_TOKEN_SECRET)")
	fs.StringVar(&cfg.AdminToken, "admin-token", getenv("SECKILL_ADMIN_TOKEN"), "admin token to create the vouchers (SECKILL_ADMIN_TOKEN; default minted)")
	fs.Var(&o.pids, "pid", "an API process whose VmRSS is sampled: a pid, a pid file or port:N, repeated (default: whoever listens on --url's loopback port)")
	fs.StringVar(&o.mysql, "mysql", getenv("SECKILL_MYSQL_DSN"), "MySQL of the deployment: its connections are sampled, and the check reads it (SECKILL_MYSQL_DSN)")
	fs.IntVar(&o.dbBound, "db-bound", 33, "the deployment's bound on its database connections (an instance: its pool of 32 and the probe's 1)")
	fs.BoolVar(&verify, "verify", true, "check each purchase stream's voucher after its round (needs --redis and --mysql)")
	fs.StringVar(&check.RedisURL, "redis", getenv("SECKILL_REDIS_URL"), "Redis of the deployment (SECKILL_REDIS_URL)")
	fs.StringVar(&check.KeyPrefix, "key-prefix", cmp.Or(getenv("SECKILL_KEY_PREFIX"), "seckill"), "SECKILL_KEY_PREFIX of the deployment")
	fs.IntVar(&check.Shards, "shards", envInt(getenv, "SECKILL_SHARDS", 1), "SECKILL_SHARDS of the deployment")
	fs.DurationVar(&check.DrainTimeout, "drain-timeout", 2*time.Minute, "bound on the wait for the pipeline to drain")
	fs.StringVar(&o.jsonPath, "json", "", "also write the result as JSON to this file (- for stdout)")
	if err := parseFlags(fs, args); err != nil {
		return cfg, o, err
	}
	switch mode {
	case "both":
	case "draw", "no-draw":
		cfg.Modes = []string{mode}
	default:
		return cfg, o, fmt.Errorf("--mode %q: want both, draw or no-draw", mode)
	}
	cfg.Purchases.Requests = int(cfg.Purchases.Rate*seconds + 0.5)
	cfg.Purchases.Progress = -1
	cfg.Log = stderr
	if verify && (check.RedisURL == "" || o.mysql == "") {
		return cfg, o, errors.New("--redis and --mysql are needed for the check (SECKILL_REDIS_URL, SECKILL_MYSQL_DSN), or --verify=false")
	}
	if verify {
		check.MySQLDSN = o.mysql
		cfg.Check = check
	}
	return cfg, o, nil
}

// drawPages is the drawpages command: a draw's pages under polling beside
// a purchase stream on another voucher, rounds with the draw and without,
// the deployment's database connections and API memory sampled.
func drawPages(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, o, err := parseDrawPages(args, getenv, stderr)
	if err != nil {
		return err
	}
	s, err := newUsageSampler(cfg.URL, o, stderr)
	if err != nil {
		return err
	}
	defer s.close()
	cfg.Watch = s.watch
	res, err := load.DrawPages(ctx, cfg)
	if err != nil {
		return err
	}
	printDrawPages(stdout, cfg, o, res)
	if err := writeJSON(o.jsonPath, stdout, res); err != nil {
		return err
	}
	if !res.OK {
		return errCheckFailed
	}
	return nil
}

// usageSampler reads, every 100 ms of a round, the database connections
// of the deployment's database (its processlist, the sampler's own left
// out, and Threads_connected) and the API processes' VmRSS (summed).
type usageSampler struct {
	g      *gorm.DB
	dbName string
	procs  []procMem
	hz     int64 // clock ticks a second
	log    io.Writer
}

// newUsageSampler finds the API processes (o.pids, else the listener of
// target's loopback port) and opens the database of o.mysql.
func newUsageSampler(target string, o drawPagesOptions, log io.Writer) (*usageSampler, error) {
	s := &usageSampler{log: log}
	var err error
	if s.hz, err = proc.ClockTick(); err != nil {
		fmt.Fprintf(log, "CPU is not measured: %v\n", err)
	}
	specs := []string(o.pids)
	if len(specs) == 0 {
		if u, err := url.Parse(target); err == nil {
			if p := loopbackPort(u.Host, u.Scheme); p > 0 {
				specs = []string{"port:" + strconv.Itoa(p)}
			}
		}
	}
	for _, spec := range specs {
		p, err := procSpec{"api", spec}.resolve()
		if err != nil {
			if len(o.pids) > 0 {
				return nil, err
			}
			fmt.Fprintf(log, "the API's memory is not sampled: %v\n", err)
			continue
		}
		for _, pid := range p.PIDs {
			s.procs = append(s.procs, procMem{PID: pid, Source: spec})
		}
	}
	if o.mysql == "" {
		fmt.Fprintln(log, "no --mysql: the database connections are not sampled")
		return s, nil
	}
	mc, err := db.ParseDSN(o.mysql)
	if err != nil {
		return nil, err
	}
	if s.g, err = db.OpenMySQL(o.mysql, 1); err != nil {
		return nil, err
	}
	s.dbName = mc.DBName
	return s, nil
}

func (s *usageSampler) close() {
	if s.g != nil {
		db.Close(s.g)
	}
}

// cpuTicks is the CPU time, in clock ticks, the API processes and the
// load generator have used so far (0 for a process not read).
func (s *usageSampler) cpuTicks() (api, self uint64) {
	for _, p := range s.procs {
		if n, err := proc.Ticks(p.PID); err == nil {
			api += n
		}
	}
	self, _ = proc.Ticks(os.Getpid())
	return api, self
}

// watch starts sampling; the func it returns stops and gives the maxima,
// and the CPU the API and the load generator used meanwhile.
func (s *usageSampler) watch() func() load.Usage {
	ctx, cancel := context.WithCancel(context.Background())
	var u load.Usage
	start := time.Now()
	api0, self0 := s.cpuTicks()
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			s.sample(ctx, &u)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() load.Usage {
		cancel()
		wg.Wait()
		api1, self1 := s.cpuTicks()
		u.Seconds = time.Since(start).Seconds()
		if s.hz > 0 {
			u.APICPU = float64(api1-api0) / float64(s.hz)
			u.LoadgenCPU = float64(self1-self0) / float64(s.hz)
		}
		return u
	}
}

// sample reads the figures once into u's maxima.
func (s *usageSampler) sample(ctx context.Context, u *load.Usage) {
	u.Samples++
	var rss int64
	for _, p := range s.procs {
		if kib, err := statusKiB(p.PID, "VmRSS"); err == nil {
			rss += kib
		}
	}
	u.RSSKiB = max(u.RSSKiB, rss)
	if s.g == nil {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var conns int
	err := s.g.WithContext(qctx).Raw("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()", s.dbName).Scan(&conns).Error
	if err == nil {
		u.DBConns = max(u.DBConns, conns)
	}
	var row struct {
		Name  string `gorm:"column:Variable_name"`
		Value string `gorm:"column:Value"`
	}
	if err := s.g.WithContext(qctx).Raw("SHOW GLOBAL STATUS LIKE 'Threads_connected'").Scan(&row).Error; err == nil {
		n, _ := strconv.Atoi(row.Value)
		u.DBThreads = max(u.DBThreads, n)
	}
}

// printDrawPages writes every round and the comparison.
func printDrawPages(w io.Writer, cfg load.DrawPagesConfig, o drawPagesOptions, res load.DrawPagesResult) {
	p := cfg.Purchases
	fmt.Fprintf(w, "\ndraw pages: %d entrants on %d connections (polling every %s), %d list readers x %d passes, pages of %d; purchases at %.0f/s for %d on %d connections\n",
		cfg.Entrants, cfg.Conns, cfg.Every, cfg.Readers, cfg.Passes, cfg.PageLimit, p.Rate, p.Requests, p.Concurrency)
	fmt.Fprintf(w, "%-5s %-8s %8s %9s %9s %9s %8s %10s %9s %9s %9s  %s\n", "round", "mode", "buys/s", "p50 ms", "p99 ms", "max ms", "db conns", "threads", "api MiB", "api cores", "gen cores", "load")
	maxConns, maxRSS := 0, int64(0)
	for _, r := range res.Rounds {
		s := r.Purchases
		u := r.Usage
		fmt.Fprintf(w, "%-5d %-8s %8.0f %9.2f %9.2f %9.2f %8d %10d %9.1f %9.2f %9.2f  %s\n", r.Round, r.Mode, s.RPS, s.Latency.P50, s.Latency.P99, s.Latency.Max,
			u.DBConns, u.DBThreads, float64(u.RSSKiB)/1024, u.APICPU/max(u.Seconds, 1e-9), u.LoadgenCPU/max(u.Seconds, 1e-9), r.LoadAverage)
		maxConns, maxRSS = max(maxConns, r.Usage.DBConns), max(maxRSS, r.Usage.RSSKiB)
		printStream(w, s)
		if r.Draw != nil {
			printDraw(w, *r.Draw, r.Overran)
			for _, ph := range r.Phases {
				fmt.Fprintf(w, "        purchases due %-22s (%6.1fs to %6.1fs from the close) %6d  p50 %7.2f ms  p99 %7.2f ms\n",
					ph.Name, ph.From, ph.To, ph.Purchases, ph.Latency.P50, ph.Latency.P99)
			}
		}
	}
	fmt.Fprintf(w, "\npurchase p99, median of rounds: %.2f ms with the draw, %.2f ms without: %.2fx\n", res.P99Draw, res.P99NoDraw, res.Ratio)
	fmt.Fprintf(w, "max database connections of the deployment %d (bound %d), max API RSS %.1f MiB\n", maxConns, o.dbBound, float64(maxRSS)/1024)
	if maxConns > o.dbBound {
		fmt.Fprintf(w, "  note: more connections than the bound: another client of the same database?\n")
	}
	verdict := "OK"
	if !res.OK {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "check %s\n", verdict)
}

// printStream writes a purchase stream's answers and check.
func printStream(w io.Writer, s load.Summary) {
	fmt.Fprintf(w, "      purchases %v", s.Outcomes)
	if c := s.Check; c != nil {
		status := "OK"
		if !c.OK {
			status = "FAILED: " + strings.Join(c.Violations, "; ")
		}
		fmt.Fprintf(w, "; check: %d orders, %s", c.Orders, status)
	}
	fmt.Fprintln(w)
}

// printDraw writes what a draw's pages saw.
func printDraw(w io.Writer, d load.DrawFigures, overran bool) {
	fmt.Fprintf(w, "      draw %d: %d entered in %.2fs; done %.2fs after the close; pages %.2fs from the close, %.0f requests/s\n",
		d.VoucherID, d.Entrants, d.EnterSeconds, d.DoneAfter, d.Seconds, d.PagesRPS)
	for _, k := range []struct {
		name string
		s    load.PageStats
	}{{"status", d.Status}, {"me", d.Mine}, {"entries", d.List}} {
		fmt.Fprintf(w, "        %-8s %7d requests %7.0f/s  p50 %.2f ms  p99 %.2f ms  %v\n", k.name, k.s.Requests, k.s.RPS, k.s.Latency.P50, k.s.Latency.P99, k.s.Answers)
	}
	if d.Status.Requests > 0 {
		fmt.Fprintf(w, "        from the close to done, about one status request per page every %.2fs\n", d.DoneAfter*float64(d.Entrants)/float64(d.Status.Requests))
	}
	fmt.Fprintf(w, "        %d entries and %d winners counted; %d entrants answered their entry, %d told they won; %d list passes read %d entries\n",
		d.EntryCount, d.WinnerCount, d.Answered, d.Won, d.Passes, d.PassEntries)
	if overran {
		fmt.Fprintf(w, "        note: the pages went on after the purchase stream ended: give a longer --seconds\n")
	}
	if d.ProblemsCount > 0 {
		fmt.Fprintf(w, "        %d problems:\n          %s\n", d.ProblemsCount, strings.Join(d.Problems, "\n          "))
	}
}
