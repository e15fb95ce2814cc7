package payment

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/order"
)

// maxNotifyBody bounds a notification's body, read whole before its
// signature is checked.
const maxNotifyBody = 64 << 10

// HTTP serves the payment routes.
type HTTP struct {
	ledger   *ledger
	orders   *order.HTTP
	provider Provider // nil: payments are off
	secret   []byte
	cfg      Config
	obs      Observer
	log      *slog.Logger
}

// New returns the payment handlers for cfg's provider. orders answers
// for the order named in a pay route (ownership, pending); life moves the
// order to paid in the payment's transaction. It owns none of them.
func New(db *gorm.DB, orders *order.HTTP, life *order.Lifecycle, cfg Config, log *slog.Logger) (*HTTP, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	h := &HTTP{ledger: &ledger{db: db, life: life, now: cfg.Now}, orders: orders, cfg: cfg, obs: cfg.Observer, log: log}
	switch cfg.Provider {
	case ProviderDev:
		h.provider = dev{}
	case ProviderWebhook:
		h.provider = newWebhook(cfg)
		h.secret = cfg.Secret
	}
	return h, nil
}

// View is a payment as the API shows it.
type View struct {
	PaymentID int64  `json:"payment_id"`
	OrderID   int64  `json:"order_id,string"`
	Provider  string `json:"provider"`
	Reference string `json:"reference"`
	Amount    int64  `json:"amount"`
	Status    string `json:"status"`
	// PayURL is the gateway's page where the buyer pays (webhook
	// provider, while the payment is created).
	PayURL      string     `json:"pay_url,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	SucceededAt *time.Time `json:"succeeded_at,omitempty"`
	// RefundRequestedAt and RefundReason: since when and why the money
	// is owed back (late, duplicate, order_refunded).
	RefundRequestedAt *time.Time `json:"refund_requested_at,omitempty"`
	RefundReason      string     `json:"refund_reason,omitempty"`
	RefundedAt        *time.Time `json:"refunded_at,omitempty"`
}

// ViewOf is a payment as the API shows it.
func ViewOf(p Payment) View {
	v := View{
		PaymentID: p.ID, OrderID: p.OrderID, Provider: p.Provider, Reference: p.Reference, Amount: p.Amount,
		Status: p.Status, CreatedAt: p.CreatedAt.UTC(), SucceededAt: utc(p.SucceededAt),
		RefundRequestedAt: utc(p.RefundRequestedAt), RefundedAt: utc(p.RefundedAt),
	}
	if p.RefundReason != nil {
		v.RefundReason = *p.RefundReason
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

// PayAnswer is the answer of the pay route.
type PayAnswer struct {
	Order   order.View `json:"order"`
	Payment View       `json:"payment"`
}

// Pay is the buyer paying their order awaiting payment: the order's open
// payment, or a new one, is started with the provider. The dev provider
// takes the money at once and the order is paid in the answer; a gateway
// answers the page where the buyer pays (pay_url), and its notification
// pays the order later.
func (h *HTTP) Pay(c *gin.Context) {
	if h.provider == nil {
		apierr.Unavailable(c, "payment_unavailable", "payments are turned off on this service")
		return
	}
	id, ok := h.orders.Written(c)
	if !ok {
		return
	}
	ctx := c.Request.Context()
	p, _, err := h.ledger.open(ctx, h.provider.Name(), id)
	if err != nil {
		h.notOpened(c, id, err)
		return
	}
	co, err := h.provider.Start(ctx, p)
	if err != nil {
		// The payment stays created: paying again starts it again.
		h.log.Warn("payment not started", "order_id", id, "payment_id", p.ID, "provider", p.Provider, "err", err)
		apierr.Unavailable(c, "payment_unavailable", "the payment gateway cannot take the payment now; try again in a moment")
		return
	}
	opened := p.ID
	p, o, err := h.collect(ctx, id, p, co)
	if err != nil {
		h.log.Error("settle payment failed", "order_id", id, "payment_id", opened, "err", err)
		apierr.Unavailable(c, "unavailable", "the payment cannot be made right now")
		return
	}
	view := order.ViewOf(o, h.cfg.Now())
	view.NeedsRefund = p.Status == StatusNeedsRefund // its money goes back, whatever the order did
	pv := ViewOf(p)
	if p.Status == StatusCreated {
		pv.PayURL = co.PayURL
	}
	c.JSON(http.StatusOK, PayAnswer{Order: view, Payment: pv})
}

// notOpened answers a Pay whose payment could not be opened: a second
// press of Pay on an order paid already answers as the first; an order in
// another state, or past its deadline, is 409 wrong_state.
func (h *HTTP) notOpened(c *gin.Context, id int64, err error) {
	var wrong *order.StateError
	switch {
	case errors.As(err, &wrong) && (wrong.Status == order.StatusPaid || wrong.Status == order.StatusUsed):
		h.paidAlready(c, id)
	case errors.As(err, &wrong):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "cannot pay an order that is "+wrong.Status)
	case errors.Is(err, ErrDeadlinePassed):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "the order's pay deadline has passed")
	case errors.Is(err, order.ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "order_not_found", "no order has this id")
	default:
		h.log.Error("open payment failed", "order_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the payment cannot be made right now")
	}
}

// collect settles the money a provider took with the call (dev) as a
// notification of the payment itself would, and returns the payment and
// the order as they are after it; for a gateway, which takes the money
// later, the payment as opened and the order as it is.
func (h *HTTP) collect(ctx context.Context, id int64, p Payment, co Checkout) (Payment, order.Order, error) {
	if !co.Succeeded {
		o, err := h.readOrder(ctx, id)
		return p, o, err
	}
	opened := p.ID
	v, p, o, err := h.ledger.settle(ctx, notice{provider: p.Provider, id: p.Reference, reference: p.Reference, amount: p.Amount})
	if err != nil {
		return p, o, err
	}
	h.heard(v)
	if v == settled {
		// A Pay at the same moment settled it: answer as it is now
		// (settle answers no payment for a duplicate).
		if p, err = h.ledger.get(ctx, opened); err != nil {
			return p, o, err
		}
		o, err = h.readOrder(ctx, id)
	}
	return p, o, err
}

// heard tells the observer what money arriving did.
func (h *HTTP) heard(v verdict) {
	h.obs.Payment(v.outcome())
	if v == pays {
		h.obs.Moved(order.Pay.String())
	}
}

// paidAlready answers a Pay of an order a payment paid before with that
// order and payment, as the first Pay was answered; an order paid
// otherwise (written paid: nothing to pay) is 409 wrong_state.
func (h *HTTP) paidAlready(c *gin.Context, id int64) {
	ctx := c.Request.Context()
	var ps []Payment
	err := h.ledger.db.WithContext(ctx).Where("order_id = ? AND status = ?", id, StatusSucceeded).Order("id").Limit(1).Find(&ps).Error
	var o order.Order
	if err == nil && len(ps) == 1 {
		o, err = h.readOrder(ctx, id)
	}
	switch {
	case err != nil:
		h.log.Error("read paid order failed", "order_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the payment cannot be read right now")
	case len(ps) == 0:
		apierr.Abort(c, http.StatusConflict, "wrong_state", "the order has nothing to pay")
	default:
		c.JSON(http.StatusOK, PayAnswer{Order: order.ViewOf(o, h.cfg.Now()), Payment: ViewOf(ps[0])})
	}
}

func (h *HTTP) readOrder(ctx context.Context, id int64) (order.Order, error) {
	var o order.Order
	if err := h.ledger.db.WithContext(ctx).Where("id = ?", id).Take(&o).Error; err != nil {
		return o, fmt.Errorf("read order %d: %w", id, err)
	}
	return o, nil
}

// Notification is the JSON body a gateway posts to the notify route,
// signed like auth.Sign over its timestamp and the raw body.
type Notification struct {
	NotificationID string `json:"notification_id"`
	Reference      string `json:"reference"`
	Amount         int64  `json:"amount"`
	Status         string `json:"status"`
}

// Notify takes a gateway's notification that a payment succeeded. The
// signature and the timestamp are checked before anything is read from
// the body; a notification seen before is answered duplicate and changes
// nothing. The answer {"status": succeeded | needs_refund | duplicate}
// tells the gateway to stop delivering it; an error, to try again
// (503) or that it never will be taken (4xx).
func (h *HTTP) Notify(c *gin.Context) {
	if h.secret == nil {
		apierr.Unavailable(c, "payment_unavailable", "no payment gateway is set up on this service")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, maxNotifyBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.refuse(c, http.StatusRequestEntityTooLarge, "body_too_large", "the request body is too large")
			return
		}
		h.refuse(c, http.StatusBadRequest, "bad_request", "the body could not be read")
		return
	}
	if code, msg := h.authentic(c.GetHeader(auth.WebhookTimestampHeader), c.GetHeader(auth.WebhookSignatureHeader), body); code != "" {
		h.refuse(c, http.StatusUnauthorized, code, msg)
		return
	}
	n, ok := parseNotification(body)
	if !ok {
		h.refuse(c, http.StatusBadRequest, "bad_request", "the body must be one JSON object with notification_id, reference, amount and status succeeded")
		return
	}
	v, p, _, err := h.ledger.settle(c.Request.Context(), notice{provider: ProviderWebhook, id: n.NotificationID, reference: n.Reference, amount: n.Amount})
	switch {
	case errors.Is(err, ErrNotFound):
		h.refuse(c, http.StatusNotFound, "payment_not_found", "no payment has this reference")
		return
	case errors.Is(err, ErrAmountMismatch):
		h.log.Warn("payment notification refused: amount mismatch", "reference", n.Reference, "notification_id", n.NotificationID, "amount", n.Amount)
		h.refuse(c, http.StatusUnprocessableEntity, "amount_mismatch", "the amount is not the payment's")
		return
	case err != nil:
		h.log.Error("payment notification failed", "reference", n.Reference, "notification_id", n.NotificationID, "err", err)
		apierr.Unavailable(c, "unavailable", "the notification cannot be taken right now; deliver it again later")
		return
	}
	h.heard(v)
	if v == refunds {
		h.log.Warn("payment arrived for an order that cannot take it: needs a refund", "payment_id", p.ID, "order_id", p.OrderID, "reference", p.Reference)
	}
	c.JSON(http.StatusOK, gin.H{"status": v.outcome()})
}

func (h *HTTP) refuse(c *gin.Context, status int, code, message string) {
	h.obs.Payment(OutcomeRefused)
	apierr.Abort(c, status, code, message)
}

// authentic checks a notification's signature, then its timestamp, and
// returns the refusal's code and message, or "" when it is authentic.
func (h *HTTP) authentic(ts, sig string, body []byte) (code, message string) {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || !hmac.Equal([]byte(sig), []byte(auth.Sign(h.secret, ts, body))) {
		return "bad_signature", "the signature is missing or wrong"
	}
	age := h.cfg.Now().Sub(time.Unix(sec, 0))
	if age > h.cfg.Tolerance || age < -h.cfg.Tolerance {
		return "stale_notification", "the timestamp is too far from now"
	}
	return "", ""
}

// parseNotification decodes a notification: one JSON object, its ids
// within the columns' 64 characters, a non-negative amount, status
// succeeded.
func parseNotification(body []byte) (Notification, bool) {
	var n Notification
	if err := json.Unmarshal(body, &n); err != nil {
		return n, false
	}
	ok := n.NotificationID != "" && len(n.NotificationID) <= 64 && n.Reference != "" && len(n.Reference) <= 64 &&
		n.Amount >= 0 && n.Status == StatusSucceeded
	return n, ok
}

// Refund is an admin refunding a paid order before use (an admin route):
// the order moves to refunded and its unit goes back on sale, and the
// payment that paid it is owed back to the buyer (needs_refund, listed by
// Refunds until an admin marks it refunded), in one transaction. A repeat
// answers the same; an order in another state is 409 wrong_state.
func (h *HTTP) Refund(c *gin.Context) {
	id, ok := h.orders.Written(c)
	if !ok {
		return
	}
	o, moved, owed, err := h.ledger.refund(c.Request.Context(), id)
	var wrong *order.StateError
	switch {
	case errors.As(err, &wrong):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "cannot refund an order that is "+wrong.Status)
		return
	case errors.Is(err, order.ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "order_not_found", "no order has this id")
		return
	case errors.Is(err, order.ErrUnitNotBack):
		// The refund is committed; the sweeper puts the unit back on sale.
		h.log.Warn("order refunded, its unit not back on sale yet", "order_id", id, "err", err)
	case err != nil:
		h.log.Error("refund failed", "order_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the order cannot be changed right now")
		return
	}
	if moved {
		h.obs.Moved(order.Refund.String())
	}
	view := order.ViewOf(o, h.cfg.Now())
	view.NeedsRefund = owed
	c.JSON(http.StatusOK, view)
}

// Refunds lists the payments whose money the shop owes back (an admin
// route), the longest owed first: those that arrived after their order
// could no longer take them (late, duplicate) and those of refunded
// orders (order_refunded), until an admin marks them refunded.
func (h *HTTP) Refunds(c *gin.Context) {
	limit := 100
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 500 {
			apierr.BadRequest(c, "limit must be between 1 and 500")
			return
		}
		limit = n
	}
	ps, err := h.ledger.needingRefund(c.Request.Context(), limit)
	if err != nil {
		h.log.Error("list refunds failed", "err", err)
		apierr.Unavailable(c, "unavailable", "refunds cannot be listed right now")
		return
	}
	out := make([]View, 0, len(ps))
	for _, p := range ps {
		out = append(out, ViewOf(p))
	}
	c.JSON(http.StatusOK, gin.H{"payments": out})
}

// MarkRefunded records that the shop gave back the money of a payment
// needing a refund (an admin route): it leaves the Refunds list. A repeat
// answers the same.
func (h *HTTP) MarkRefunded(c *gin.Context) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return
	}
	p, err := h.ledger.markRefunded(c.Request.Context(), id)
	var wrong *StateError
	switch {
	case errors.Is(err, ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "payment_not_found", "no payment has this id")
		return
	case errors.As(err, &wrong):
		apierr.Abort(c, http.StatusConflict, "wrong_state", "cannot mark refunded a payment that is "+wrong.Status)
		return
	case err != nil:
		h.log.Error("mark payment refunded failed", "payment_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the payment cannot be changed right now")
		return
	}
	c.JSON(http.StatusOK, ViewOf(p))
}
