package auth

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

// maxLoginBody bounds the login routes' bodies: a phone and a code.
const maxLoginBody = 1 << 10

type codeRequest struct {
	Phone string `json:"phone"`
}

type loginRequest struct {
	Phone string `json:"phone"`
	Code  string `json:"code"`
}

// RequestCode is POST /api/v1/auth/code {"phone"}: it sends a code and
// answers 202 with how long it lives and when another may be asked for.
// The code is never in the answer.
func (l *Login) RequestCode(c *gin.Context) {
	var req codeRequest
	if !apierr.DecodeJSON(c, maxLoginBody, &req) {
		return
	}
	err := l.SendCode(c.Request.Context(), req.Phone, c.ClientIP())
	if err == nil {
		c.JSON(http.StatusAccepted, gin.H{
			"expires_in":   int(l.cfg.CodeTTL.Seconds()),
			"resend_after": int(l.cfg.Resend.Seconds()),
		})
		return
	}
	l.abort(c, err)
}

// SignIn is POST /api/v1/auth/login {"phone", "code"}: it answers 200 with
// a bearer token, or 401 for a wrong, expired, used or locked code.
func (l *Login) SignIn(c *gin.Context) {
	var req loginRequest
	if !apierr.DecodeJSON(c, maxLoginBody, &req) {
		return
	}
	s, err := l.Verify(c.Request.Context(), req.Phone, req.Code, c.ClientIP())
	if err == nil {
		c.JSON(http.StatusOK, gin.H{
			"token": s.Token, "token_type": "Bearer", "expires_at": s.ExpiresAt,
			"user_id": s.Identity.UserID, "role": s.Identity.Role, "new_user": s.NewUser,
		})
		return
	}
	l.abort(c, err)
}

// abort translates a login error into its answer; unexpected ones are
// logged here, once.
func (l *Login) abort(c *gin.Context, err error) {
	var wait *WaitError
	var wrong *WrongCodeError
	switch {
	case errors.Is(err, ErrBadPhone):
		apierr.Abort(c, http.StatusUnprocessableEntity, "invalid_phone", "phone must be in international form: + and 8 to 15 digits, such as +8613800138000")
	case errors.Is(err, ErrBadCode):
		apierr.Abort(c, http.StatusUnprocessableEntity, "invalid_code", "the code is 6 digits")
	case errors.As(err, &wait):
		secs := max(1, int((wait.Wait+time.Second-1)/time.Second))
		c.Header("Retry-After", strconv.Itoa(secs))
		msg := "a code was sent a moment ago; wait before asking for another"
		switch wait.Reason {
		case WaitWindow:
			msg = "too many codes were asked for this phone from your address; try again later"
		case WaitPhone:
			msg = "too many codes were sent to this phone; try again later"
		}
		apierr.Abort(c, http.StatusTooManyRequests, "too_many_requests", msg)
	case errors.As(err, &wrong):
		c.AbortWithStatusJSON(http.StatusUnauthorized, gin.H{
			"code": "wrong_code", "message": "the code is wrong", "tries_left": wrong.TriesLeft,
		})
	case errors.Is(err, ErrNoCode):
		apierr.Abort(c, http.StatusUnauthorized, "code_expired", "no valid code for this phone: it expired or was used; ask for a new one")
	case errors.Is(err, ErrCodeLocked):
		apierr.Abort(c, http.StatusUnauthorized, "code_locked", "too many wrong codes; ask for a new one")
	case errors.Is(err, ErrNoSender):
		apierr.Unavailable(c, "login_unavailable", "phone login is not set up on this server")
	default:
		l.log.Error("login step failed", "route", c.FullPath(), "err", err)
		apierr.Unavailable(c, "unavailable", "login is unavailable; try again shortly")
	}
}

// RevokeTokens is POST /api/v1/admin/users/{id}/revoke-tokens (admin): the
// user's admin tokens minted until now are refused from the next request
// on, on every instance and every route ("api token revoke" does the
// same). It answers 200 with the user's new admin token version; a token
// minted after carries it and is taken.
func RevokeTokens(v *Versions, log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		user, ok := apierr.PathID(c, "id")
		if !ok {
			return
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		version, err := v.Revoke(c.Request.Context(), user, now)
		if err != nil {
			log.Error("revoking admin tokens failed", "user_id", user, "err", err)
			apierr.Unavailable(c, "unavailable", "the tokens cannot be revoked right now; try again shortly")
			return
		}
		log.Info("admin tokens revoked", "user_id", user, "token_version", version, "by_user_id", From(c).UserID)
		c.JSON(http.StatusOK, gin.H{"user_id": user, "token_version": version, "revoked_at": now})
	}
}
