package auth

import (
	"context"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

const identityKey = "seckill.identity"

// Middleware refuses requests without a valid bearer token (401) and stores
// the caller's identity for the handlers. It checks the token alone: an
// admin token revoked since it was minted passes. The service puts a Guard
// in front of its routes instead; tools and tests whose tokens are never
// revoked use this.
func (s *Signer) Middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		if id, ok := s.authenticate(c); ok {
			c.Set(identityKey, id)
			c.Next()
		}
	}
}

// authenticate parses the request's bearer token; on anything wrong it
// answers 401 and reports false.
func (s *Signer) authenticate(c *gin.Context) (Identity, bool) {
	h := c.GetHeader("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		c.Header("WWW-Authenticate", `Bearer realm="seckill"`)
		apierr.Abort(c, http.StatusUnauthorized, "unauthorized", "a bearer token is required")
		return Identity{}, false
	}
	id, err := s.Parse(strings.TrimSpace(tok))
	if err != nil {
		refuse(c, "the token is invalid or expired")
		return Identity{}, false
	}
	return id, true
}

func refuse(c *gin.Context, msg string) {
	c.Header("WWW-Authenticate", `Bearer realm="seckill", error="invalid_token"`)
	apierr.Abort(c, http.StatusUnauthorized, "unauthorized", msg)
}

// VersionReader tells a user's current admin token version (Versions).
type VersionReader interface {
	Current(ctx context.Context, userID int64) (int64, error)
}

// Guard checks the bearer token of every route that takes one: its
// signature, expiry and lifetime (Signer), and for an admin token its
// version against its user's, read from the database on each request, so a
// revocation holds at once on every instance, on every route (an admin
// token also reads any buyer's order, not only the admin routes). A
// buyer's token is not looked up: the purchase path costs no query. When
// the version cannot be read the request answers 503: an admin token is
// never taken unchecked.
type Guard struct {
	signer   *Signer
	versions VersionReader
	log      *slog.Logger
}

// NewGuard returns a Guard that checks tokens with signer and admin
// tokens' versions with versions.
func NewGuard(signer *Signer, versions VersionReader, log *slog.Logger) *Guard {
	return &Guard{signer: signer, versions: versions, log: log}
}

// Middleware refuses requests without a valid bearer token, or with an
// admin token revoked since it was minted (401), and stores the caller's
// identity for the handlers.
func (g *Guard) Middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		id, ok := g.signer.authenticate(c)
		if !ok {
			return
		}
		if id.Admin() {
			current, err := g.versions.Current(c.Request.Context(), id.UserID)
			if err != nil {
				g.log.Error("reading an admin token's version failed", "user_id", id.UserID, "err", err)
				apierr.Unavailable(c, "unavailable", "the admin token cannot be checked right now; try again shortly")
				return
			}
			if id.Version < current {
				refuse(c, "the token was revoked; get a new one")
				return
			}
		}
		c.Set(identityKey, id)
		c.Next()
	}
}

// RequireAdmin refuses callers without the admin role (403). It runs after
// a Guard's (or Signer's) Middleware.
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
