package order

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/db"
)

// The shop's console: its staff find orders (by order id, voucher code or
// the buyer's phone), redeem a voucher by its code, and watch each
// voucher's sale. Admin routes all (cmd/api/routes.go).

// ByCode returns the order holding a voucher code, or ErrNotFound.
func (s *Store) ByCode(ctx context.Context, code string) (Order, error) {
	var o Order
	err := s.db.WithContext(ctx).Where("code = ?", code).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, fmt.Errorf("order of code: %w", ErrNotFound)
	}
	if err != nil {
		return Order{}, fmt.Errorf("order of code: %w", err)
	}
	return o, nil
}

// Found is an order a search found, with its buyer's phone ("" for a buyer
// known only by an operator's token).
type Found struct {
	Order
	Phone string `gorm:"column:phone"`
}

// Search finds orders, newest first, at most limit: of one voucher when
// voucherID is not 0, and matching q when it is not "": an order id, a
// voucher code (NormalizeCode) or a buyer's phone as people type it: with
// or without its country code, spaced or dashed (auth.PhoneForms; a
// national number is the home country's). The phone is the users table's
// (internal/auth), joined here. What q can be is looked up first,
// each through a key the tables have (orders' id and code, users' phone,
// orders' user_id), rather than one OR over the join of every order.
func (s *Store) Search(ctx context.Context, voucherID int64, q string, limit int) ([]Found, error) {
	tx := s.db.WithContext(ctx).Table("orders o").Select("o.*, u.phone").
		Joins("LEFT JOIN users u ON u.id = o.user_id")
	if voucherID != 0 {
		tx = tx.Where("o.voucher_id = ?", voucherID)
	}
	if q = strings.TrimSpace(q); q != "" {
		ids, err := s.matching(ctx, q, limit)
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			return nil, nil
		}
		tx = tx.Where("o.id IN ?", ids)
	}
	// Newest first: of one voucher by acceptance, which walks the index
	// on (voucher_id, accepted_at) backwards from its end; of all, by id.
	order := "o.id DESC"
	if voucherID != 0 {
		order = "o.accepted_at DESC, o.id DESC"
	}
	var out []Found
	if err := tx.Order(order).Limit(limit).Find(&out).Error; err != nil {
		return nil, fmt.Errorf("search orders: %w", err)
	}
	return out, nil
}

// orderOfCodeQuery finds the order holding a voucher code, on the unique
// key on code.
const orderOfCodeQuery = "SELECT id FROM orders WHERE code = ?"

// matching returns the ids of the orders q can name: the order of that
// id, the order of that code, the newest limit orders of the buyers of
// the numbers that phone can be.
func (s *Store) matching(ctx context.Context, q string, limit int) ([]int64, error) {
	var ids []int64
	look := func(query string, args ...any) error {
		var found []int64
		if err := s.db.WithContext(ctx).Raw(query, args...).Scan(&found).Error; err != nil {
			return fmt.Errorf("search orders: %w", err)
		}
		ids = append(ids, found...)
		return nil
	}
	if code, ok := NormalizeCode(q); ok {
		if err := look(orderOfCodeQuery, code); err != nil {
			return nil, err
		}
	}
	if phones := auth.PhoneForms(q, auth.HomeCountry); len(phones) > 0 {
		if err := look("SELECT o.id FROM users u JOIN orders o ON o.user_id = u.id WHERE u.phone IN ? ORDER BY o.id DESC LIMIT ?", phones, limit); err != nil {
			return nil, err
		}
	}
	if id, err := strconv.ParseInt(q, 10, 64); err == nil && id > 0 {
		if err := look("SELECT id FROM orders WHERE id = ?", id); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

// Figures are a voucher's sale at a glance, all from the database: its
// stock left (units no written order holds; orders accepted and not yet
// written are still in it), its orders by state and what the paid and used
// ones brought in (from the order counters, counts.go), and the purchases
// per second over the last FiguresWindow (orders by the time they were
// accepted, read from the index on voucher and acceptance time).
type Figures struct {
	VoucherID  int64  `json:"voucher_id"`
	Title      string `json:"title"`
	Price      int64  `json:"price"`
	FaceValue  int64  `json:"face_value"`
	TotalStock int64  `json:"total_stock"`
	StockLeft  int64  `json:"stock_left"`
	// Sold is the units written orders hold: awaiting payment, paid, used.
	Sold            int64   `json:"sold"`
	AwaitingPayment int64   `json:"awaiting_payment"`
	Paid            int64   `json:"paid"`
	Used            int64   `json:"used"`
	Cancelled       int64   `json:"cancelled"`
	Expired         int64   `json:"expired"`
	Refunded        int64   `json:"refunded"`
	Revenue         int64   `json:"revenue"`
	PerSecond       float64 `json:"purchases_per_second"`
}

// FiguresWindow is how far back purchases per second look.
const FiguresWindow = 10 * time.Second

// recentPurchasesQuery counts the orders of vouchers accepted since a
// time, each voucher's from the end of its range of the index on
// (voucher_id, accepted_at), read from the index alone.
const recentPurchasesQuery = "SELECT voucher_id, COUNT(*) AS n FROM orders WHERE voucher_id IN ? AND accepted_at >= ? GROUP BY voucher_id"

// Figures returns every voucher's figures, newest voucher first, at most
// limit, counted at now.
func (s *Store) Figures(ctx context.Context, now time.Time, limit int) ([]Figures, error) {
	tx := s.db.WithContext(ctx)
	var vs []struct {
		ID, Price, FaceValue, TotalStock, Stock int64
		Title                                   string
	}
	if err := tx.Raw("SELECT id, title, price, face_value, total_stock, stock FROM vouchers ORDER BY id DESC LIMIT ?", limit).Scan(&vs).Error; err != nil {
		return nil, fmt.Errorf("list vouchers: %w", err)
	}
	if len(vs) == 0 {
		return []Figures{}, nil
	}
	ids := make([]int64, len(vs))
	for i, v := range vs {
		ids[i] = v.ID
	}
	kept, err := readCounts(ctx, s.db, ids)
	if err != nil {
		return nil, err
	}
	since := db.Millis(now.Add(-FiguresWindow)) // the index's range, not every order
	var recent []struct{ VoucherID, N int64 }
	if err := tx.Raw(recentPurchasesQuery, ids, since).Scan(&recent).Error; err != nil {
		return nil, fmt.Errorf("count recent orders of %d vouchers: %w", len(ids), err)
	}
	out := make([]Figures, len(vs))
	at := make(map[int64]*Figures, len(vs))
	for i, v := range vs {
		out[i] = Figures{VoucherID: v.ID, Title: v.Title, Price: v.Price, FaceValue: v.FaceValue, TotalStock: v.TotalStock, StockLeft: v.Stock}
		at[v.ID] = &out[i]
	}
	for k, t := range kept {
		at[k.VoucherID].count(k.Status, k.Reason, t.N, t.Amount)
	}
	for _, r := range recent {
		at[r.VoucherID].PerSecond = float64(r.N) / FiguresWindow.Seconds()
	}
	return out, nil
}

// count adds n orders in a state, and their amount when the shop keeps it.
func (f *Figures) count(status, reason string, n, amount int64) {
	switch status {
	case StatusAwaitingPayment:
		f.AwaitingPayment += n
	case StatusPaid:
		f.Paid += n
		f.Revenue += amount
	case StatusUsed:
		f.Used += n
		f.Revenue += amount
	case StatusCancelled:
		if reason == CancelExpired {
			f.Expired += n
		} else {
			f.Cancelled += n
		}
	case StatusRefunded:
		f.Refunded += n
	}
	if live(status) {
		f.Sold += n
	}
}

// FoundView is an order a search found, as the console shows it.
type FoundView struct {
	View
	Phone string `json:"phone,omitempty"`
}

// Search answers the orders matching ?q= (an order id, a voucher code or a
// phone), of ?voucher_id= when given, newest first, at most ?limit= (1 to
// 200, default 50). An admin route.
func (h *HTTP) Search(c *gin.Context) {
	limit, ok := queryInt(c, "limit", 50, 1, 200)
	if !ok {
		return
	}
	vid, ok := queryInt(c, "voucher_id", 0, 1, 1<<62)
	if !ok {
		return
	}
	q := c.Query("q")
	if len(q) > 64 {
		apierr.BadRequest(c, "q is at most 64 characters")
		return
	}
	found, err := h.store.Search(c.Request.Context(), int64(vid), q, limit)
	if err != nil {
		h.log.Error("search orders failed", "err", err)
		apierr.Unavailable(c, "unavailable", "orders cannot be searched right now")
		return
	}
	out := make([]FoundView, len(found))
	now := h.now()
	for i, f := range found {
		out[i] = FoundView{View: ViewOf(f.Order, now), Phone: f.Phone}
	}
	c.JSON(http.StatusOK, gin.H{"orders": out})
}

// queryInt reads an optional integer query parameter between lo and hi;
// def when absent. On anything else it answers 400 and reports false.
func queryInt(c *gin.Context, name string, def, lo, hi int) (int, bool) {
	s := c.Query(name)
	if s == "" {
		return def, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		apierr.BadRequest(c, fmt.Sprintf("%s must be between %d and %d", name, lo, hi))
		return 0, false
	}
	return n, true
}

// Figures answers every voucher's sale figures (Store.Figures), newest
// voucher first. An admin route.
func (h *HTTP) Figures(c *gin.Context) {
	limit, ok := queryInt(c, "limit", 50, 1, 200)
	if !ok {
		return
	}
	now := h.now()
	fs, err := h.store.Figures(c.Request.Context(), now, limit)
	if err != nil {
		h.log.Error("sale figures failed", "err", err)
		apierr.Unavailable(c, "unavailable", "the figures cannot be read right now")
		return
	}
	c.JSON(http.StatusOK, gin.H{"vouchers": fs, "window_seconds": int(FiguresWindow / time.Second), "at": now.UTC()})
}

// redeemRequest is the body of the redeem-by-code route.
type redeemRequest struct {
	Code string `json:"code"`
}

// codeUsed is the 409 answer to a code redeemed before.
type codeUsed struct {
	Code    string    `json:"code"`
	Message string    `json:"message"`
	UsedAt  time.Time `json:"used_at"`
	Order   View      `json:"order"`
}

// RedeemCode is the shop's cashier redeeming a voucher by its code (an
// admin route): 200 with the order now used; 409 code_used, with when,
// for a code redeemed before (a repeat included: a code is good once);
// 409 wrong_state for an order refunded; 404 code_not_found for a code no
// order holds.
func (h *HTTP) RedeemCode(c *gin.Context) {
	var req redeemRequest
	if !apierr.DecodeJSON(c, 1<<10, &req) {
		return
	}
	code, ok := NormalizeCode(req.Code)
	if !ok {
		apierr.Abort(c, http.StatusNotFound, "code_not_found", "no voucher has this code")
		return
	}
	ctx := c.Request.Context()
	o, err := h.store.ByCode(ctx, code)
	if err == nil {
		var moved bool
		o, moved, err = h.life.Do(ctx, Redeem, o.ID)
		if err == nil && !moved {
			h.refuseUsed(c, o)
			return
		}
	}
	var wrong *StateError
	switch {
	case errors.Is(err, ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "code_not_found", "no voucher has this code")
		return
	case errors.As(err, &wrong) && wrong.Status == StatusUsed:
		h.refuseUsed(c, o)
		return
	case errors.As(err, &wrong):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "cannot redeem a voucher whose order is "+wrong.Status)
		return
	case err != nil:
		h.log.Error("redeem by code failed", "err", err)
		apierr.Unavailable(c, "unavailable", "the voucher cannot be redeemed right now")
		return
	}
	c.JSON(http.StatusOK, ViewOf(o, h.now()))
}

// refuseUsed answers 409 code_used for an order redeemed before.
func (h *HTTP) refuseUsed(c *gin.Context, o Order) {
	var at time.Time
	if o.UsedAt != nil {
		at = o.UsedAt.UTC()
	}
	c.AbortWithStatusJSON(http.StatusConflict, codeUsed{
		Code: "code_used", Message: "this voucher was redeemed at " + at.Format(time.RFC3339), UsedAt: at, Order: ViewOf(o, h.now()),
	})
}
