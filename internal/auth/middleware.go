package auth

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

const identityKey = "seckill.identity"

// Middleware refuses requests without a valid bearer token (401) and stores
// the caller's identity for the handlers.
func (s *Signer) Middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		h := c.GetHeader("Authorization")
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || tok == "" {
			c.Header("WWW-Authenticate", `Bearer realm="seckill"`)
			apierr.Abort(c, http.StatusUnauthorized, "unauthorized", "a bearer token is required")
			return
		}
		id, err := s.Parse(strings.TrimSpace(tok))
		if err != nil {
			c.Header("WWW-Authenticate", `Bearer realm="seckill", error="invalid_token"`)
			apierr.Abort(c, http.StatusUnauthorized, "unauthorized", "the token is invalid or expired")
			return
		}
		c.Set(identityKey, id)
		c.Next()
	}
}

// RequireAdmin refuses callers without the admin role (403). It runs after Middleware.
func RequireAdmin() gin.HandlerFunc {
	return func(c *gin.Context) {
		if !From(c).Admin() {
			apierr.Abort(c, http.StatusForbidden, "forbidden", "this operation needs the admin role")
			return
		}
		c.Next()
	}
}

// From returns the identity Middleware stored; the zero Identity when none.
func From(c *gin.Context) Identity {
	v, _ := c.Get(identityKey)
	id, _ := v.(Identity)
	return id
}
