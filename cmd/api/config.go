package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"seckill/internal/lease"
	"seckill/internal/redact"
	"seckill/internal/redisconn"
)

// config is every setting of the service, read from the environment. The
// settings table of docs/operating.md lists the same names.
type config struct {
	Addr     string // SECKILL_ADDR
	RedisURL string // SECKILL_REDIS_URL; empty: embedded Redis
	// EmbeddedRedisAddr is where the embedded Redis listens, so redis-cli
	// (and tests) can look at it.
	EmbeddedRedisAddr string        // SECKILL_EMBEDDED_REDIS_ADDR
	MySQLDSN          string        // SECKILL_MYSQL_DSN; empty: embedded SQLite
	DataDir           string        // SECKILL_DATA_DIR: embedded mode's files
	Secret            string        // SECKILL_TOKEN_SECRET
	TokenTTL          time.Duration // SECKILL_TOKEN_TTL
	AdminTokenMaxTTL  time.Duration // SECKILL_ADMIN_TOKEN_MAX_TTL: caps admin tokens, minted and accepted
	Role              string        // SECKILL_ROLE: all, api or worker
	Shards            int           // SECKILL_SHARDS
	KeyPrefix         string        // SECKILL_KEY_PREFIX
	Batch             int           // SECKILL_WORKER_BATCH
	Block             time.Duration // SECKILL_WORKER_BLOCK
	// Consumers is how many batches one instance writes at once per shard.
	Consumers int           // SECKILL_WORKER_CONSUMERS
	Shutdown  time.Duration // SECKILL_SHUTDOWN_TIMEOUT
	Warm      time.Duration // SECKILL_WARM_INTERVAL
	RedisPool int           // SECKILL_REDIS_POOL
	// WaitReplicas is how many replicas must acknowledge an accepted
	// purchase before it is answered (Redis WAIT); 0: none.
	WaitReplicas int           // SECKILL_REDIS_WAIT_REPLICAS
	WaitTimeout  time.Duration // SECKILL_REDIS_WAIT_TIMEOUT
	// BucketStaleAfter and BucketApplyWindow bound the transfers of units
	// between a voucher's buckets (internal/bucket).
	BucketStaleAfter  time.Duration // SECKILL_BUCKET_STALE_AFTER
	BucketApplyWindow time.Duration // SECKILL_BUCKET_APPLY_WINDOW
	// ConfirmAlone lets a cluster master with no replica confirm writes
	// alone under WaitReplicas (redisconn.Replicas): "on" or "off".
	ConfirmAlone string // SECKILL_REDIS_CONFIRM_ALONE
	// FullCoverage is what start-up does on a Redis Cluster whose masters
	// require full slot coverage: refuse, or warn.
	FullCoverage string // SECKILL_FULL_COVERAGE
	// RebuildLease is the time to live of a shard's rebuild lease and of a
	// voucher's bucket lease, renewed every third of it while a rebuild
	// goes on.
	RebuildLease time.Duration // SECKILL_REBUILD_LEASE
	// Coalesce is the most purchase scripts sent to Redis in one
	// pipeline; 0: one round trip per purchase.
	Coalesce int // SECKILL_REDIS_COALESCE
	// LocalRefusals bounds how old a refusal the instance answers without
	// Redis may be (voucher.Refusals); 0: every purchase goes to Redis.
	LocalRefusals time.Duration // SECKILL_LOCAL_REFUSALS_TTL
	LogLevel      slog.Level    // SECKILL_LOG_LEVEL
	LogFormat     string        // SECKILL_LOG_FORMAT: auto, json or text
	LockNodes     []string      // SECKILL_LOCK_NODES: Redis URLs; empty: the main Redis
	LockTTL       time.Duration // SECKILL_LOCK_TTL
	ReclaimIdle   time.Duration // SECKILL_RECLAIM_IDLE
	MaxDeliveries int           // SECKILL_MAX_DELIVERIES
	MaxAttempts   int           // SECKILL_MAX_ATTEMPTS
	AdminAddr     string        // SECKILL_ADMIN_ADDR; "off" disables the admin listener
	MetricsEvery  time.Duration // SECKILL_METRICS_INTERVAL: how often stream and delay-queue gauges are read
	// CrashPoint names a point where the worker stops, for fault tests:
	// after_commit_before_ack exits the process there; hang_after_read
	// blocks the worker holding the batch it read (to be killed). Never set
	// it in production.
	CrashPoint string // SECKILL_CRASH_POINT

	// AddrGiven and AdminAddrGiven record that SECKILL_ADDR and
	// SECKILL_ADMIN_ADDR were set: an address asked for by name must be
	// bound, or start-up fails; a default that is taken is logged and
	// skipped (the API's listener always must bind).
	AddrGiven, AdminAddrGiven bool

	// Web holds login, web page and rate-limit settings (config_web.go).
	Web webConfig
	// Pay holds the pay window and payment settings (config_pay.go).
	Pay payConfig
}

func (c config) serveAPI() bool      { return c.Role == "all" || c.Role == "api" }
func (c config) runWorker() bool     { return c.Role == "all" || c.Role == "worker" }
func (c config) embeddedRedis() bool { return c.RedisURL == "" }
func (c config) embeddedDB() bool    { return c.MySQLDSN == "" }

// defaultAdminAddr is the admin listener's address when SECKILL_ADMIN_ADDR
// is not set. Not 9090 (Prometheus), 9091 to 9999 (Pushgateway,
// Alertmanager, the exporters) nor 6060 (the usual Go pprof port): on a
// machine that runs one of those the default would be taken.
const defaultAdminAddr = "127.0.0.1:8079"

// coreSettings are the service's settings; paySettings (config_pay.go) and
// webSettings (config_web.go) follow them in the table.
var coreSettings = []setting{
	// The embedded mode hands out free payments and prints login codes:
	// it listens on loopback unless told otherwise.
	{name: "SECKILL_ADDR", def: "127.0.0.1:8080", withDSN: ":8080",
		doc:   "HTTP listen address: API, web page, /healthz, /readyz, /metrics",
		field: func(c *config) value { return text{&c.Addr, hostPort} }},
	{name: "SECKILL_REDIS_URL", unset: "(embedded)", show: redactURL,
		doc:   "redis://[:password@]host:6379/0 or redis-cluster://host:port?addr=host2:port2; empty: in-process Redis",
		field: func(c *config) value { return text{&c.RedisURL, redisURL} }},
	{name: "SECKILL_REDIS_WAIT_REPLICAS", def: "0",
		doc:   "replicas that must have an accepted purchase before it is answered (WAIT); 0: do not wait",
		field: func(c *config) value { return integer{&c.WaitReplicas, 0, 16} }},
	{name: "SECKILL_REDIS_WAIT_TIMEOUT", def: "100ms",
		doc:   "how long an accepted purchase waits for them; then 503 not_replicated",
		field: func(c *config) value { return duration{p: &c.WaitTimeout, lo: time.Millisecond} }},
	{name: "SECKILL_BUCKET_STALE_AFTER", def: "3s",
		doc:   "a transfer of units between a voucher's buckets still journaled after this is finished or returned by the recovery loop",
		field: func(c *config) value { return duration{p: &c.BucketStaleAfter, lo: 10 * time.Millisecond} }},
	{name: "SECKILL_BUCKET_APPLY_WINDOW", def: "2s",
		doc:   "a transfer's units are taken in by the receiving bucket only this soon after the donor gave them (a transfer takes milliseconds; the masters' clocks must agree well within it); must be below SECKILL_BUCKET_STALE_AFTER. A bucket's rebuild waits it out with the other buckets fenced",
		field: func(c *config) value { return duration{p: &c.BucketApplyWindow, lo: time.Millisecond} }},
	{name: "SECKILL_REDIS_CONFIRM_ALONE", def: "on",
		doc:   "with SECKILL_REDIS_WAIT_REPLICAS, on: a cluster master that has no replica, as it and a majority of the masters agree (a replica promoted after its master was lost for good), confirms purchases and transfers alone, so its bucket sells and lends; off: they answer not_replicated and its bucket stays closed after a rebuild until a replica is attached",
		field: func(c *config) value { return oneOf{&c.ConfirmAlone, []string{"off", "on"}} }},
	{name: "SECKILL_FULL_COVERAGE", def: "refuse",
		doc:   "on a Redis Cluster whose masters say cluster-require-full-coverage yes (one master down stops every slot, so every bucket of every voucher, for the whole failover): refuse to start, or warn",
		field: func(c *config) value { return oneOf{&c.FullCoverage, []string{"refuse", "warn"}} }},
	{name: "SECKILL_REBUILD_LEASE", def: "30s",
		doc:   "a rebuild's leases (the shard's, a bucketed voucher's) live this long unless renewed; the rebuild renews them every third of it, so this bounds how long a crashed instance's rebuild blocks the next; a rebuild still running after ten times this gives up and the next round starts over",
		field: func(c *config) value { return duration{p: &c.RebuildLease, lo: lease.Min, hi: 10 * time.Minute} }},
	{name: "SECKILL_REDIS_COALESCE", def: "128",
		doc:   "most purchase scripts sent to Redis in one pipeline; 0: one round trip each",
		field: func(c *config) value { return integer{&c.Coalesce, 0, 1024} }},
	{name: "SECKILL_EMBEDDED_REDIS_ADDR", def: "127.0.0.1:0",
		doc:   "where the in-process Redis listens (for redis-cli)",
		field: func(c *config) value { return text{&c.EmbeddedRedisAddr, nil} }},
	{name: "SECKILL_MYSQL_DSN", unset: "(embedded)", show: redactDSN,
		doc:   "user:pass@tcp(host:3306)/seckill; empty: SQLite in the data dir",
		field: func(c *config) value { return text{&c.MySQLDSN, nil} }},
	{name: "SECKILL_DATA_DIR", def: "seckill-data",
		doc:   "embedded mode's files: database, token secret, admin token",
		field: func(c *config) value { return text{&c.DataDir, nil} }},
	{name: "SECKILL_TOKEN_SECRET", unset: "(data dir)", secret: true,
		doc:   "HS256 secret, at least 32 bytes, the same on every instance; required with SECKILL_MYSQL_DSN",
		field: func(c *config) value { return text{&c.Secret, nil} }},
	{name: "SECKILL_TOKEN_TTL", def: "24h",
		doc:   "lifetime of minted and login tokens",
		field: func(c *config) value { return positive(&c.TokenTTL) }},
	{name: "SECKILL_ADMIN_TOKEN_MAX_TTL", def: "24h",
		doc: "longest life of an admin token: api token --admin --ttl above it is refused, an admin's login token and the embedded mode's first admin token live at most this, and an admin token minted to live longer is refused on every route",
		field: func(c *config) value {
			return duration{p: &c.AdminTokenMaxTTL, lo: time.Minute, hi: 30 * 24 * time.Hour}
		}},
	{name: "SECKILL_ROLE", def: "all",
		doc:   "all, api (HTTP only) or worker (order worker only)",
		field: func(c *config) value { return oneOf{&c.Role, []string{"all", "api", "worker"}} }},
	{name: "SECKILL_SHARDS", def: "1",
		doc:   "stream shards (on a Redis Cluster a multiple of the masters); recorded with the data: another count is refused until the old layout's orders and pay deadlines are drained; stop every instance, then start all with the new count",
		field: func(c *config) value { return integer{&c.Shards, 1, 1024} }},
	{name: "SECKILL_KEY_PREFIX", def: "seckill",
		doc:   "prefix of every Redis key",
		field: func(c *config) value { return text{&c.KeyPrefix, keyPrefix} }},
	{name: "SECKILL_WORKER_BATCH", def: "500",
		doc:   "stream entries per read and per transaction",
		field: func(c *config) value { return integer{&c.Batch, 1, 2_000} }},
	{name: "SECKILL_WORKER_BLOCK", def: "1s",
		doc:   "how long one stream read waits",
		field: func(c *config) value { return positive(&c.Block) }},
	{name: "SECKILL_WORKER_CONSUMERS", def: "4",
		doc:   "consumers per shard in one instance: batches written at once",
		field: func(c *config) value { return integer{&c.Consumers, 1, 64} }},
	{name: "SECKILL_SHUTDOWN_TIMEOUT", def: "15s",
		doc:   "bound on draining HTTP and the batch in flight on SIGTERM/SIGINT",
		field: func(c *config) value { return positive(&c.Shutdown) }},
	{name: "SECKILL_LOCAL_REFUSALS_TTL", def: "200ms",
		doc: "how old a refusal an instance may answer from memory, without Redis; off: every purchase goes to Redis",
		field: func(c *config) value {
			return duration{p: &c.LocalRefusals, lo: time.Millisecond, hi: 5 * time.Second, off: true}
		}},
	{name: "SECKILL_WARM_INTERVAL", def: "5s",
		doc:   "how often missing voucher state is reloaded from the database",
		field: func(c *config) value { return positive(&c.Warm) }},
	{name: "SECKILL_REDIS_POOL", def: "256",
		doc:   "Redis connections per instance",
		field: func(c *config) value { return integer{&c.RedisPool, 1, 10_000} }},
	{name: "SECKILL_LOCK_NODES", unset: "(the main Redis)", show: redact.URLs,
		doc:   "comma-separated redis:// URLs of independent buyer-lock nodes; a majority must grant a lock",
		field: func(c *config) value { return list{&c.LockNodes, redisURL} }},
	{name: "SECKILL_LOCK_TTL", def: "10s",
		doc:   "expiry of a buyer lock; the worker extends it while it writes",
		field: func(c *config) value { return positive(&c.LockTTL) }},
	{name: "SECKILL_RECLAIM_IDLE", def: "30s",
		doc:   "stream entries pending this long with a consumer are taken over by another",
		field: func(c *config) value { return positive(&c.ReclaimIdle) }},
	{name: "SECKILL_MAX_DELIVERIES", def: "5",
		doc:   "a message delivered more often is dead-lettered",
		field: func(c *config) value { return integer{&c.MaxDeliveries, 1, 1000} }},
	{name: "SECKILL_MAX_ATTEMPTS", def: "8",
		doc:   "a message whose buyer lock was held on this many tries is dead-lettered",
		field: func(c *config) value { return integer{&c.MaxAttempts, 1, 1000} }},
	{name: "SECKILL_ADMIN_ADDR", def: defaultAdminAddr,
		doc:   "admin listener: dead letters, reconcile, readiness details, pprof, /metrics; off disables it",
		field: func(c *config) value { return text{&c.AdminAddr, hostPortOrOff} }},
	{name: "SECKILL_METRICS_INTERVAL", def: "5s",
		doc:   "how often stream length, pending, lag and delay-queue gauges are read from Redis",
		field: func(c *config) value { return positive(&c.MetricsEvery) }},
	{name: "SECKILL_LOG_LEVEL", def: "info",
		doc:   "debug, info, warn or error",
		field: func(c *config) value { return level{&c.LogLevel} }},
	{name: "SECKILL_LOG_FORMAT", def: "auto",
		doc:   "auto (text when the log goes to a terminal, json otherwise), json or text",
		field: func(c *config) value { return oneOf{&c.LogFormat, []string{"auto", "json", "text"}} }},
	{name: "SECKILL_CRASH_POINT", def: "",
		doc:   "fault tests only: after_commit_before_ack, hang_after_read, after_take_before_apply, after_apply_before_close or stop_after_bucket_rebuild",
		field: func(c *config) value { return text{&c.CrashPoint, crashPointSetting} }},
}

// loadConfig reads every setting of the table from getenv, then checks
// those that depend on one another.
func loadConfig(getenv func(string) string) (config, error) {
	var c config
	errs := loadSettings(settings(), getenv, &c)
	c.AddrGiven = strings.TrimSpace(getenv("SECKILL_ADDR")) != ""
	c.AdminAddrGiven = strings.TrimSpace(getenv("SECKILL_ADMIN_ADDR")) != ""
	if c.BucketApplyWindow >= c.BucketStaleAfter {
		errs = append(errs, "SECKILL_BUCKET_APPLY_WINDOW must be below SECKILL_BUCKET_STALE_AFTER: a transfer could be applied after the recovery loop returned its units")
	}
	if c.RedisURL == "" && c.WaitReplicas > 0 {
		errs = append(errs, "SECKILL_REDIS_WAIT_REPLICAS needs SECKILL_REDIS_URL: the embedded Redis has no replicas")
	}
	errs = append(errs, c.Web.check()...)
	errs = append(errs, c.Pay.check()...)
	if len(errs) > 0 {
		return config{}, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// LogValue is the configuration as the table's rows: secrets only as set
// or not, passwords in URLs and DSNs redacted, durations as 15m0s.
func (c config) LogValue() slog.Value {
	return slog.GroupValue(logAttrs(settings(), &c)...)
}

func hostPort(s string) error {
	if _, _, err := net.SplitHostPort(s); err != nil {
		return errors.New("must be host:port or :port")
	}
	return nil
}

func hostPortOrOff(s string) error {
	if s == "off" {
		return nil
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return errors.New("must be host:port, :port or off")
	}
	return nil
}

func redisURL(s string) error {
	if s == "" {
		return nil
	}
	if _, err := redisconn.Parse(s); err != nil {
		return fmt.Errorf("is refused: %w", err)
	}
	return nil
}

func keyPrefix(s string) error {
	if strings.ContainsAny(s, "{} ") {
		return errors.New("must not contain braces or spaces")
	}
	return nil
}

func crashPointSetting(s string) error {
	if !crashPointValid(s) {
		return errors.New("must be empty, after_commit_before_ack or hang_after_read")
	}
	return nil
}

// httpURL refuses what is not an http(s) URL with a host; empty passes.
func httpURL(s string) error {
	if s == "" {
		return nil
	}
	if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("must be an http(s) URL")
	}
	return nil
}

// redactURL shows a URL setting: "embedded" when empty, else as
// redact.URL shows it (scheme, host and path).
func redactURL(s string) string {
	if s == "" {
		return "embedded"
	}
	return redact.URL(s)
}

// redactDSN shows SECKILL_MYSQL_DSN: "embedded" when empty, else with its
// password and parameter values replaced (redact.DSN).
func redactDSN(s string) string {
	if s == "" {
		return "embedded"
	}
	return redact.DSN(s)
}
