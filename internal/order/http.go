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

// Statuses an order can be in.
const (
	StatusPending = "pending" // accepted, not yet in the database
	StatusCreated = "created" // written to the database
	StatusFailed  = "failed"  // dead-lettered, with a reason
)

// HTTP serves the order routes.
type HTTP struct {
	store *Store
	rdb   redis.UniversalClient
	keys  voucher.Keys
	log   *slog.Logger
}

// NewHTTP returns the order handlers.
func NewHTTP(store *Store, rdb redis.UniversalClient, keys voucher.Keys, log *slog.Logger) *HTTP {
	return &HTTP{store: store, rdb: rdb, keys: keys, log: log}
}

// View is an order as the API shows it. Ids are strings: they exceed the
// integers JavaScript represents exactly.
type View struct {
	OrderID    int64      `json:"order_id,string"`
	UserID     int64      `json:"user_id"`
	VoucherID  int64      `json:"voucher_id"`
	Status     string     `json:"status"`
	Reason     string     `json:"reason,omitempty"`
	AcceptedAt *time.Time `json:"accepted_at,omitempty"`
	CreatedAt  *time.Time `json:"created_at,omitempty"`
}

func createdView(o Order) View {
	acc, cre := o.AcceptedAt.UTC(), o.CreatedAt.UTC()
	return View{OrderID: o.ID, UserID: o.UserID, VoucherID: o.VoucherID, Status: StatusCreated, AcceptedAt: &acc, CreatedAt: &cre}
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
		return createdView(o), nil
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
	for _, o := range os {
		out = append(out, createdView(o))
	}
	for _, d := range ds {
		out = append(out, failedView(d))
	}
	c.JSON(http.StatusOK, gin.H{"orders": out})
}
