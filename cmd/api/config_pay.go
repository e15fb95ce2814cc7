package main

import (
	"time"

	"seckill/internal/redact"
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

// paySettings are the rows of the settings table for the order lifecycle.
var paySettings = []setting{
	{name: "SECKILL_PAY_WINDOW", def: "15m",
		doc:   "how long the buyer of a priced voucher has to pay; then the order is cancelled and its unit goes back on sale",
		field: func(c *config) value { return duration{p: &c.Pay.Window, lo: time.Second} }},
	{name: "SECKILL_EXPIRY_SWEEP", def: "30s",
		doc:   "how often each worker expires overdue unpaid orders and puts back on sale the units Redis did not take back yet",
		field: func(c *config) value { return positive(&c.Pay.Sweep) }},
	{name: "SECKILL_PAY_PROVIDER", def: "dev", withDSN: "off",
		doc:   "dev (paying succeeds at once), webhook (a payment gateway) or off (paying answers 503, priced vouchers are refused)",
		field: func(c *config) value { return oneOf{&c.Pay.Provider, []string{"dev", "webhook", "off"}} }},
	{name: "SECKILL_PAY_GATEWAY_URL", show: redact.URL,
		doc:   "where SECKILL_PAY_PROVIDER=webhook creates payments (http or https)",
		field: func(c *config) value { return text{&c.Pay.GatewayURL, nil} }},
	{name: "SECKILL_PAY_WEBHOOK_SECRET", secret: true,
		doc:   "the HMAC-SHA256 key shared with the payment gateway, at least 16 bytes; never logged",
		field: func(c *config) value { return text{&c.Pay.Secret, nil} }},
	{name: "SECKILL_PAY_NOTIFY_URL", show: redact.URL,
		doc:   "the public address of POST /api/v1/payments/notify, sent to the gateway with each payment",
		field: func(c *config) value { return text{&c.Pay.NotifyURL, httpURL} }},
	{name: "SECKILL_PAY_NOTIFY_TOLERANCE", def: "5m",
		doc:   "how far a gateway notification's timestamp may be from now",
		field: func(c *config) value { return positive(&c.Pay.Tolerance) }},
}

// check refuses a webhook provider that lacks its secret or gateway.
func (p payConfig) check() []string {
	if p.Provider != "webhook" {
		return nil
	}
	var errs []string
	if len(p.Secret) < 16 {
		errs = append(errs, "SECKILL_PAY_WEBHOOK_SECRET must be at least 16 characters with SECKILL_PAY_PROVIDER=webhook")
	}
	if httpURL(p.GatewayURL) != nil || p.GatewayURL == "" {
		errs = append(errs, "SECKILL_PAY_GATEWAY_URL must be an http(s) URL with SECKILL_PAY_PROVIDER=webhook")
	}
	return errs
}
