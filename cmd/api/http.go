package main

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/failover"
	"seckill/internal/redisconn"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// maxBody bounds every request body; routes may set a lower bound.
const maxBody = 64 << 10

func newEngine(log *slog.Logger) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.ContextWithFallback = true
	r.Use(accessLog(log), recoverJSON(log), limitBody(maxBody))
	r.NoRoute(func(c *gin.Context) { apierr.Abort(c, http.StatusNotFound, "not_found", "no such route") })
	r.NoMethod(func(c *gin.Context) {
		apierr.Abort(c, http.StatusMethodNotAllowed, "method_not_allowed", "this route does not take this method")
	})
	return r
}

// accessLog writes one line per request, with a request id taken from
// X-Request-ID (nginx sets it) or made here, and returned to the client.
// The line is built only when the logger takes info lines: at warn, as a
// busy deployment runs, a request costs the access log its request id
// and two clock readings.
func accessLog(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		// The header's canonical spelling, read and written in the map
		// directly: Get and Set would canonicalise "X-Request-ID" into a
		// new string on every request.
		var rid string
		if v := c.Request.Header[requestIDHeader]; len(v) > 0 && plainRequestID(v[0]) {
			rid = v[0]
		} else {
			rid = newRequestID()
		}
		c.Writer.Header()[requestIDHeader] = []string{rid}
		c.Next()
		ctx := c.Request.Context()
		if !log.Enabled(ctx, slog.LevelInfo) {
			return
		}
		log.LogAttrs(ctx, slog.LevelInfo, "request",
			slog.String("request_id", rid),
			slog.String("method", c.Request.Method),
			slog.String("route", c.FullPath()),
			slog.Int("status", c.Writer.Status()),
			slog.Float64("latency_ms", float64(time.Since(start).Microseconds())/1000),
			slog.Int64("user_id", auth.From(c).UserID),
			// The address the per-address limits key on: what a trusted
			// proxy (nginx) says, else the peer.
			slog.String("client", c.ClientIP()),
		)
	}
}

// requestIDHeader is X-Request-ID as net/http keys it.
var requestIDHeader = http.CanonicalHeaderKey("X-Request-ID")

// newRequestID returns 16 random hex digits. A request id tells requests
// apart in logs; it guards nothing, so it comes from the runtime's
// generator (ChaCha8, seeded from the system), which makes one without a
// system call.
func newRequestID() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// plainRequestID accepts the request ids nginx passes on: 1 to 64 of
// A-Z a-z 0-9 . _ : -. Anything else is replaced, so a client cannot put
// quotes, newlines or a secret-looking blob into log lines and answers.
func plainRequestID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '.', b == '_', b == ':', b == '-':
		default:
			return false
		}
	}
	return true
}

// recoverJSON turns a panic into a logged 500 with a JSON body.
func recoverJSON(log *slog.Logger) gin.HandlerFunc {
	return gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, err any) {
		log.Error("handler panicked", "route", c.FullPath(), "panic", err)
		apierr.Internal(c)
	})
}

func limitBody(n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		// A request that says it has no body (Content-Length: 0, or none
		// on a GET) has http.NoBody, which reads nothing: no bound needed.
		if c.Request.Body != nil && c.Request.Body != http.NoBody {
			c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, n)
		}
		c.Next()
	}
}

// health answers the liveness and readiness probes. The public answer is
// only ready or not: what failed (a master's address, a driver's error
// text, a cluster's state) is for operators, on the admin listener
// (/admin/readyz) and in the log. Each probe's result is kept for
// readyFor, so a flood of probes costs Redis and the database one probe a
// second whatever its size.
type health struct {
	rdb redis.UniversalClient
	db  *gorm.DB
	// probeDB is the database as the probe reaches it: a pool of its own
	// (openProbeDB), so that requests holding every connection of db's
	// pool do not read as a database down; nil: db.
	probeDB *gorm.DB
	// dbGates makes a database that does not answer fail readiness: on an
	// instance that serves no API (a worker, which writes with it). An
	// instance that serves the API stays ready without it: purchases
	// need Redis only, and a database down is every instance's, so
	// leaving rotation would stop the sale and help nothing
	// (docs/operating.md, Readiness).
	dbGates bool
	keys    voucher.Keys
	log     *slog.Logger
	// checks is seckill_ready_check{check}, set at each probe; nil: none.
	checks *prometheus.GaugeVec
	// watch is what the database watcher last found: which server the
	// database's address reaches, since when, and whether it is verified.
	watch func() failover.Status

	mu   sync.Mutex // held while a probe runs: concurrent callers wait for it
	last readiness
}

// readyFor is how long a probe's result answers /readyz.
const readyFor = time.Second

// readiness is one probe's result.
type readiness struct {
	ok     bool
	checks gin.H
	detail gin.H // what failed, when something did
	at     time.Time
}

func (h *health) live(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "up"}) }

// ready is the public probe: 200 {"ready":true} or 503 {"ready":false}.
// It names nothing: the details are the admin listener's.
func (h *health) ready(c *gin.Context) {
	r := h.current(c.Request.Context())
	c.JSON(r.status(), gin.H{"ready": r.ok})
}

// detailed is the operators' probe on the admin listener: each check, and
// what failed, and the database watcher's view (failover.Status: which
// server the database's address reaches, since when, whether it takes
// writes and whether it is verified).
func (h *health) detailed(c *gin.Context) {
	r := h.current(c.Request.Context())
	body := gin.H{"ready": r.ok, "checks": r.checks, "checked_at": r.at.UTC()}
	if len(r.detail) > 0 {
		body["detail"] = r.detail
	}
	if h.watch != nil {
		body["database_server"] = h.watch()
	}
	c.JSON(r.status(), body)
}

func (r readiness) status() int {
	if r.ok {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// current is the last probe's result while it is younger than readyFor,
// else a new probe's. A caller that goes away does not cut the probe
// short: its result is everyone's.
func (h *health) current(ctx context.Context) readiness {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.last.at.IsZero() && time.Since(h.last.at) < readyFor {
		return h.last
	}
	r := h.probe(context.WithoutCancel(ctx))
	h.logChange(r)
	h.measure(r)
	h.last = r
	return r
}

// passing are the values of a check that passes.
var passing = []any{"up", "ok", "loaded", "current"}

// measure sets seckill_ready_check from the probe.
func (h *health) measure(r readiness) {
	if h.checks == nil {
		return
	}
	for check, v := range r.checks {
		g := 0.0
		if slices.Contains(passing, v) {
			g = 1
		}
		h.checks.WithLabelValues(check).Set(g)
	}
}

// checkDatabase asks the database, on the probe's connection, whether it
// answers (database up or down) and at which schema version: migrations
// current, behind, newer (with what to say), or unknown when it cannot be
// read.
func (h *health) checkDatabase(ctx context.Context) (database, migrations, detail string) {
	pdb := cmp.Or(h.probeDB, h.db)
	if sqlDB, err := pdb.DB(); err != nil || sqlDB.PingContext(ctx) != nil {
		return "down", "unknown", ""
	}
	want, _ := schema.Latest(pdb.Dialector.Name())
	switch got, err := schema.Current(ctx, pdb); {
	case err != nil:
		return "up", "unknown", ""
	case got > want:
		// A newer release migrated the database: this instance's code
		// does not know the schema it runs on.
		return "up", "newer", fmt.Sprintf("database schema version %d, this build's %d: a newer release migrated it", got, want)
	case got < want:
		return "up", "behind", ""
	}
	return "up", "current", ""
}

// readyChecks registers seckill_ready_check on reg.
func readyChecks(reg prometheus.Registerer) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "seckill", Name: "ready_check",
		Help: "1 while a readiness check passes, 0 while it fails (redis, cluster, shards, database, migrations), as of the last /readyz probe.",
	}, []string{"check"})
	reg.MustRegister(g)
	return g
}

// logChange logs the readiness when it changed, with what failed.
func (h *health) logChange(r readiness) {
	if h.log == nil || (!h.last.at.IsZero() && h.last.ok == r.ok && fmt.Sprint(h.last.detail) == fmt.Sprint(r.detail)) {
		return
	}
	if r.ok {
		h.log.Info("ready", "checks", r.checks)
		return
	}
	h.log.Warn("not ready", "checks", r.checks, "detail", r.detail)
}

// probe checks Redis (every master, a cluster's state, every shard's state
// loaded), the database and that the schema is at the version this build
// expects. The database is asked on the probe's own connection; a database
// that does not answer fails readiness only where it gates (dbGates), and
// then its schema is unknown; a schema newer than this build's fails it
// everywhere.
func (h *health) probe(ctx context.Context) readiness {
	// Redis and the database each get their own time: a Redis that hangs
	// must not make the database look down.
	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	r := readiness{checks: gin.H{}, detail: gin.H{}}
	rr := checkRedis(rctx, h.rdb, h.keys.Ready, h.keys.Shards())
	rr.report(r.checks, r.detail, redisconn.IsCluster(h.rdb))
	r.ok = rr.ok()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	database, migrations, detail := h.checkDatabase(dctx)
	r.checks["database"], r.checks["migrations"] = database, migrations
	if detail != "" {
		r.detail["migrations"] = detail
	}
	switch {
	case migrations == "newer", migrations == "behind":
		r.ok = false
	case database != "up" || migrations != "current":
		// The database cannot be read: not ready where it gates.
		r.ok = r.ok && !h.dbGates
	}
	// Stamped when done: a probe that waited on timeouts still answers
	// for a full readyFor.
	r.at = time.Now()
	return r
}
