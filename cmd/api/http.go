package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/auth"
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
func accessLog(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		rid := c.GetHeader("X-Request-ID")
		if !plainRequestID(rid) {
			var b [8]byte
			_, _ = rand.Read(b[:])
			rid = hex.EncodeToString(b[:])
		}
		c.Header("X-Request-ID", rid)
		c.Next()
		log.LogAttrs(c.Request.Context(), slog.LevelInfo, "request",
			slog.String("request_id", rid),
			slog.String("method", c.Request.Method),
			slog.String("route", c.FullPath()),
			slog.Int("status", c.Writer.Status()),
			slog.Float64("latency_ms", float64(time.Since(start).Microseconds())/1000),
			slog.Int64("user_id", auth.From(c).UserID),
		)
	}
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
		if c.Request.Body != nil {
			c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, n)
		}
		c.Next()
	}
}

// health answers the liveness and readiness probes.
type health struct {
	rdb  redis.UniversalClient
	db   *gorm.DB
	keys voucher.Keys
}

func (h *health) live(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "up"}) }

// ready checks Redis (every master, a cluster's state, every shard's state
// loaded), the database and that the schema is at the version this build
// expects; what fails is named in detail.
func (h *health) ready(c *gin.Context) {
	// Redis and the database each get their own time: a Redis that hangs
	// must not make the database look down.
	rctx, rcancel := context.WithTimeout(c.Request.Context(), time.Second)
	defer rcancel()
	checks, detail := gin.H{}, gin.H{}
	rr := checkRedis(rctx, h.rdb, h.keys.Ready, h.keys.Shards())
	rr.report(checks, detail, redisconn.IsCluster(h.rdb))
	ok := rr.ok()
	ctx, cancel := context.WithTimeout(c.Request.Context(), time.Second)
	defer cancel()
	if sqlDB, err := h.db.DB(); err != nil || sqlDB.PingContext(ctx) != nil {
		checks["database"], ok = "down", false
	} else {
		checks["database"] = "up"
	}
	want, _ := schema.Latest(h.db.Dialector.Name())
	if got, err := schema.Current(ctx, h.db); err != nil || got != want {
		checks["migrations"], ok = "behind", false
	} else {
		checks["migrations"] = "current"
	}
	status := http.StatusOK
	if !ok {
		status = http.StatusServiceUnavailable
	}
	body := gin.H{"ready": ok, "checks": checks}
	if len(detail) > 0 {
		body["detail"] = detail
	}
	c.JSON(status, body)
}
