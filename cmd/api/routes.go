package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/docs"
	"seckill/internal/auth"
	"seckill/internal/draw"
	"seckill/internal/order"
	"seckill/internal/payment"
	"seckill/internal/ratelimit"
	"seckill/internal/voucher"
	"seckill/internal/web"
)

// deps is what run built and the routes use.
type deps struct {
	cfg      config
	log      *slog.Logger
	rdb      redis.UniversalClient
	db       *gorm.DB
	signer   *auth.Signer
	guard    *auth.Guard // checks every route's token, admin tokens against versions
	versions *auth.Versions
	keys     voucher.Keys
	vouchers *voucher.HTTP
	orders   *order.HTTP
	payments *payment.HTTP
	health   *health
	// stdout is where the console login sender prints codes, outside the
	// structured log; os.Stdout when nil.
	stdout io.Writer
}

// addRoutes lists the whole HTTP surface.
func addRoutes(r *gin.Engine, d deps) {
	r.Use(web.Headers())
	// Only these may say who the client is (X-Forwarded-For): everyone
	// else would pick their own address for the per-address limits.
	if err := r.SetTrustedProxies(d.cfg.Web.TrustedProxies); err != nil {
		panic(fmt.Sprintf("trusted proxies passed validation but gin refused them: %v", err))
	}
	lim := newLimits(d.cfg.Web)
	login := auth.NewLogin(d.rdb, auth.NewUsers(d.db), d.signer, loginSender(d), auth.LoginConfig{
		KeyPrefix: d.cfg.KeyPrefix, CodeTTL: d.cfg.Web.CodeTTL, Resend: d.cfg.Web.Resend,
		MaxCodes: d.cfg.Web.MaxCodes, MaxTries: d.cfg.Web.MaxTries, TokenTTL: d.cfg.TokenTTL,
		Admins: d.cfg.Web.AdminPhones, Versions: d.versions,
	}, d.log)
	byAddr := ratelimit.Middleware
	tokenOnly := d.guard.Middleware()

	r.GET("/healthz", d.health.live)
	r.GET("/readyz", d.health.ready)

	if d.cfg.Web.Page {
		site, err := web.New()
		if err != nil {
			panic(err) // the files are compiled in: only a broken build lands here
		}
		r.GET("/", site.Page)
		r.HEAD("/", site.Page)
		r.GET("/admin", site.AdminPage)
		r.HEAD("/admin", site.AdminPage)
		r.GET("/static/*file", site.Static)
		r.HEAD("/static/*file", site.Static)
		r.GET("/docs", site.APIPage)
	}
	apiDocs, err := web.NewDocs(docs.OpenAPI)
	if err != nil {
		panic(err) // the document is compiled in and tested: only a broken build lands here
	}
	r.GET("/openapi.yaml", apiDocs.YAML)
	r.GET("/openapi.json", apiDocs.JSON)

	r.POST("/api/v1/auth/code", byAddr(lim.codeIP, clientAddr), login.RequestCode)
	r.POST("/api/v1/auth/login", byAddr(lim.loginIP, clientAddr), login.SignIn)

	// The sale is public, so the page shows it before a login.
	r.GET("/api/v1/vouchers", d.vouchers.List)
	r.GET("/api/v1/vouchers/:id", d.vouchers.Show)
	// A draw's result: a small status every entrant's page polls, the
	// buyer's own entry, the list a page at a time; each limited per
	// address as purchases are, and bounded in the database connections
	// it holds (draw.Pages).
	pages := draw.NewPages(d.db, draw.PagesConfig{}, d.log)
	drawByAddr := byAddr(lim.drawIP, clientAddr)
	r.GET("/api/v1/vouchers/:id/draw", drawByAddr, pages.Status)
	r.GET("/api/v1/vouchers/:id/draw/entries", drawByAddr, pages.Entries)
	r.GET("/api/v1/vouchers/:id/draw/me", drawByAddr, tokenOnly, pages.Mine)

	// The address limit runs before the token is checked, so a flood costs
	// no signature checks; the user limit needs the token's user.
	r.POST("/api/v1/vouchers/:id/orders", byAddr(lim.purchaseIP, clientAddr), tokenOnly,
		ratelimit.Middleware(lim.purchaseUser, userKey), d.vouchers.Purchase)

	api := r.Group("/api/v1", tokenOnly)
	api.POST("/vouchers", auth.RequireAdmin(), d.vouchers.Create)
	api.GET("/orders/:id", d.orders.Show)
	api.POST("/orders/:id/cancel", d.orders.Cancel)
	api.POST("/orders/:id/pay", d.payments.Pay)
	api.POST("/orders/:id/redeem", auth.RequireAdmin(), d.orders.Redeem)
	api.POST("/orders/:id/refund", auth.RequireAdmin(), d.payments.Refund)
	api.GET("/admin/refunds", auth.RequireAdmin(), d.payments.Refunds)
	api.POST("/admin/payments/:id/refunded", auth.RequireAdmin(), d.payments.MarkRefunded)
	api.POST("/admin/redeem", auth.RequireAdmin(), d.orders.RedeemCode)
	api.GET("/admin/orders", auth.RequireAdmin(), d.orders.Search)
	api.GET("/admin/figures", auth.RequireAdmin(), d.orders.Figures)
	api.POST("/admin/users/:id/revoke-tokens", auth.RequireAdmin(), auth.RevokeTokens(d.versions, d.log))
	// The payment gateway's callback: no token, its signature is checked.
	r.POST("/api/v1/payments/notify", d.payments.Notify)
	api.GET("/users/me/orders", d.orders.Mine)
}

// addWorkerRoutes lists the main listener's surface on an instance with
// SECKILL_ROLE=worker: liveness and readiness (Redis, the database and the
// schema: what the worker writes with) for an orchestrator to probe.
func addWorkerRoutes(r *gin.Engine, h *health) {
	r.GET("/healthz", h.live)
	r.GET("/readyz", h.ready)
}

// limits are the in-process token buckets; nil ones allow everything.
type limits struct {
	purchaseUser, purchaseIP, codeIP, loginIP, drawIP *ratelimit.Limiter
}

func newLimits(w webConfig) limits {
	if !w.RateLimit {
		return limits{}
	}
	return limits{
		purchaseUser: ratelimit.New(w.PurchaseUser, nil),
		purchaseIP:   ratelimit.New(w.PurchaseIP, nil),
		codeIP:       ratelimit.New(w.CodeIP, nil),
		loginIP:      ratelimit.New(w.LoginIP, nil),
		drawIP:       ratelimit.New(w.DrawIP, nil),
	}
}

// clientAddr keys the per-address limits: the client's address as the
// trusted proxies tell it (SECKILL_TRUSTED_PROXIES), an IPv6 one by its
// /64.
func clientAddr(c *gin.Context) string { return ratelimit.AddrKey(c.ClientIP()) }

func userKey(c *gin.Context) string {
	if id := auth.From(c).UserID; id > 0 {
		return strconv.FormatInt(id, 10)
	}
	return ""
}

// loginSender is the configured delivery of login codes; nil (codes are
// refused with 503 login_unavailable) when it is off.
func loginSender(d deps) auth.Sender {
	switch d.cfg.Web.LoginSender {
	case "console":
		w := d.stdout
		if w == nil {
			w = os.Stdout
		}
		return &auth.ConsoleSender{W: w}
	case "file":
		return &auth.OutboxSender{Path: d.cfg.Web.LoginOutbox}
	case "webhook":
		s, err := auth.NewWebhookSender(d.cfg.Web.webhook())
		if err != nil {
			panic(fmt.Sprintf("webhook sender passed validation but was refused: %v", err))
		}
		return s
	}
	return nil
}
