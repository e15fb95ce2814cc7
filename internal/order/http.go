package order

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/voucher"
)

// Statuses an order has before it is written, or instead: the written
// ones are the lifecycle's (lifecycle.go).
const (
	StatusPending = "pending" // accepted, not yet in the database
	StatusFailed  = "failed"  // dead-lettered, with a reason
)

// HTTP serves the order routes.
type HTTP struct {
	store *Store
	life  *Lifecycle
	rdb   redis.UniversalClient
	keys  voucher.Keys
	log   *slog.Logger
	now   func() time.Time
}

// NewHTTP returns the order handlers.
func NewHTTP(store *Store, life *Lifecycle, rdb redis.UniversalClient, keys voucher.Keys, log *slog.Logger) *HTTP {
	return &HTTP{store: store, life: life, rdb: rdb, keys: keys, log: log, now: time.Now}
}

// View is an order as the API shows it. Ids are strings: they exceed the
// integers JavaScript represents exactly.
type View struct {
	OrderID   int64  `json:"order_id,string"`
	UserID    int64  `json:"user_id"`
	VoucherID int64  `json:"voucher_id"`
	Status    string `json:"status"`
	// Reason is a failed order's dead-letter reason.
	Reason string `json:"reason,omitempty"`
	// CancelReason is buyer or expired, on a cancelled order.
	CancelReason string `json:"cancel_reason,omitempty"`
	// Amount is what the buyer pays (cents), on a written order.
	Amount *int64 `json:"amount,omitempty"`
	// PayDeadline and PaySecondsLeft are set while the order awaits
	// payment; the seconds are counted by the server, so a client's clock
	// does not matter.
	PayDeadline    *time.Time `json:"pay_deadline,omitempty"`
	PaySecondsLeft *int64     `json:"pay_seconds_left,omitempty"`
	AcceptedAt     *time.Time `json:"accepted_at,omitempty"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	PaidAt         *time.Time `json:"paid_at,omitempty"`
	UsedAt         *time.Time `json:"used_at,omitempty"`
	CancelledAt    *time.Time `json:"cancelled_at,omitempty"`
	RefundedAt     *time.Time `json:"refunded_at,omitempty"`
	// Code is the voucher code of a paid order, what its buyer shows at the
	// shop to use it (code.go).
	Code string `json:"code,omitempty"`
	// NeedsRefund: money is owed back to the buyer (a payment arrived after
	// the order was cancelled, a second payment paid it again, or an admin
	// refunded the order) and no admin has marked it returned yet.
	NeedsRefund bool `json:"needs_refund,omitempty"`
}

// ViewOf is a written order as the API shows it, at now.
func ViewOf(o Order, now time.Time) View {
	acc, cre := o.AcceptedAt.UTC(), o.CreatedAt.UTC()
	v := View{
		OrderID: o.ID, UserID: o.UserID, VoucherID: o.VoucherID, Status: o.Status, Amount: &o.Amount,
		AcceptedAt: &acc, CreatedAt: &cre,
		PaidAt: utc(o.PaidAt), UsedAt: utc(o.UsedAt), CancelledAt: utc(o.CancelledAt), RefundedAt: utc(o.RefundedAt),
	}
	if o.CancelReason != nil {
		v.CancelReason = *o.CancelReason
	}
	if o.Code != nil && (o.Status == StatusPaid || o.Status == StatusUsed) {
		v.Code = *o.Code
	}
	if o.Status == StatusAwaitingPayment && o.PayDeadline != nil {
		v.PayDeadline = utc(o.PayDeadline)
		left := int64(max(o.PayDeadline.Sub(now), 0) / time.Second)
		v.PaySecondsLeft = &left
	}
	return v
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func failedView(d DeadLetter) View {
	v := View{Status: StatusFailed, Reason: d.Reason}
	if d.OrderID != nil {
		v.OrderID = *d.OrderID
	}
	if d.UserID != nil {
		v.UserID = *d.UserID
	}
	if d.VoucherID != nil {
		v.VoucherID = *d.VoucherID
	}
	return v
}

// Show answers an order's status to its owner or an admin.
func (h *HTTP) Show(c *gin.Context) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return
	}
	v, err := h.status(c.Request.Context(), id)
	if errors.Is(err, ErrNotFound) {
		apierr.Abort(c, http.StatusNotFound, "order_not_found", "no order has this id")
		return
	}
	if err != nil {
		h.log.Error("order status failed", "order_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the order cannot be read right now")
		return
	}
	caller := auth.From(c)
	if v.UserID != caller.UserID && !caller.Admin() {
		// Someone else's order looks like no order at all.
		apierr.Abort(c, http.StatusNotFound, "order_not_found", "no order has this id")
		return
	}
	c.JSON(http.StatusOK, v)
}

// status looks in the database, then the pending index, then the database
// again: the worker removes an order from the index only after its commit,
// so an order missing from both reads never existed.
func (h *HTTP) status(ctx context.Context, id int64) (View, error) {
	if v, err := h.written(ctx, id); !errors.Is(err, ErrNotFound) {
		return v, err
	}
	pipe := h.rdb.Pipeline()
	field := strconv.FormatInt(id, 10)
	cmds := make([]*redis.StringCmd, h.keys.Shards())
	for s := range cmds {
		cmds[s] = pipe.HGet(ctx, h.keys.Pending(s), field)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	for _, cmd := range cmds {
		who, err := cmd.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			// A shard that cannot be read may hold the order: unknown is
			// not "no such order". (On a cluster the pipeline's own error
			// is one shard's, and another's not-found may hide it.)
			return View{}, err
		}
		u, vch, _ := strings.Cut(who, ":")
		uid, err1 := strconv.ParseInt(u, 10, 64)
		vid, err2 := strconv.ParseInt(vch, 10, 64)
		if err1 == nil && err2 == nil {
			return View{OrderID: id, UserID: uid, VoucherID: vid, Status: StatusPending}, nil
		}
	}
	return h.written(ctx, id)
}

// written finds an order, or its dead letter, in the database.
func (h *HTTP) written(ctx context.Context, id int64) (View, error) {
	o, err := h.store.Get(ctx, id)
	if err == nil {
		v := ViewOf(o, h.now())
		// An order with nothing to pay has no payment; one awaiting payment
		// owes nothing yet (I10): neither costs a query.
		if o.Amount > 0 && o.Status != StatusAwaitingPayment {
			v.NeedsRefund, err = h.store.NeedsRefund(ctx, o.ID)
		}
		return v, err
	}
	if !errors.Is(err, ErrNotFound) {
		return View{}, err
	}
	d, err := h.store.DeadLetterOf(ctx, id)
	if err != nil {
		return View{}, err
	}
	return failedView(d), nil
}

// Mine lists the caller's orders: written ones and failed ones.
func (h *HTTP) Mine(c *gin.Context) {
	limit := 50
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 200 {
			apierr.BadRequest(c, "limit must be between 1 and 200")
			return
		}
		limit = n
	}
	os, ds, err := h.store.ByUser(c.Request.Context(), auth.From(c).UserID, limit)
	if err != nil {
		h.log.Error("list orders failed", "err", err)
		apierr.Unavailable(c, "unavailable", "orders cannot be listed right now")
		return
	}
	out := make([]View, 0, len(os)+len(ds))
	now := h.now()
	for _, o := range os {
		out = append(out, ViewOf(o, now))
	}
	for _, d := range ds {
		out = append(out, failedView(d))
	}
	c.JSON(http.StatusOK, gin.H{"orders": out})
}

// Cancel is the buyer cancelling their unpaid order: its unit goes back on
// sale.
func (h *HTTP) Cancel(c *gin.Context) { h.move(c, Cancel) }

// Redeem is the shop marking a paid voucher used (an admin route).
func (h *HTTP) Redeem(c *gin.Context) { h.move(c, Redeem) }

// move makes an action on the order named in the path and answers the
// order as it is after it. A repeat answers the same; a wrong state 409
// wrong_state.
func (h *HTTP) move(c *gin.Context, a Action) {
	id, ok := h.Written(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	o, _, err := h.life.Do(ctx, a, id)
	var wrong *StateError
	switch {
	case errors.As(err, &wrong):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "cannot "+a.String()+" an order that is "+wrong.Status)
		return
	case errors.Is(err, ErrUnitNotBack):
		// The move is committed; the sweeper puts the unit back on sale.
		h.log.Warn("order moved, its unit not back on sale yet", "order_id", id, "action", a.String(), "err", err)
	case err != nil:
		h.log.Error("order move failed", "order_id", id, "action", a.String(), "err", err)
		apierr.Unavailable(c, "unavailable", "the order cannot be changed right now")
		return
	}
	c.JSON(http.StatusOK, ViewOf(o, h.now()))
}

// Written reads the path's order id for a route that changes a written
// order: the caller must own it or be an admin. It answers 404
// order_not_found (someone else's order looks like no order at all), 409
// order_pending while the order is accepted and not written yet, 409
// wrong_state for a failed order, 503 when it cannot tell, and reports
// false; or reports the id of a written order.
func (h *HTTP) Written(c *gin.Context) (int64, bool) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return 0, false
	}
	ctx := c.Request.Context()
	caller := auth.From(c)
	v, err := h.status(ctx, id)
	if err == nil && v.UserID != caller.UserID && !caller.Admin() {
		err = ErrNotFound // someone else's order looks like no order at all
	}
	switch {
	case errors.Is(err, ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "order_not_found", "no order has this id")
		return 0, false
	case err != nil:
		h.log.Error("order status failed", "order_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the order cannot be read right now")
		return 0, false
	case v.Status == StatusPending:
		apierr.Abort(c, http.StatusConflict, "order_pending", "the order is accepted and not written yet; try again in a moment")
		return 0, false
	case v.Status == StatusFailed:
		apierr.Abort(c, http.StatusConflict, "wrong_state", "the order failed: "+v.Reason)
		return 0, false
	}
	return id, true
}
