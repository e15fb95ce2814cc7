package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"seckill/internal/redisconn"
)

// config is every setting of the service, read from the environment. The
// README's settings table lists the same names.
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
	// Coalesce is the most purchase scripts sent to Redis in one
	// pipeline; 0: one round trip per purchase.
	Coalesce int // SECKILL_REDIS_COALESCE
	// LocalRefusals bounds how old a refusal the instance answers without
	// Redis may be (voucher.Refusals); 0: every purchase goes to Redis.
	LocalRefusals time.Duration // SECKILL_LOCAL_REFUSALS_TTL
	LogLevel      slog.Level    // SECKILL_LOG_LEVEL
	LogFormat     string        // SECKILL_LOG_FORMAT: json or text
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

func loadConfig(getenv func(string) string) (config, error) {
	var errs []string
	str := func(name, def string) string { return cmp.Or(strings.TrimSpace(getenv(name)), def) }
	num := func(name string, def, lo, hi int) int {
		s := getenv(name)
		if s == "" {
			return def
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Sprintf("%s must be an integer from %d to %d", name, lo, hi))
		}
		return n
	}
	dur := func(name string, def time.Duration) time.Duration {
		s := getenv(name)
		if s == "" {
			return def
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			errs = append(errs, name+" must be a positive duration such as 5s")
		}
		return d
	}
	c := config{
		Addr:              str("SECKILL_ADDR", ":8080"),
		RedisURL:          str("SECKILL_REDIS_URL", ""),
		MySQLDSN:          str("SECKILL_MYSQL_DSN", ""),
		EmbeddedRedisAddr: str("SECKILL_EMBEDDED_REDIS_ADDR", "127.0.0.1:0"),
		DataDir:           str("SECKILL_DATA_DIR", "seckill-data"),
		Secret:            getenv("SECKILL_TOKEN_SECRET"),
		TokenTTL:          dur("SECKILL_TOKEN_TTL", 24*time.Hour),
		Role:              str("SECKILL_ROLE", "all"),
		Shards:            num("SECKILL_SHARDS", 1, 1, 1024),
		KeyPrefix:         str("SECKILL_KEY_PREFIX", "seckill"),
		Batch:             num("SECKILL_WORKER_BATCH", 200, 1, 2_000),
		Block:             dur("SECKILL_WORKER_BLOCK", time.Second),
		Consumers:         num("SECKILL_WORKER_CONSUMERS", 4, 1, 64),
		Shutdown:          dur("SECKILL_SHUTDOWN_TIMEOUT", 15*time.Second),
		Warm:              dur("SECKILL_WARM_INTERVAL", 5*time.Second),
		RedisPool:         num("SECKILL_REDIS_POOL", 256, 1, 10_000),
		WaitReplicas:      num("SECKILL_REDIS_WAIT_REPLICAS", 0, 0, 16),
		WaitTimeout:       dur("SECKILL_REDIS_WAIT_TIMEOUT", 100*time.Millisecond),
		Coalesce:          num("SECKILL_REDIS_COALESCE", 128, 0, 1024),
		LogFormat:         str("SECKILL_LOG_FORMAT", "json"),
		CrashPoint:        str("SECKILL_CRASH_POINT", ""),
		LockTTL:           dur("SECKILL_LOCK_TTL", 10*time.Second),
		ReclaimIdle:       dur("SECKILL_RECLAIM_IDLE", 30*time.Second),
		MaxDeliveries:     num("SECKILL_MAX_DELIVERIES", 5, 1, 1000),
		MaxAttempts:       num("SECKILL_MAX_ATTEMPTS", 8, 1, 1000),
		AdminAddr:         str("SECKILL_ADMIN_ADDR", defaultAdminAddr),
		MetricsEvery:      dur("SECKILL_METRICS_INTERVAL", 5*time.Second),
	}
	c.AddrGiven = strings.TrimSpace(getenv("SECKILL_ADDR")) != ""
	c.AdminAddrGiven = strings.TrimSpace(getenv("SECKILL_ADMIN_ADDR")) != ""
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, "SECKILL_ADDR must be host:port or :port")
	}
	if _, _, err := net.SplitHostPort(c.AdminAddr); err != nil && c.AdminAddr != "off" {
		errs = append(errs, "SECKILL_ADMIN_ADDR must be host:port, :port or off")
	}
	for _, u := range strings.Split(getenv("SECKILL_LOCK_NODES"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.LockNodes = append(c.LockNodes, u)
		}
	}
	var (
		webErrs []string
		err     error
	)
	c.Web, webErrs = loadWebConfig(getenv)
	errs = append(errs, webErrs...)
	c.Pay, webErrs = loadPayConfig(getenv, c.embeddedDB(), dur)
	errs = append(errs, webErrs...)
	if err := c.LogLevel.UnmarshalText([]byte(str("SECKILL_LOG_LEVEL", "info"))); err != nil {
		errs = append(errs, "SECKILL_LOG_LEVEL must be debug, info, warn or error")
	}
	if c.Role != "all" && c.Role != "api" && c.Role != "worker" {
		errs = append(errs, "SECKILL_ROLE must be all, api or worker")
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, "SECKILL_LOG_FORMAT must be json or text")
	}
	if !crashPointValid(c.CrashPoint) {
		errs = append(errs, "SECKILL_CRASH_POINT must be empty, after_commit_before_ack or hang_after_read")
	}
	if c.RedisURL != "" {
		if _, err := redisconn.Parse(c.RedisURL); err != nil {
			errs = append(errs, "SECKILL_REDIS_URL: "+err.Error())
		}
	}
	c.LocalRefusals, err = localRefusalsTTL(getenv("SECKILL_LOCAL_REFUSALS_TTL"))
	if err != nil {
		errs = append(errs, err.Error())
	}
	if c.WaitTimeout < time.Millisecond {
		errs = append(errs, "SECKILL_REDIS_WAIT_TIMEOUT must be at least 1ms")
	}
	if c.RedisURL == "" && c.WaitReplicas > 0 {
		errs = append(errs, "SECKILL_REDIS_WAIT_REPLICAS needs SECKILL_REDIS_URL: the embedded Redis has no replicas")
	}
	if strings.ContainsAny(c.KeyPrefix, "{} ") {
		errs = append(errs, "SECKILL_KEY_PREFIX must not contain braces or spaces")
	}
	if len(errs) > 0 {
		return config{}, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// LogValue keeps secrets out of logs: passwords in URLs and DSNs and the
// token secret are redacted.
func (c config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("addr", c.Addr),
		slog.String("role", c.Role),
		slog.String("redis", redactURL(c.RedisURL)),
		slog.String("mysql", redactDSN(c.MySQLDSN)),
		slog.Int("shards", c.Shards),
		slog.String("key_prefix", c.KeyPrefix),
		slog.Int("worker_batch", c.Batch),
		slog.Bool("token_secret_set", c.Secret != ""),
		slog.Int("lock_nodes", max(len(c.LockNodes), 1)),
		slog.Int("redis_wait_replicas", c.WaitReplicas),
		slog.Duration("local_refusals_ttl", c.LocalRefusals),
		slog.String("admin_addr", c.AdminAddr),
		slog.Duration("pay_window", c.Pay.Window),
		slog.String("pay_provider", c.Pay.Provider),
		slog.Bool("pay_webhook_secret_set", c.Pay.Secret != ""),
	)
}

// localRefusalsTTL reads SECKILL_LOCAL_REFUSALS_TTL: a duration from 1ms
// to 5s (default 200ms), or off (or 0).
func localRefusalsTTL(s string) (time.Duration, error) {
	switch s = strings.TrimSpace(s); s {
	case "":
		return 200 * time.Millisecond, nil
	case "off", "0":
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond || d > 5*time.Second {
		return 0, errors.New("SECKILL_LOCAL_REFUSALS_TTL must be a duration from 1ms to 5s, such as 200ms, or off")
	}
	return d, nil
}

func redactURL(s string) string {
	if s == "" {
		return "embedded"
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

func redactDSN(s string) string {
	if s == "" {
		return "embedded"
	}
	// user:password@tcp(host)/db -> user:xxxxx@tcp(host)/db
	at := strings.LastIndex(s, "@")
	if at < 0 {
		return s
	}
	cred := s[:at]
	if user, _, ok := strings.Cut(cred, ":"); ok {
		return user + ":xxxxx" + s[at:]
	}
	return s
}
