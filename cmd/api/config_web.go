package main

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"seckill/internal/auth"
	"seckill/internal/ratelimit"
	"seckill/internal/redact"
)

// webConfig holds the settings of the browser-facing features: login,
// the web page and rate limits. The settings table of docs/operating.md
// lists them.
type webConfig struct {
	Page bool // SECKILL_WEB: serve the shop page at /

	// RateLimit switches every in-process limit below on or off
	// (SECKILL_RATE_LIMIT); load tests turn it off.
	RateLimit    bool
	PurchaseUser ratelimit.Rule // SECKILL_LIMIT_PURCHASE_USER
	PurchaseIP   ratelimit.Rule // SECKILL_LIMIT_PURCHASE_IP
	CodeIP       ratelimit.Rule // SECKILL_LIMIT_CODE_IP
	LoginIP      ratelimit.Rule // SECKILL_LIMIT_LOGIN_IP
	DrawIP       ratelimit.Rule // SECKILL_LIMIT_DRAW_IP
	// TrustedProxies may set X-Forwarded-For / X-Real-IP: the client
	// address of the per-address limits (SECKILL_TRUSTED_PROXIES).
	TrustedProxies []string

	// LoginSender is console, file, webhook or off (SECKILL_LOGIN_SENDER);
	// file appends to LoginOutbox (SECKILL_LOGIN_OUTBOX); webhook posts to
	// an SMS gateway (SECKILL_LOGIN_WEBHOOK_*). The secret is never logged.
	LoginSender    string
	LoginOutbox    string
	WebhookURL     string
	WebhookSecret  string
	WebhookTimeout time.Duration
	CodeTTL        time.Duration // SECKILL_LOGIN_CODE_TTL
	Resend         time.Duration // SECKILL_LOGIN_RESEND
	MaxCodes       int           // SECKILL_LOGIN_MAX_CODES, per phone per day
	MaxTries       int           // SECKILL_LOGIN_MAX_TRIES
	AdminPhones    []string      // SECKILL_ADMIN_PHONES
}

// defaultTrustedProxies are loopback and every private range: nginx on the
// same host or anywhere on the deployment's private network, with no
// setting. The price: every other host on those networks (another pod, a
// neighbouring VM) is trusted too, and can name any client address, a new
// one per request, for the per-address limits. A deployment narrows it to
// its nginx's addresses (the Helm chart does); an instance that faces
// clients directly sets SECKILL_TRUSTED_PROXIES=none.
const defaultTrustedProxies = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"

// webSettings are the rows of the settings table for login, the web page
// and the rate limits.
var webSettings = []setting{
	{name: "SECKILL_WEB", def: "on",
		doc:   "serve the shop page at / and /static/",
		field: func(c *config) value { return onOff{&c.Web.Page} }},
	{name: "SECKILL_RATE_LIMIT", def: "on",
		doc:   "every in-process limit below; off for load tests",
		field: func(c *config) value { return onOff{&c.Web.RateLimit} }},
	{name: "SECKILL_LIMIT_PURCHASE_USER", def: "5/1s",
		doc:   "purchases per user: N/duration (burst N, refilled over the duration) or off",
		field: func(c *config) value { return rule{&c.Web.PurchaseUser} }},
	// Per address only a flood guard: carrier NAT puts thousands of phones
	// behind one address. The per-user limit is the precise one.
	{name: "SECKILL_LIMIT_PURCHASE_IP", def: "2000/1s",
		doc:   "purchases per client address (a flood guard)",
		field: func(c *config) value { return rule{&c.Web.PurchaseIP} }},
	{name: "SECKILL_LIMIT_CODE_IP", def: "20/1m",
		doc:   "login-code requests per client address",
		field: func(c *config) value { return rule{&c.Web.CodeIP} }},
	{name: "SECKILL_LIMIT_LOGIN_IP", def: "60/1m",
		doc:   "login attempts per client address",
		field: func(c *config) value { return rule{&c.Web.LoginIP} }},
	// A draw's pages poll twice a second each: as for purchases, only a
	// flood guard per address (a thousand pages behind one carrier NAT).
	{name: "SECKILL_LIMIT_DRAW_IP", def: "2000/1s",
		doc:   "requests of a draw's pages (its status, the buyer's entry, its list) per client address (a flood guard)",
		field: func(c *config) value { return rule{&c.Web.DrawIP} }},
	{name: "SECKILL_TRUSTED_PROXIES", def: defaultTrustedProxies,
		doc:   "addresses or CIDRs allowed to set X-Forwarded-For / X-Real-IP (the client address of every per-address limit); the default trusts every private range, so any host there can name any address: narrow it to nginx's addresses; none for an instance facing clients",
		field: func(c *config) value { return list{&c.Web.TrustedProxies, addrOrPrefix} }},
	// Codes on stdout are fine for the embedded developer's mode; with a
	// real database stdout is collected as logs, so the default is off.
	{name: "SECKILL_LOGIN_SENDER", def: "console", withDSN: "off",
		doc: "how login codes are sent: console (stdout, outside the log), file, webhook or off",
		field: func(c *config) value {
			return oneOf{&c.Web.LoginSender, []string{"console", "file", "webhook", "off"}}
		}},
	{name: "SECKILL_LOGIN_OUTBOX",
		doc:   "the file SECKILL_LOGIN_SENDER=file appends codes to",
		field: func(c *config) value { return text{&c.Web.LoginOutbox, nil} }},
	{name: "SECKILL_LOGIN_WEBHOOK_URL", show: redact.URL,
		doc:   "where SECKILL_LOGIN_SENDER=webhook posts each code (http or https)",
		field: func(c *config) value { return text{&c.Web.WebhookURL, nil} }},
	{name: "SECKILL_LOGIN_WEBHOOK_SECRET", secret: true,
		doc:   "the HMAC-SHA256 key shared with the SMS gateway, at least 16 bytes; never logged",
		field: func(c *config) value { return text{&c.Web.WebhookSecret, nil} }},
	{name: "SECKILL_LOGIN_WEBHOOK_TIMEOUT", def: "5s",
		doc: "per attempt; 5xx answers and network errors get two more attempts",
		field: func(c *config) value {
			return duration{p: &c.Web.WebhookTimeout, lo: 100 * time.Millisecond, hi: time.Minute}
		}},
	{name: "SECKILL_LOGIN_CODE_TTL", def: "5m",
		doc:   "how long a login code is valid",
		field: func(c *config) value { return duration{p: &c.Web.CodeTTL, lo: 30 * time.Second, hi: time.Hour} }},
	{name: "SECKILL_LOGIN_RESEND", def: "1m",
		doc:   "wait before another code may be sent to a phone",
		field: func(c *config) value { return duration{p: &c.Web.Resend, lo: time.Second, hi: time.Hour} }},
	{name: "SECKILL_LOGIN_MAX_CODES", def: "10",
		doc:   "codes per phone per day for client addresses that never logged in to it",
		field: func(c *config) value { return integer{&c.Web.MaxCodes, 1, 1000} }},
	{name: "SECKILL_LOGIN_MAX_TRIES", def: "5",
		doc:   "wrong tries that lock a code",
		field: func(c *config) value { return integer{&c.Web.MaxTries, 1, 20} }},
	{name: "SECKILL_ADMIN_PHONES", def: "", show: countPhones,
		doc:   "comma-separated E.164 phones that log in with the admin role",
		field: func(c *config) value { return list{&c.Web.AdminPhones, phone} }},
}

// loadWebConfig reads the web rows of the settings table alone.
func loadWebConfig(getenv func(string) string) (webConfig, []string) {
	var c config
	errs := loadSettings(webSettings, getenv, &c)
	return c.Web, append(errs, c.Web.check()...)
}

// check refuses a login sender that lacks what it needs.
func (w webConfig) check() []string {
	switch w.LoginSender {
	case "file":
		if w.LoginOutbox == "" {
			return []string{"SECKILL_LOGIN_SENDER=file needs SECKILL_LOGIN_OUTBOX (a file path)"}
		}
	case "webhook":
		if _, err := auth.NewWebhookSender(w.webhook()); err != nil {
			return []string{"SECKILL_LOGIN_SENDER=webhook: " + err.Error() + " (SECKILL_LOGIN_WEBHOOK_URL, SECKILL_LOGIN_WEBHOOK_SECRET)"}
		}
	}
	return nil
}

func addrOrPrefix(p string) error {
	if _, err := netip.ParsePrefix(p); err != nil {
		if _, err := netip.ParseAddr(p); err != nil {
			return fmt.Errorf("lists %q, which is neither an address nor a CIDR", p)
		}
	}
	return nil
}

func phone(p string) error {
	if !auth.ValidPhone(p) {
		return fmt.Errorf("lists %q, which is not an E.164 number such as +8613800138000", p)
	}
	return nil
}

// webhook is the configuration of SECKILL_LOGIN_SENDER=webhook.
func (w webConfig) webhook() auth.WebhookConfig {
	return auth.WebhookConfig{URL: w.WebhookURL, Secret: []byte(w.WebhookSecret), Timeout: w.WebhookTimeout}
}

// countPhones logs how many admin phones there are, never the numbers.
func countPhones(s string) string {
	if s == "" {
		return "none"
	}
	return fmt.Sprintf("%d phones", strings.Count(s, ",")+1)
}
