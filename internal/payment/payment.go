// Package payment takes the money for orders awaiting payment: a payment
// is created for an order through a provider (dev, which succeeds at once,
// or a webhook gateway that notifies the service later), and a payment
// that succeeds pays its order in the same transaction, or, when the order
// can no longer take it (cancelled, expired, paid by another payment), is
// recorded as needing a refund. The order is never revived.
package payment

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Statuses of a payment (sql/*/0004_order_lifecycle.sql), and what moves
// a payment from one to the next (moves, in ledger.go):
//
//	from          to            when                                      records
//	-             created       the buyer presses Pay                     created_at
//	created       succeeded     the money comes and pays its order        succeeded_at
//	created       needs_refund  the money comes and its order cannot      succeeded_at, refund_requested_at,
//	                            take it (late, duplicate)                 refund_reason
//	succeeded     needs_refund  an admin refunds the order it paid        refund_requested_at,
//	                            (order_refunded)                          refund_reason
//	needs_refund  refunded      an admin marks the money returned         refunded_at
//
// So every payment whose money must go back to its buyer is needs_refund,
// whatever the cause, and Refunds lists them in one place.
const (
	StatusCreated     = "created"      // waiting for the gateway's notification
	StatusSucceeded   = "succeeded"    // the money came and paid its order
	StatusNeedsRefund = "needs_refund" // the money came and must go back (RefundReason says why)
	StatusRefunded    = "refunded"     // an admin gave the money back
)

// Why a payment's money must go back (the refund_reason column,
// sql/*/0005_payment_refunds.sql).
const (
	ReasonLate          = "late"           // it came after its order was cancelled
	ReasonDuplicate     = "duplicate"      // it came for an order another payment paid
	ReasonOrderRefunded = "order_refunded" // an admin refunded the order it paid
)

// Providers, as Config.Provider and the payments.provider column name them.
const (
	ProviderOff     = "off"
	ProviderDev     = "dev"
	ProviderWebhook = "webhook"
)

// Outcomes of a payment notification, as Observer hears them and the
// notify route answers them (refused is answered with an error code).
const (
	OutcomeSucceeded   = "succeeded"
	OutcomeNeedsRefund = "needs_refund"
	OutcomeDuplicate   = "duplicate"
	OutcomeRefused     = "refused"
)

// Payment is a row of the payments table.
type Payment struct {
	ID        int64     `gorm:"primaryKey"`
	OrderID   int64     `gorm:"column:order_id"`
	Provider  string    `gorm:"column:provider"`
	Reference string    `gorm:"column:reference"`
	Amount    int64     `gorm:"column:amount"`
	Status    string    `gorm:"column:status"`
	CreatedAt time.Time `gorm:"column:created_at"`
	UpdatedAt time.Time `gorm:"column:updated_at"`
	// SucceededAt is when the money came (succeeded or needs_refund).
	SucceededAt *time.Time `gorm:"column:succeeded_at"`
	// RefundRequestedAt is when the money became owed to the buyer, and
	// RefundReason why (needs_refund, then refunded).
	RefundRequestedAt *time.Time `gorm:"column:refund_requested_at"`
	RefundReason      *string    `gorm:"column:refund_reason"`
	RefundedAt        *time.Time `gorm:"column:refunded_at"`
}

// TableName is the table of sql/*/0004_order_lifecycle.sql.
func (Payment) TableName() string { return "payments" }

// notification is a gateway's notification seen once: its primary key
// (provider, notification_id) makes a second delivery a duplicate.
type notification struct {
	Provider       string    `gorm:"column:provider;primaryKey"`
	NotificationID string    `gorm:"column:notification_id;primaryKey"`
	Reference      string    `gorm:"column:reference"`
	ReceivedAt     time.Time `gorm:"column:received_at"`
}

func (notification) TableName() string { return "payment_notifications" }

var (
	// ErrNotFound means no payment has the reference or id.
	ErrNotFound = errors.New("payment not found")
	// ErrAmountMismatch means a notification's amount is not the payment's.
	ErrAmountMismatch = errors.New("amount differs from the payment's")
	// ErrDeadlinePassed means the order's pay deadline passed: no new
	// payment is taken for it (its expiry is due).
	ErrDeadlinePassed = errors.New("the order's pay deadline has passed")
	// ErrWrongState means a payment is not in the state a move needs
	// (StateError says which it is in).
	ErrWrongState = errors.New("payment is not in the state this needs")
)

// StateError is ErrWrongState with the status the payment is in.
type StateError struct {
	Status string
}

func (e *StateError) Error() string { return "payment is " + e.Status }

func (e *StateError) Unwrap() error { return ErrWrongState }

// Observer hears what payments do, for metrics.
type Observer interface {
	// Payment: a notification (or the dev provider's success) ended with
	// this outcome: succeeded, needs_refund, duplicate or refused.
	Payment(outcome string)
	// Moved: an order made this move (pay, refund) now, in a payment's
	// transaction, named as order.Action.String says.
	Moved(move string)
}

type nopObserver struct{}

func (nopObserver) Payment(string) {}
func (nopObserver) Moved(string)   {}

// Config sets up the payment handlers.
type Config struct {
	// Provider is dev, webhook, or off ("" is off: paying answers 503).
	Provider string
	// GatewayURL is where the webhook provider creates payments.
	GatewayURL string
	// NotifyURL, when set, is sent to the gateway with each payment: the
	// public address of POST /api/v1/payments/notify.
	NotifyURL string
	// Secret is shared with the gateway: it signs what is sent to it and
	// checks its notifications. At least 16 bytes with the webhook
	// provider; never logged.
	Secret []byte
	// Tolerance is how far a notification's timestamp may be from now,
	// either way; default 5m.
	Tolerance time.Duration
	// Timeout bounds a call to the gateway; default 5s.
	Timeout time.Duration
	// Client calls the gateway; default a client with no timeout of its
	// own (Timeout bounds each call).
	Client *http.Client
	// Observer hears the outcomes; nil hears nothing.
	Observer Observer
	// Now is the clock, default time.Now.
	Now func() time.Time
}

// withDefaults checks cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	cfg.Provider = cmp.Or(cfg.Provider, ProviderOff)
	switch cfg.Provider {
	case ProviderOff, ProviderDev:
	case ProviderWebhook:
		if len(cfg.Secret) < 16 {
			return cfg, errors.New("payment webhook secret must be at least 16 bytes")
		}
		if !webURL(cfg.GatewayURL) {
			return cfg, errors.New("payment gateway url must be an absolute http or https url")
		}
		if cfg.NotifyURL != "" && !webURL(cfg.NotifyURL) {
			return cfg, errors.New("payment notify url must be an absolute http or https url")
		}
	default:
		return cfg, fmt.Errorf("payment provider %q: want dev, webhook or off", cfg.Provider)
	}
	cfg.Tolerance = cmp.Or(cfg.Tolerance, 5*time.Minute)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg, nil
}

// webURL reports an absolute http or https URL.
func webURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}
