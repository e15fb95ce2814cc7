package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/bucket"
	"seckill/internal/db"
	"seckill/internal/draw"
	"seckill/internal/failover"
	"seckill/internal/fleet"
	"seckill/internal/idgen"
	"seckill/internal/metrics"
	"seckill/internal/mq"
	"seckill/internal/order"
	"seckill/internal/payment"
	"seckill/internal/redisconn"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// orderGroup is the consumer group of the order workers on every shard stream.
const orderGroup = "order-writers"

// tokenSecret is SECKILL_TOKEN_SECRET, or in embedded-database mode the
// secret kept in the data dir; from says which. With create (the service)
// a missing one is made and created reports a first start; without (api
// token) a missing one is an error: a token signed with a secret the
// service never saw would be refused.
func tokenSecret(cfg config, create bool) (secret, from string, created bool, err error) {
	if cfg.Secret != "" {
		return cfg.Secret, "SECKILL_TOKEN_SECRET", false, nil
	}
	if !cfg.embeddedDB() {
		return "", "", false, errors.New("SECKILL_TOKEN_SECRET is required with SECKILL_MYSQL_DSN (at least 32 bytes, the same on every instance)")
	}
	from = "the embedded mode's secret in " + secretPath(cfg.DataDir)
	if !create {
		secret, err := readSecret(cfg.DataDir)
		if errors.Is(err, fs.ErrNotExist) {
			return "", "", false, fmt.Errorf("no token secret: SECKILL_TOKEN_SECRET is not set and %s does not exist; "+
				"set SECKILL_TOKEN_SECRET to the service's, or run the service once in embedded mode (SECKILL_DATA_DIR=%s)", secretPath(cfg.DataDir), cfg.DataDir)
		}
		return secret, from, false, err
	}
	secret, created, err = embeddedSecret(cfg.DataDir)
	return secret, from, created, err
}

// newSigner is the signer of the service and its commands: admin tokens
// capped at SECKILL_ADMIN_TOKEN_MAX_TTL.
func newSigner(cfg config, secret string) (*auth.Signer, error) {
	return auth.NewSigner([]byte(secret), auth.WithAdminMaxTTL(cfg.AdminTokenMaxTTL))
}

// printToken prints a token on stdout, and on stderr which secret signed
// it. An admin token lives at most SECKILL_ADMIN_TOKEN_MAX_TTL (a longer
// --ttl is refused; without --ttl, SECKILL_TOKEN_TTL shortened to it) and
// carries the user's admin token version, read from the database.
func printToken(ctx context.Context, e *cmdEnv, user int64, admin bool, ttl time.Duration) error {
	if admin && ttl > e.cfg.AdminTokenMaxTTL {
		return fmt.Errorf("--ttl %s is above SECKILL_ADMIN_TOKEN_MAX_TTL (%s): an admin token lives at most that long", ttl, e.cfg.AdminTokenMaxTTL)
	}
	secret, from, _, err := tokenSecret(e.cfg, false)
	if err != nil {
		return err
	}
	signer, err := newSigner(e.cfg, secret)
	if err != nil {
		return err
	}
	id := auth.Identity{UserID: user, Role: auth.RoleUser}
	ttl = cmp.Or(ttl, e.cfg.TokenTTL)
	var version string
	if admin {
		id.Role = auth.RoleAdmin
		ttl = min(ttl, e.cfg.AdminTokenMaxTTL)
		if id.Version, version, err = adminVersion(ctx, e.cfg, e.log, user); err != nil {
			return err
		}
		version = fmt.Sprintf(", token version %d (%s)", id.Version, version)
	}
	tok, err := signer.Mint(id, ttl)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "token for user %d (%s%s), valid %s, signed with %s\n", user, id.Role, version, ttl, from)
	fmt.Fprintln(e.stdout, tok)
	return nil
}

// adminVersion is the user's admin token version, for an admin token
// minted by a command, and where it was read. A database not migrated to
// token_versions yet, or the embedded mode's before its first start, never
// revoked anything: version 0.
func adminVersion(ctx context.Context, cfg config, log *slog.Logger, user int64) (int64, string, error) {
	if cfg.embeddedDB() {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, "seckill.db")); errors.Is(err, fs.ErrNotExist) {
			return 0, "no database in " + cfg.DataDir + " yet", nil
		}
	}
	g, closeDB, err := openDB(ctx, cfg, log, false)
	if err != nil {
		return 0, "", fmt.Errorf("an admin token carries its user's token version, from the service's database: %w", err)
	}
	defer closeDB()
	if !g.Migrator().HasTable("token_versions") {
		return 0, "the database has no token_versions yet", nil
	}
	v, err := auth.NewVersions(g).Current(ctx, user)
	if err != nil {
		return 0, "", fmt.Errorf("an admin token carries its user's token version: %w", err)
	}
	return v, "from the database", nil
}

// revokeTokens runs "api token revoke --user N": the user's admin tokens
// minted before are refused from the next request on, by every instance.
func revokeTokens(ctx context.Context, e *cmdEnv, user int64) error {
	if e.cfg.embeddedDB() {
		if _, err := os.Stat(filepath.Join(e.cfg.DataDir, "seckill.db")); errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("no database in SECKILL_DATA_DIR=%s: set SECKILL_MYSQL_DSN to the service's, or run the service once in embedded mode", e.cfg.DataDir)
		}
	}
	g, closeDB, err := openDB(ctx, e.cfg, e.log, false)
	if err != nil {
		return err
	}
	defer closeDB()
	if !g.Migrator().HasTable("token_versions") {
		return errors.New("the database has no token_versions table yet: run api migrate, or start the service, first")
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	version, err := auth.NewVersions(g).Revoke(ctx, user, now)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "every admin token of user %d minted before now is refused from the next request on; a new one: api token --user %d --admin\n", user, user)
	return printJSON(e.stdout, map[string]any{"user_id": user, "token_version": version, "revoked_at": now})
}

// migrate runs "api migrate": it prints the versions applied and the
// schema's version as JSON.
func migrate(ctx context.Context, e *cmdEnv) error {
	db, closeDB, err := openDB(ctx, e.cfg, e.log, true)
	if err != nil {
		return err
	}
	defer closeDB()
	if !e.cfg.embeddedRedis() {
		rdb, closeRedis, err := openRedis(ctx, e.cfg, e.log)
		if err != nil {
			return err
		}
		defer closeRedis()
		if err := checkFleet(ctx, e.cfg, rdb, db); err != nil {
			return err
		}
	}
	applied, err := schema.Apply(ctx, db)
	if err != nil {
		return err
	}
	v, err := schema.Current(ctx, db)
	if err != nil {
		return err
	}
	if !e.cfg.embeddedDB() && len(applied) > 0 && applied[0] == 1 {
		announceNewDatabase(e.stderr)
	}
	if applied == nil {
		applied = []int{}
	}
	return printJSON(e.stdout, map[string]any{"applied": applied, "schema_version": v})
}

// serve runs the API and the worker until ctx is done, then shuts down in
// order: stop taking requests, let the worker finish and ack its batch,
// then release the id lease and close the clients. Every component is
// built and every listener bound before any goroutine starts, so a failure
// at start-up unwinds through the deferred closes alone.
func serve(ctx context.Context, cfg config, log *slog.Logger, stdout io.Writer) error {
	log.Info("starting", "config", cfg)
	warnEmbedded(cfg, log)
	secret, _, firstStart, err := tokenSecret(cfg, true)
	if err != nil {
		return err
	}
	signer, err := newSigner(cfg, secret)
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
	db, primary, closeDB, err := openPrimaryDB(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := checkFleet(ctx, cfg, rdb, db); err != nil {
		return err
	}
	if err := applyMigrations(ctx, cfg, db, log, stdout); err != nil {
		return err
	}

	if err := checkShardCount(ctx, cfg, rdb, saleKeys(cfg, rdb), log); err != nil {
		return err
	}
	if err := checkCoverage(ctx, cfg, rdb, log); err != nil {
		return err
	}
	probeDB, closeProbe, err := openProbeDB(cfg)
	if err != nil {
		return err
	}
	defer closeProbe()
	c := newCore(ctx, cfg, rdb, db, primary, log)
	c.drawKey = drawKeyOf(secret)
	c.health.probeDB = probeDB
	warnUnpayable(ctx, cfg, c)
	if firstStart {
		if err := announceAdmin(ctx, cfg, signer, auth.NewVersions(db), stdout); err != nil {
			return err
		}
	}
	locks, closeLocks, err := openWorkerLocks(cfg, rdb, log)
	if err != nil {
		return err
	}
	defer closeLocks()
	svc, err := build(ctx, cfg, c, locks, signer, lns, stdout)
	if err != nil {
		return err
	}
	return svc.run(ctx)
}

// warnEmbedded says so when the service runs on its in-process Redis or
// its SQLite file.
func warnEmbedded(cfg config, log *slog.Logger) {
	if cfg.embeddedRedis() || cfg.embeddedDB() {
		log.Warn("embedded mode: in-process Redis and/or SQLite file; data of the in-process Redis is lost on exit. "+
			"For real servers set SECKILL_REDIS_URL (redis://host:6379/0) and SECKILL_MYSQL_DSN (user:pass@tcp(host:3306)/seckill) and SECKILL_TOKEN_SECRET",
			"embedded_redis", cfg.embeddedRedis(), "embedded_database", cfg.embeddedDB(), "data_dir", cfg.DataDir)
	}
}

// checkFleet refuses to migrate the database while an instance built for
// an older schema runs: its code would write to a schema it does not know.
// Only instances of releases that list themselves (package fleet) are seen.
func checkFleet(ctx context.Context, cfg config, rdb redis.UniversalClient, db *gorm.DB) error {
	latest, err := schema.Latest(db.Dialector.Name())
	if err != nil {
		return err
	}
	// No table yet reads as an error: version 0, everything to apply.
	if current, _ := schema.Current(ctx, db); current >= latest {
		return nil
	}
	running, err := fleet.Running(ctx, rdb, cfg.KeyPrefix, time.Now())
	if err != nil {
		return fmt.Errorf("check for running instances before migrating: %w", err)
	}
	if older := fleet.Older(running, latest); len(older) > 0 {
		names := make([]string, len(older))
		for i, m := range older {
			names[i] = fmt.Sprintf("%s (schema %d)", m.Name, m.Schema)
		}
		return fmt.Errorf("migrating the database to schema version %d refused: %d instance(s) built for an older schema still run: %s; "+
			"stop them first (their entries lapse %s after they stop, if killed); see docs/operating.md, Upgrades and migrations",
			latest, len(older), strings.Join(names, ", "), fleet.TTL)
	}
	return nil
}

// applyMigrations brings the schema up to date, and tells how the first
// admin gets in when it has just created a MySQL database's tables.
func applyMigrations(ctx context.Context, cfg config, db *gorm.DB, log *slog.Logger, stdout io.Writer) error {
	applied, err := schema.Apply(ctx, db)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		log.Info("migrations applied", "versions", applied)
		if !cfg.embeddedDB() && applied[0] == 1 {
			announceNewDatabase(stdout)
		}
	}
	return nil
}

// openWorkerLocks connects to the buyer-lock nodes when this instance runs
// the worker; otherwise it returns no locks and a close that does nothing.
func openWorkerLocks(cfg config, rdb redis.UniversalClient, log *slog.Logger) (*order.Locks, func(), error) {
	if !cfg.runWorker() {
		return nil, func() {}, nil
	}
	return openLocks(cfg, rdb, log)
}

// core is what every role of the service shares: the clients, the
// metrics, the keys and stores, the one Reserver, and the warmer.
type core struct {
	rdb    redis.UniversalClient
	db     *gorm.DB
	log    *slog.Logger
	m      *metrics.Metrics
	keys   voucher.Keys
	vstore *voucher.Store
	vstate *voucher.State
	ostore *order.Store
	// life moves written orders through their lifecycle.
	life     *order.Lifecycle
	reserver *voucher.Reserver
	warmer   *voucher.Warmer
	health   *health
	// events announces what makes local refusals wrong, to every instance.
	events *voucher.Events
	// mover moves units between the buckets of a voucher of more than
	// one: for purchases (Borrow), rebuilds (Quiesce), and the recovery
	// and rebalancing loops.
	mover *bucket.Mover
	// replicas is the replica-less policy (nil when off).
	replicas *redisconn.Replicas
	// primary is the MySQL pool's view of which server it reaches (nil on
	// SQLite); watcher checks that server and writes back what a failover
	// of it lost.
	primary *db.Primary
	watcher *failover.Watcher
	// drawKey derives fair vouchers' secrets (drawKeyOf).
	drawKey []byte
}

// newCore builds the shared components and warms the voucher state once.
// A warm-up that fails is logged, not fatal: purchases answer not_ready
// and the warmer's loop tries again.
func newCore(ctx context.Context, cfg config, rdb redis.UniversalClient, db *gorm.DB, primary *db.Primary, log *slog.Logger) *core {
	m := metrics.New()
	m.WatchRedisPool(rdb.PoolStats)
	// A master with no replica confirms purchases and transfers alone
	// (redisconn.Replicas), counted for SeckillMasterWithoutReplica.
	replicas := confirmAlone(cfg, rdb)
	m.WatchAloneWrites(replicas.AloneWrites)
	if sqlDB, err := db.DB(); err == nil {
		m.WatchDB(sqlDB)
	}
	keys := saleKeys(cfg, rdb)
	mover := newMover(cfg, rdb, keys, replicas, crashPoint(cfg.CrashPoint), m.BucketRebuildPause, log)
	c := &core{
		rdb: rdb, db: db, log: log, m: m, keys: keys, mover: mover,
		vstore:   voucher.NewStore(db),
		vstate:   voucher.NewState(rdb, keys),
		ostore:   order.NewStore(db),
		reserver: newReserver(cfg, rdb, keys, replicas, mover),
		replicas: replicas,
		health:   &health{rdb: rdb, db: db, dbGates: !cfg.serveAPI(), keys: keys, log: log, checks: readyChecks(m.Registry())},
		events:   voucher.NewEvents(rdb, keys, log),
	}
	c.primary = primary
	c.watcher = newWatcher(cfg, rdb, db, gateOf(primary), m, log)
	c.health.watch = c.watcher.Status
	// Moves of written orders wait while the database's new primary is
	// not checked, or what it lost is not written back.
	c.life = order.NewLifecycle(db, rdb, keys, order.LifecycleConfig{Events: c.events, Observer: m, Verified: c.watcher.AllReady}, log)
	describeRedis(ctx, cfg, rdb, keys, log)
	c.warmer = voucher.NewWarmer(c.vstore, c.vstate, c.ostore, keys, cfg.Warm, log)
	c.warmer.OnRebuild(m.ShardRebuilt)
	m.WatchRebuild(c.warmer.Running)
	c.warmer.Announce(c.events)
	c.warmer.Quiesce(mover)
	c.vstate.HoldWith(mover)
	c.warmer.LeaseTTL(cfg.RebuildLease)
	// A voucher's bucket count comes from the database at each warm
	// round: no purchase goes first to bucket 0 to be told it.
	c.warmer.Teach(c.reserver.Learn)
	if crash := crashPoint(cfg.CrashPoint); crash.afterBucket != nil {
		c.warmer.AfterBucket(crash.afterBucket)
	}
	c.warmer.ReplaceWhen(c.watcher.Ready)
	// The database checked first: the writers and a rebuild of a shard
	// whose state Redis still holds wait for it.
	if err := c.watcher.Check(ctx); err != nil {
		log.Warn("checking the database failed; checked again each second", "err", err)
	}
	if n, err := c.warmer.Warm(ctx); err != nil {
		log.Warn("warming voucher state failed; purchases answer not_ready until it works", "err", err)
	} else {
		log.Info("voucher state warmed", "loaded", n)
	}
	return c
}

// gateOf is the pool's failover gate for the watcher: none on SQLite.
func gateOf(p *db.Primary) failover.Gate {
	if p == nil {
		return nil
	}
	return p
}

// saleKeys names the sale's keys: on a Redis Cluster each shard's hash
// tag is chosen so the shards spread over the slot range, and so over the
// masters.
func saleKeys(cfg config, rdb redis.UniversalClient) voucher.Keys {
	return voucher.KeysFor(cfg.KeyPrefix, cfg.Shards, redisconn.IsCluster(rdb))
}

// confirmAlone is the replica-less policy of SECKILL_REDIS_CONFIRM_ALONE:
// nil (WAIT alone decides) when off.
func confirmAlone(cfg config, rdb redis.UniversalClient) *redisconn.Replicas {
	if cfg.ConfirmAlone != "on" {
		return nil
	}
	return redisconn.NewReplicas(redisconn.ClusterPeers(rdb))
}

// newReserver is the one Reserver of an instance: with
// SECKILL_REDIS_WAIT_REPLICAS an accepted purchase waits for replicas; a
// buyer whose home bucket is empty borrows units through mover.
func newReserver(cfg config, rdb redis.UniversalClient, keys voucher.Keys, rs *redisconn.Replicas, mover *bucket.Mover) *voucher.Reserver {
	if cfg.WaitReplicas == 0 {
		return voucher.NewReserver(rdb, keys, voucher.Coalesce(cfg.Coalesce), voucher.Lend(mover))
	}
	// WAIT confirms one connection's writes: purchases that wait for
	// replicas are not coalesced.
	return voucher.NewReserver(rdb, keys, voucher.WaitReplicasOr(cfg.WaitReplicas, cfg.WaitTimeout, rs), voucher.Lend(mover))
}

// newMover moves units between the buckets of a voucher: with
// SECKILL_REDIS_WAIT_REPLICAS each step of a transfer waits for replicas
// too, so a failover loses none of its steps. paused, when set, hears how
// long each bucket rebuild kept the voucher's other buckets fenced.
func newMover(cfg config, rdb redis.UniversalClient, keys voucher.Keys, rs *redisconn.Replicas, crash crashHooks, paused func(time.Duration), log *slog.Logger) *bucket.Mover {
	return bucket.NewMover(rdb, keys, bucket.Config{
		WaitReplicas: cfg.WaitReplicas, WaitTimeout: cfg.WaitTimeout, Replicas: rs,
		StaleAfter: cfg.BucketStaleAfter, ApplyWindow: cfg.BucketApplyWindow,
		LeaseTTL: cfg.RebuildLease, AfterStep: crash.afterStep, Paused: paused,
	}, log.With("component", "bucket"))
}

// observeBuckets turns what the Rebalancer reads each pass, and what the
// mover and the recovery loop counted since, into metrics.
func observeBuckets(m *metrics.Metrics, mover *bucket.Mover, rec *bucket.Recoverer) func(bucket.Pass) {
	var last bucket.Stats
	return func(p bucket.Pass) {
		a, b := mover.Stats(), rec.Stats()
		now := bucket.Stats{Applied: a.Applied + b.Applied, Returned: a.Returned + b.Returned, Units: a.Units + b.Units}
		m.BucketMoves(now.Applied-last.Applied, now.Returned-last.Returned, now.Units-last.Units)
		last = now
		m.BucketStocks(p.Stocks)
		m.BucketUnaccounted(p.Unaccounted)
		m.BucketOldest(rec.Oldest())
	}
}

// liveBuckets lists the vouchers of more than one bucket on sale, for the
// Rebalancer, from a list read at most once a second.
func liveBuckets(store *voucher.Store) func(ctx context.Context) ([]bucket.Live, error) {
	var (
		mu   sync.Mutex
		at   time.Time
		last []bucket.Live
	)
	return func(ctx context.Context) ([]bucket.Live, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) < time.Second {
			return last, nil
		}
		vs, err := store.Live(ctx, time.Now())
		if err != nil {
			return nil, err
		}
		var out []bucket.Live
		for _, v := range vs {
			if v.BucketCount() > 1 {
				out = append(out, bucket.Live{ID: v.ID, NB: v.BucketCount()})
			}
		}
		last, at = out, time.Now()
		return last, nil
	}
}

// runner is a background service or a worker loop: it runs until its
// context is done.
type runner interface {
	Run(ctx context.Context) error
}

// instance is a serving instance, built and bound, not started yet.
type instance struct {
	log      *slog.Logger
	shutdown time.Duration
	lns      listeners
	// main and admin are the routers of lns.main and lns.admin.
	main, admin http.Handler
	// consumers are the worker's stream consumers: foreground, stopped
	// with the HTTP servers. background runs until the foreground stopped.
	consumers  []runner
	background []runner
	// workerStarted is the worker's start-up log line; empty without one.
	workerStarted []any
	api           bool
	// reach says, on the listening line, who can reach the main listener
	// when the embedded mode chose loopback.
	reach []any
}

// build builds every component of the instance; nothing runs yet. The id
// lease is taken last, as nothing after it can fail: ids.Run releases it.
func build(ctx context.Context, cfg config, c *core, locks *order.Locks, signer *auth.Signer, lns listeners, stdout io.Writer) (*instance, error) {
	s := &instance{log: c.log, shutdown: cfg.Shutdown, lns: lns, api: cfg.serveAPI()}
	if cfg.embeddedDB() && !cfg.AddrGiven {
		s.reach = []any{"reachable_from", "this machine only (embedded mode); SECKILL_ADDR=:8080 listens on every interface"}
	}
	recoverer := bucket.NewRecoverer(c.mover)
	rebalancer := bucket.NewRebalancer(c.mover, liveBuckets(c.vstore))
	rebalancer.Report(observeBuckets(c.m, c.mover, recoverer))
	s.background = append(s.background, c.warmer, newSampler(cfg, c), recoverer, rebalancer, c.watcher)
	// Listed as running, with the schema it knows, so that a newer
	// release's migration waits until this instance stopped.
	latest, _ := schema.Latest(c.db.Dialector.Name())
	s.background = append(s.background, fleet.NewRegistry(c.rdb, cfg.KeyPrefix, mq.ConsumerName(), latest, c.log))
	if locks != nil {
		s.buildWorker(cfg, c, locks)
	}
	versions := auth.NewVersions(c.db)
	guard := auth.NewGuard(signer, versions, c.log)
	if lns.admin != nil {
		s.admin = adminEngine(c.log, c.m, guard, &admin{dead: order.NewDeadLetters(c.db, c.reserver), warmer: c.warmer, health: c.health, watcher: c.watcher})
	}
	if !cfg.serveAPI() {
		s.main = workerEngine(c.log, c.m, c.health)
		return s, nil
	}
	orders := order.NewHTTP(c.ostore, c.life, c.rdb, c.keys, c.log)
	payments, err := payment.New(c.db, orders, c.life, payment.Config{
		Provider: cfg.Pay.Provider, GatewayURL: cfg.Pay.GatewayURL, NotifyURL: cfg.Pay.NotifyURL, Secret: []byte(cfg.Pay.Secret),
		Tolerance: cfg.Pay.Tolerance, Observer: c.m,
	}, c.log)
	if err != nil {
		return nil, err
	}
	ids, err := idgen.Lease(ctx, c.rdb, idgen.Config{KeyPrefix: cfg.KeyPrefix}, c.log)
	if err != nil {
		return nil, err
	}
	s.background = append([]runner{ids}, s.background...)
	vouchers := voucher.NewHTTP(c.vstore, c.vstate, c.reserver, ids, c.log)
	vouchers.DrawKey(c.drawKey)
	vouchers.Observe(c.m)
	// Fair vouchers open with a draw: entries until the close, then one
	// instance buys them in the draw's order.
	router := draw.NewRouter(c.rdb, c.keys)
	if cfg.WaitReplicas > 0 {
		router.WaitReplicas(cfg.WaitReplicas, cfg.WaitTimeout, c.replicas)
	}
	vouchers.Draw(router)
	// What a voucher is, the instance learns from the database at each
	// warm round: no purchase waits on bucket 0 to say it.
	c.warmer.Teach(router.Learn)
	s.background = append(s.background, draw.NewDrawer(c.db, c.rdb, c.keys, c.reserver, draw.DrawerConfig{Key: c.drawKey}, c.log.With("component", "draw")))
	if cfg.Pay.Provider == "off" {
		vouchers.RefusePriced("set SECKILL_PAY_PROVIDER=webhook (with SECKILL_PAY_GATEWAY_URL and SECKILL_PAY_WEBHOOK_SECRET) to take payments")
	}
	if cfg.LocalRefusals > 0 {
		refusals := voucher.NewRefusals(c.rdb, c.keys, voucher.RefusalsConfig{TTL: cfg.LocalRefusals, Events: c.events}, c.log)
		vouchers.Refuse(refusals)
		s.background = append(s.background, refusals)
	}
	s.main = apiEngine(c.log, c.m, deps{
		cfg: cfg, log: c.log, rdb: c.rdb, db: c.db, signer: signer, guard: guard, versions: versions, keys: c.keys, stdout: stdout,
		vouchers: vouchers,
		orders:   orders,
		payments: payments,
		health:   c.health,
	})
	return s, nil
}

// newSampler reads the stream and delay-queue gauges of every shard. Every
// instance reads them; dashboards take the max per shard.
func newSampler(cfg config, c *core) *metrics.Sampler {
	sampled := make([]metrics.Shard, c.keys.Shards())
	for shard := range sampled {
		sampled[shard] = metrics.Shard{
			Stream: c.keys.Stream(shard), Delay: mq.NewDelayQueue(c.rdb, c.keys.Delayed(shard), c.keys.Stream(shard)), Ready: c.keys.Ready(shard),
		}
	}
	return metrics.NewSampler(c.rdb, c.m, metrics.SamplerConfig{Group: orderGroup, Shards: sampled, Every: cfg.MetricsEvery}, c.log)
}

// pollIdle is the longest a delay-queue poller sleeps while nothing in its
// queue is due sooner. What this instance schedules wakes its poller in
// time; what another instance schedules waits up to this much more, when
// that instance's own poller is gone.
const pollIdle = time.Second

// buildWorker builds the writer, the consumers of every shard stream and
// each shard's delay-queue poller, with the hooks of the crash point.
func (s *instance) buildWorker(cfg config, c *core, locks *order.Locks) {
	crash := crashPoint(cfg.CrashPoint)
	expiries := order.NewExpiries(c.rdb, c.keys)
	writer := order.NewWriter(c.db, c.rdb, c.keys, order.WriterConfig{
		Locks: locks, KeyPrefix: cfg.KeyPrefix, MaxDeliveries: int64(cfg.MaxDeliveries), MaxAttempts: cfg.MaxAttempts,
		AfterCommit: crash.afterCommit, Observer: c.m, Events: c.events,
		PayWindow: cfg.Pay.Window, Expiries: expiries, Verified: c.watcher.Ready,
	}, c.log)
	expirer := order.NewExpirer(c.life, expiries, c.log)
	name := mq.ConsumerName()
	for shard := range c.keys.Shards() {
		// One expirer per shard: deadlines come at the pace orders were
		// written, one transaction each.
		due := expiries.Queue(shard)
		s.consumers = append(s.consumers, mq.NewConsumer(c.rdb, mq.ConsumerConfig{
			Stream: due.Stream(), Group: order.ExpiryGroup, Consumer: name,
			Batch: 100, Block: cfg.Block, Grace: cfg.Shutdown / 2, ReclaimIdle: cfg.ReclaimIdle,
		}, expirer, c.log))
		s.background = append(s.background, mq.NewPoller(due, mq.PollerConfig{Idle: pollIdle}, c.log))
	}
	s.background = append(s.background, order.NewSweeper(c.db, c.life, order.SweeperConfig{Every: cfg.Pay.Sweep, Observer: c.m, Ready: c.life.ShardReady}, c.log))
	for shard := range c.keys.Shards() {
		delay := mq.NewDelayQueue(c.rdb, c.keys.Delayed(shard), c.keys.Stream(shard))
		// Several consumers per shard: one batch's Redis round trips
		// overlap another's transaction.
		for i := range cfg.Consumers {
			s.consumers = append(s.consumers, mq.NewConsumer(c.rdb, mq.ConsumerConfig{
				Stream: c.keys.Stream(shard), Group: orderGroup, Consumer: fmt.Sprintf("%s-%d", name, i),
				Batch: cfg.Batch, Block: cfg.Block, Grace: cfg.Shutdown / 2,
				ReclaimIdle: cfg.ReclaimIdle, Delay: delay, Observer: c.m, AfterRead: crash.afterRead,
			}, writer, c.log))
		}
		s.background = append(s.background, mq.NewPoller(delay, mq.PollerConfig{Idle: pollIdle}, c.log))
	}
	s.workerStarted = []any{"consumer", name, "shards", c.keys.Shards(), "lock_nodes", max(len(cfg.LockNodes), 1)}
}

// run starts everything, waits for ctx or the first failure of the
// foreground (HTTP servers, consumers), and stops in order: the foreground
// first, so requests in flight still get ids and state, then the
// background services. The caller's defers then close the clients.
func (s *instance) run(ctx context.Context) error {
	fgCtx, stopFG := context.WithCancel(ctx)
	defer stopFG()
	fg, fctx := errgroup.WithContext(fgCtx)
	bgCtx, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var bg errgroup.Group

	for _, r := range s.background {
		bg.Go(func() error { return r.Run(bgCtx) })
	}
	s.startForeground(ctx, fctx, fg)

	<-fctx.Done()
	s.log.Info("shutting down")
	ferr := fg.Wait()
	stopBG()
	berr := bg.Wait()
	s.log.Info("stopped")
	return errors.Join(ferr, berr)
}

// startForeground starts the consumers and the HTTP servers in fg; they
// stop when stop is done.
func (s *instance) startForeground(ctx, stop context.Context, fg *errgroup.Group) {
	for _, c := range s.consumers {
		fg.Go(func() error { return c.Run(stop) })
	}
	if s.workerStarted != nil {
		s.log.Info("worker started", s.workerStarted...)
	}
	if s.lns.main != nil {
		s.log.Info("http server listening", append([]any{"addr", s.lns.main.Addr().String(), "api", s.api}, s.reach...)...)
		serveHTTP(ctx, stop, fg, s.lns.main, s.main, s.shutdown, s.log)
	}
	if s.lns.admin != nil {
		s.log.Info("admin listener listening", "addr", s.lns.admin.Addr().String())
		serveHTTP(ctx, stop, fg, s.lns.admin, s.admin, s.shutdown, s.log)
	}
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
// text, never into a log line, and is kept in the data dir. It lives as
// long as an admin token may (SECKILL_ADMIN_TOKEN_MAX_TTL, a day by
// default), no longer: the file is the longest-kept copy of a token there
// is. An expired one is replaced with api token.
func announceAdmin(ctx context.Context, cfg config, signer *auth.Signer, versions *auth.Versions, stdout io.Writer) error {
	version, err := versions.Current(ctx, 1)
	if err != nil {
		return err
	}
	ttl := cfg.AdminTokenMaxTTL
	tok, err := signer.Mint(auth.Identity{UserID: 1, Role: auth.RoleAdmin, Version: version}, ttl)
	if err != nil {
		return err
	}
	path := filepath.Join(cfg.DataDir, "admin-token")
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	fmt.Fprintf(stdout, "\nFirst start: an admin token (user 1, valid %s: SECKILL_ADMIN_TOKEN_MAX_TTL) is in %s:\n\n  %s\n\n"+
		"Mint more, or a new one once it expires, with: go run ./cmd/api token --user 42 [--admin]\n\n", ttl, path, tok)
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
func adminEngine(log *slog.Logger, m *metrics.Metrics, guard *auth.Guard, a *admin) *gin.Engine {
	r := newEngine(log)
	addAdminRoutes(r, guard, a)
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
