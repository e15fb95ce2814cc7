package ratelimit

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

// Middleware answers 429 too_many_requests with Retry-After (whole seconds,
// at least 1) when the bucket of key(c) is empty. A key of "" is not
// limited. A nil or switched-off limiter adds nothing.
func Middleware(l *Limiter, key func(*gin.Context) string) gin.HandlerFunc {
	if l == nil || l.rule.Off() {
		// Not even the key: a client address behind proxies is parsed
		// from headers, for nothing.
		return func(c *gin.Context) { c.Next() }
	}
	return func(c *gin.Context) {
		k := key(c)
		if k == "" {
			c.Next()
			return
		}
		if ok, wait := l.Allow(k); !ok {
			Refuse(c, wait)
			return
		}
		c.Next()
	}
}

// Refuse writes the 429 answer for a caller who must wait.
func Refuse(c *gin.Context, wait time.Duration) {
	c.Header("Retry-After", strconv.Itoa(RetryAfterSeconds(wait)))
	apierr.Abort(c, http.StatusTooManyRequests, "too_many_requests", "too many requests; try again in a moment")
}

// RetryAfterSeconds rounds a wait up to the whole seconds of Retry-After.
func RetryAfterSeconds(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}
