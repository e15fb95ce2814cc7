package main

import (
	"errors"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/failover"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// admin serves the operator routes. They listen on their own address
// (loopback by default), never behind nginx, and still need an admin token:
// loopback keeps out other machines, not other users or processes of this
// one.
type admin struct {
	dead   *order.DeadLetters
	warmer *voucher.Warmer
	// watcher writes back what a failover of the database lost (repair).
	watcher *failover.Watcher
	// health is the instance's readiness; /admin/readyz shows what failed.
	health *health
}

// addAdminRoutes lists the admin listener's surface.
func addAdminRoutes(r *gin.Engine, guard *auth.Guard, a *admin) {
	ops := r.Group("/admin", guard.Middleware(), auth.RequireAdmin())
	ops.GET("/dlq", a.listDLQ)
	ops.POST("/dlq/:id/replay", a.replay)
	ops.GET("/reconcile", a.reconcile)
	ops.POST("/reconcile", a.repair)
	ops.GET("/readyz", a.readyz)

	// Profiles of the running process, behind the admin token like the
	// rest: they show the command line, memory contents by allocation site,
	// and a CPU profile or trace costs the sale CPU for as long as it is
	// asked to run. They stay on (no switch to restart with) because they
	// are wanted when a live sale misbehaves.
	prof := r.Group("/debug/pprof", guard.Middleware(), auth.RequireAdmin())
	prof.GET("/", gin.WrapF(pprof.Index))
	prof.GET("/cmdline", gin.WrapF(pprof.Cmdline))
	prof.GET("/profile", gin.WrapF(pprof.Profile))
	prof.GET("/symbol", gin.WrapF(pprof.Symbol))
	prof.GET("/trace", gin.WrapF(pprof.Trace))
	prof.GET("/:name", func(c *gin.Context) { pprof.Handler(c.Param("name")).ServeHTTP(c.Writer, c.Request) })
}

func (a *admin) listDLQ(c *gin.Context) {
	limit, before := 50, int64(0)
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 500 {
			apierr.BadRequest(c, "limit must be between 1 and 500")
			return
		}
		limit = n
	}
	if s := c.Query("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			apierr.BadRequest(c, "before must be a positive id")
			return
		}
		before = n
	}
	ds, err := a.dead.List(c.Request.Context(), limit, before)
	if err != nil {
		apierr.Unavailable(c, "unavailable", err.Error())
		return
	}
	c.JSON(http.StatusOK, gin.H{"dead_letters": ds})
}

func (a *admin) replay(c *gin.Context) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return
	}
	d, err := a.dead.Replay(c.Request.Context(), id)
	var held *voucher.PurchasedError
	switch {
	case err == nil:
		c.JSON(http.StatusAccepted, gin.H{"dead_letter": d, "status": "pending"})
	case errors.Is(err, order.ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "not_found", "no dead letter has this id")
	case errors.Is(err, order.ErrInFlight):
		apierr.Abort(c, http.StatusConflict, "in_flight", "the order's message is still being handled and will decide; nothing was sent again")
	case errors.Is(err, order.ErrNotReplayable):
		apierr.Abort(c, http.StatusConflict, "not_replayable", "this dead letter holds no order to send again (undecodable, or its order id belongs to another order)")
	case errors.As(err, &held):
		c.AbortWithStatusJSON(http.StatusConflict, apierr.Body{Code: "already_purchased", Message: "the buyer holds another order", OrderID: held.OrderID})
	case errors.Is(err, voucher.ErrSoldOut):
		apierr.Abort(c, http.StatusConflict, "sold_out", "no stock left to replay into")
	case errors.Is(err, voucher.ErrEnded), errors.Is(err, voucher.ErrNotStarted):
		apierr.Abort(c, http.StatusConflict, "outside_sale", "the sale window is closed")
	default:
		apierr.Unavailable(c, "unavailable", err.Error())
	}
}

func (a *admin) reconcile(c *gin.Context) {
	diffs, err := a.warmer.Reconcile(c.Request.Context())
	if err != nil {
		apierr.Unavailable(c, "unavailable", err.Error())
		return
	}
	c.JSON(http.StatusOK, gin.H{"consistent": len(diffs) == 0, "differences": diffs})
}

// repair writes back what the database lost and the sale's Redis still
// holds ("api reconcile --repair" in the embedded mode), then reconciles.
func (a *admin) repair(c *gin.Context) {
	rep, err := a.watcher.Repair(c.Request.Context())
	switch {
	case errors.Is(err, failover.ErrRestored):
		apierr.Abort(c, http.StatusConflict, "database_restored", err.Error())
		return
	case err != nil:
		apierr.Unavailable(c, "unavailable", err.Error())
		return
	}
	diffs, err := a.warmer.Reconcile(c.Request.Context())
	if err != nil {
		apierr.Unavailable(c, "unavailable", err.Error())
		return
	}
	c.JSON(http.StatusOK, gin.H{"repaired": rep, "consistent": len(diffs) == 0, "differences": diffs})
}

// readyz is the readiness probe with its details: each check, and what
// failed (masters that do not answer, cluster states, shards not loaded).
func (a *admin) readyz(c *gin.Context) { a.health.detailed(c) }
