package main

import (
	"cmp"
	"net/url"
	"strings"
	"time"
)

// payConfig is the order lifecycle's settings: the pay window, the sweeper
// and the payment provider.
type payConfig struct {
	// Window is how long a buyer has to pay an order of a priced voucher.
	Window time.Duration // SECKILL_PAY_WINDOW
	// Sweep is how often each worker looks for overdue unpaid orders and
	// units not yet back on sale in Redis.
	Sweep time.Duration // SECKILL_EXPIRY_SWEEP
	// Provider is dev (paying succeeds at once), webhook (a payment
	// gateway) or off (paying answers 503). Default dev in the embedded
	// mode, off with a database server: a free payment provider is never
	// on in production by accident.
	Provider string // SECKILL_PAY_PROVIDER
	// Secret signs what goes to the gateway and checks its notifications.
	Secret string // SECKILL_PAY_WEBHOOK_SECRET
	// GatewayURL is where payments are created with the webhook provider.
	GatewayURL string // SECKILL_PAY_GATEWAY_URL
	// NotifyURL is the public address of POST /api/v1/payments/notify,
	// sent to the gateway with each payment; empty: the gateway knows it.
	NotifyURL string // SECKILL_PAY_NOTIFY_URL
	// Tolerance is how far a notification's timestamp may be from now.
	Tolerance time.Duration // SECKILL_PAY_NOTIFY_TOLERANCE
}

// loadPayConfig reads the pay settings; embedded says whether the database
// is the embedded SQLite.
func loadPayConfig(getenv func(string) string, embedded bool, dur func(string, time.Duration) time.Duration) (payConfig, []string) {
	var errs []string
	def := "off"
	if embedded {
		def = "dev"
	}
	p := payConfig{
		Window:     dur("SECKILL_PAY_WINDOW", 15*time.Minute),
		Sweep:      dur("SECKILL_EXPIRY_SWEEP", 30*time.Second),
		Provider:   cmp.Or(strings.TrimSpace(getenv("SECKILL_PAY_PROVIDER")), def),
		Secret:     getenv("SECKILL_PAY_WEBHOOK_SECRET"),
		GatewayURL: strings.TrimSpace(getenv("SECKILL_PAY_GATEWAY_URL")),
		NotifyURL:  strings.TrimSpace(getenv("SECKILL_PAY_NOTIFY_URL")),
		Tolerance:  dur("SECKILL_PAY_NOTIFY_TOLERANCE", 5*time.Minute),
	}
	switch p.Provider {
	case "dev", "off":
	case "webhook":
		if len(p.Secret) < 16 {
			errs = append(errs, "SECKILL_PAY_WEBHOOK_SECRET must be at least 16 characters with SECKILL_PAY_PROVIDER=webhook")
		}
		if u, err := url.Parse(p.GatewayURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, "SECKILL_PAY_GATEWAY_URL must be an http(s) URL with SECKILL_PAY_PROVIDER=webhook")
		}
	default:
		errs = append(errs, "SECKILL_PAY_PROVIDER must be dev, webhook or off")
	}
	if u, err := url.Parse(p.NotifyURL); p.NotifyURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		errs = append(errs, "SECKILL_PAY_NOTIFY_URL must be an http(s) URL")
	}
	if p.Window < time.Second {
		errs = append(errs, "SECKILL_PAY_WINDOW must be at least 1s")
	}
	return p, errs
}
