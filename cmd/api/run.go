package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sync/errgroup"

	"seckill/internal/auth"
	"seckill/internal/idgen"
	"seckill/internal/metrics"
	"seckill/internal/mq"
	"seckill/internal/order"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// orderGroup is the consumer group of the order workers on every shard stream.
const orderGroup = "order-writers"

const usage = `usage: api [serve]                        run the service (default)
       api token --user ID [--admin] [--ttl D]  print a bearer token
       api migrate                              apply database migrations and exit
       api dlq list [--limit N]                 list dead letters
       api dlq replay ID                        send a dead-lettered order through again
       api reconcile                            report differences between Redis and the database`

// run is the whole program; main and the end-to-end tests call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cmd := "serve"
	if len(args) > 1 {
		cmd, args = args[1], args[2:]
	} else {
		args = nil
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stdout)
	switch cmd {
	case "serve":
		return serve(ctx, cfg, log, stdout)
	case "token":
		return printToken(cfg, args, stdout)
	case "migrate":
		return migrate(ctx, cfg, log, stdout)
	case "dlq":
		return dlqCommand(ctx, cfg, log, args, stdout)
	case "reconcile":
		return reconcileCommand(ctx, cfg, log, stdout)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// tokenSecret is SECKILL_TOKEN_SECRET, or in embedded-database mode the
// secret kept in the data dir (made on first start).
func tokenSecret(cfg config) (secret string, created bool, err error) {
	if cfg.Secret != "" {
		return cfg.Secret, false, nil
	}
	if !cfg.embeddedDB() {
		return "", false, errors.New("SECKILL_TOKEN_SECRET is required with SECKILL_MYSQL_DSN (at least 32 bytes, the same on every instance)")
	}
	return embeddedSecret(cfg.DataDir)
}

func printToken(cfg config, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stdout)
	user := fs.Int64("user", 0, "user id the token is for")
	admin := fs.Bool("admin", false, "give the token the admin role")
	ttl := fs.Duration("ttl", cfg.TokenTTL, "how long the token is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secret, _, err := tokenSecret(cfg)
	if err != nil {
		return err
	}
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		return err
	}
	role := auth.RoleUser
	if *admin {
		role = auth.RoleAdmin
	}
	tok, err := signer.Mint(auth.Identity{UserID: *user, Role: role}, *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

func migrate(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	db, closeDB, err := openDB(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer closeDB()
	applied, err := schema.Apply(ctx, db)
	if err != nil {
		return err
	}
	v, err := schema.Current(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %v; schema at version %d\n", applied, v)
	if !cfg.embeddedDB() && len(applied) > 0 && applied[0] == 1 {
		announceNewDatabase(stdout)
	}
	return nil
}

// serve runs the API and the worker until ctx is done, then shuts down in
// order: stop taking requests, let the worker finish and ack its batch,
// then release the id lease and close the clients. Every component is
// built and every listener bound before any goroutine starts, so a failure
// at start-up unwinds through the deferred closes alone.
func serve(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	log.Info("starting", "config", cfg)
	if cfg.embeddedRedis() || cfg.embeddedDB() {
		log.Warn("embedded mode: in-process Redis and/or SQLite file; data of the in-process Redis is lost on exit. "+
			"For real servers set SECKILL_REDIS_URL (redis://host:6379/0) and SECKILL_MYSQL_DSN (user:pass@tcp(host:3306)/seckill) and SECKILL_TOKEN_SECRET",
			"embedded_redis", cfg.embeddedRedis(), "embedded_database", cfg.embeddedDB(), "data_dir", cfg.DataDir)
	}
	secret, firstStart, err := tokenSecret(cfg)
	if err != nil {
		return err
	}
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		return err
	}
	// Listeners first: a taken port stops start-up before the database is
	// touched.
	lns, err := listen(cfg, log)
	if err != nil {
		return err
	}
	defer lns.close()

	rdb, closeRedis, err := openRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	db, closeDB, err := openDB(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer closeDB()
	if applied, err := schema.Apply(ctx, db); err != nil {
		return err
	} else if len(applied) > 0 {
		log.Info("migrations applied", "versions", applied)
		if !cfg.embeddedDB() && applied[0] == 1 {
			announceNewDatabase(stdout)
		}
	}

	m := metrics.New()
	m.WatchRedisPool(rdb.PoolStats)
	if sqlDB, err := db.DB(); err == nil {
		m.WatchDB(sqlDB)
	}

	keys := voucher.NewKeys(cfg.KeyPrefix, cfg.Shards)
	vstore := voucher.NewStore(db)
	vstate := voucher.NewState(rdb, keys)
	ostore := order.NewStore(db)
	warmer := voucher.NewWarmer(vstore, vstate, ostore, keys, cfg.Warm, log)
	if n, err := warmer.Warm(ctx); err != nil {
		log.Warn("warming voucher state failed; purchases answer not_ready until it works", "err", err)
	} else {
		log.Info("voucher state warmed", "loaded", n)
	}

	if firstStart {
		if err := announceAdmin(cfg, signer, stdout); err != nil {
			return err
		}
	}

	var writer *order.Writer
	if cfg.runWorker() {
		locks, closeLocks, err := openLocks(cfg, rdb, log)
		if err != nil {
			return err
		}
		defer closeLocks()
		// Crash point of the fault tests: exit between commit and ack.
		var hook func()
		if cfg.CrashPoint == "after_commit_before_ack" {
			hook = func() { os.Exit(3) }
		}
		writer = order.NewWriter(db, rdb, keys, order.WriterConfig{
			Locks: locks, KeyPrefix: cfg.KeyPrefix, MaxDeliveries: int64(cfg.MaxDeliveries), MaxAttempts: cfg.MaxAttempts,
			AfterCommit: hook, Observer: m,
		}, log)
	}
	health := &health{rdb: rdb, db: db}
	var mainRouter http.Handler
	var ids *idgen.Generator
	if cfg.serveAPI() {
		// The last step that can fail: the lease is released by ids.Run.
		ids, err = idgen.Lease(ctx, rdb, idgen.Config{KeyPrefix: cfg.KeyPrefix}, log)
		if err != nil {
			return err
		}
		vouchers := voucher.NewHTTP(vstore, vstate, voucher.NewReserver(rdb, keys), ids, log)
		vouchers.Observe(m)
		mainRouter = apiEngine(log, m, deps{
			cfg: cfg, log: log, rdb: rdb, db: db, signer: signer, keys: keys, stdout: stdout,
			vouchers: vouchers,
			orders:   order.NewHTTP(ostore, rdb, keys, log),
			health:   health,
		})
	} else {
		mainRouter = workerEngine(log, m, health)
	}

	// The foreground (HTTP servers, workers) stops on ctx or on the first
	// failure among them. Background services stop only after the
	// foreground did, so requests in flight still get ids and state.
	fgCtx, stopFG := context.WithCancel(ctx)
	defer stopFG()
	fg, fctx := errgroup.WithContext(fgCtx)
	var g errgroup.Group
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()

	if ids != nil {
		g.Go(func() error { return ids.Run(bg) })
	}
	g.Go(func() error { return warmer.Run(bg) })
	// Every instance reads the stream and delay-queue gauges; dashboards
	// take the max per shard.
	sampled := make([]metrics.Shard, keys.Shards())
	for shard := range sampled {
		sampled[shard] = metrics.Shard{Stream: keys.Stream(shard), Delay: mq.NewDelayQueue(rdb, keys.Delayed(shard), keys.Stream(shard)), Ready: keys.Ready(shard)}
	}
	sampler := metrics.NewSampler(rdb, m, metrics.SamplerConfig{Group: orderGroup, Shards: sampled, Every: cfg.MetricsEvery}, log)
	g.Go(func() error { return sampler.Run(bg) })

	if writer != nil {
		// Crash point of the fault tests: stop dead holding a batch just
		// read.
		var afterRead func(int)
		if cfg.CrashPoint == "hang_after_read" {
			afterRead = func(int) { select {} }
		}
		name := mq.ConsumerName()
		for shard := range keys.Shards() {
			delay := mq.NewDelayQueue(rdb, keys.Delayed(shard), keys.Stream(shard))
			// Several consumers per shard: one batch's Redis round trips
			// overlap another's transaction.
			for i := range cfg.Consumers {
				c := mq.NewConsumer(rdb, mq.ConsumerConfig{
					Stream: keys.Stream(shard), Group: orderGroup, Consumer: fmt.Sprintf("%s-%d", name, i),
					Batch: cfg.Batch, Block: cfg.Block, Grace: cfg.Shutdown / 2,
					ReclaimIdle: cfg.ReclaimIdle, Delay: delay, Observer: m, AfterRead: afterRead,
				}, writer, log)
				fg.Go(func() error { return c.Run(fctx) })
			}
			poller := mq.NewPoller(delay, mq.PollerConfig{}, log)
			g.Go(func() error { return poller.Run(bg) })
		}
		log.Info("worker started", "consumer", name, "shards", keys.Shards(), "lock_nodes", max(len(cfg.LockNodes), 1))
	}

	if lns.main != nil {
		log.Info("http server listening", "addr", lns.main.Addr().String(), "api", cfg.serveAPI())
		serveHTTP(ctx, fctx, fg, lns.main, mainRouter, cfg.Shutdown, log)
	}
	if lns.admin != nil {
		reserver := voucher.NewReserver(rdb, keys)
		r := adminEngine(log, m, signer, &admin{dead: order.NewDeadLetters(db, reserver), warmer: warmer})
		log.Info("admin listener listening", "addr", lns.admin.Addr().String())
		serveHTTP(ctx, fctx, fg, lns.admin, r, cfg.Shutdown, log)
	}

	<-fctx.Done()
	log.Info("shutting down")
	ferr := fg.Wait()
	stopBG()
	gerr := g.Wait()
	log.Info("stopped")
	return errors.Join(ferr, gerr)
}

// listeners are the bound sockets of the service; a nil one is not served.
type listeners struct {
	main, admin net.Listener
}

// listen binds the main listener (the API, or a worker-only instance's
// probes and metrics) and the admin listener. The API's address must bind;
// any other must when its setting names it. A default that is taken is
// logged and left out: the sale or the worker goes on without it.
func listen(cfg config, log *slog.Logger) (listeners, error) {
	var ls listeners
	var err error
	ls.main, err = bind("http", cfg.Addr, "SECKILL_ADDR", cfg.serveAPI() || cfg.AddrGiven, log)
	if err != nil {
		return listeners{}, err
	}
	if cfg.AdminAddr != "off" {
		ls.admin, err = bind("admin", cfg.AdminAddr, "SECKILL_ADMIN_ADDR", cfg.AdminAddrGiven, log)
		if err != nil {
			ls.close()
			return listeners{}, err
		}
	}
	return ls, nil
}

func bind(what, addr, setting string, required bool, log *slog.Logger) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	if required {
		return nil, fmt.Errorf("%s listener: %s=%s: %w", what, setting, addr, err)
	}
	log.Error(what+" listener not started: its default address cannot be bound; set "+setting+" to a free address (or off)",
		"addr", addr, "err", err)
	return nil, nil
}

// close closes the sockets not yet handed to a server (a server closes its
// own on shutdown; a second close does nothing).
func (ls listeners) close() {
	for _, ln := range []net.Listener{ls.main, ls.admin} {
		if ln != nil {
			_ = ln.Close()
		}
	}
}

// announceAdmin prints an admin token on the embedded mode's first start,
// so a newcomer can create a voucher with curl. It goes to stdout as plain
// text, never into a log line, and is kept in the data dir.
func announceAdmin(cfg config, signer *auth.Signer, stdout io.Writer) error {
	tok, err := signer.Mint(auth.Identity{UserID: 1, Role: auth.RoleAdmin}, 30*24*time.Hour)
	if err != nil {
		return err
	}
	path := filepath.Join(cfg.DataDir, "admin-token")
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	fmt.Fprintf(stdout, "\nFirst start: an admin token (user 1, valid 30 days) is in %s:\n\n  %s\n\n"+
		"Mint more with: go run ./cmd/api token --user 42 [--admin]\n\n", path, tok)
	return nil
}

// announceNewDatabase tells how the first admin gets in when the service
// has just migrated a new MySQL database: with real servers no token is
// made and kept for it, and phone login is off until a sender is set up.
func announceNewDatabase(stdout io.Writer) {
	fmt.Fprint(stdout, "\nNew database. An admin token, signed with this SECKILL_TOKEN_SECRET (run it with the same one):\n\n"+
		"  go run ./cmd/api token --user 1 --admin --ttl 24h     (or: api token ... with the binary)\n\n")
}

// apiEngine is the main listener's router: every route of addRoutes,
// measured, and /metrics for a Prometheus that scrapes this instance
// directly (the handler refuses requests that came through nginx).
func apiEngine(log *slog.Logger, m *metrics.Metrics, d deps) *gin.Engine {
	r := newEngine(log)
	r.Use(m.Gin())
	addRoutes(r, d)
	r.GET("/metrics", m.Handler())
	return r
}

// workerEngine is the main listener's router on an instance with
// SECKILL_ROLE=worker: the probes an orchestrator needs and /metrics,
// measured, and nothing else (no API, no profiles).
func workerEngine(log *slog.Logger, m *metrics.Metrics, h *health) *gin.Engine {
	r := newEngine(log)
	r.Use(m.Gin())
	addWorkerRoutes(r, h)
	r.GET("/metrics", m.Handler())
	return r
}

// adminEngine is the admin listener's router. It serves /metrics too, for
// a Prometheus on the same machine that scrapes loopback only.
func adminEngine(log *slog.Logger, m *metrics.Metrics, signer *auth.Signer, a *admin) *gin.Engine {
	r := newEngine(log)
	addAdminRoutes(r, signer, a)
	r.GET("/metrics", m.Handler())
	return r
}

// serveHTTP serves h on ln in fg until stop is done, then drains it within
// timeout.
func serveHTTP(ctx, stop context.Context, fg *errgroup.Group, ln net.Listener, h http.Handler, timeout time.Duration, log *slog.Logger) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 120 * time.Second}
	fg.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server on %s: %w", ln.Addr(), err)
		}
		return nil
	})
	fg.Go(func() error {
		<-stop.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("http server did not drain in time", "addr", ln.Addr().String(), "err", err)
			return srv.Close()
		}
		return nil
	})
}
