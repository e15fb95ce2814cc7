package main

import (
	"cmp"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"seckill/internal/auth"
	"seckill/internal/ratelimit"
)

// webConfig holds the settings of the browser-facing features: login,
// the web page and rate limits. The README's settings table lists them.
type webConfig struct {
	Page bool // SECKILL_WEB: serve the shop page at /

	// RateLimit switches every in-process limit below on or off
	// (SECKILL_RATE_LIMIT); load tests turn it off.
	RateLimit    bool
	PurchaseUser ratelimit.Rule // SECKILL_LIMIT_PURCHASE_USER
	PurchaseIP   ratelimit.Rule // SECKILL_LIMIT_PURCHASE_IP
	CodeIP       ratelimit.Rule // SECKILL_LIMIT_CODE_IP
	LoginIP      ratelimit.Rule // SECKILL_LIMIT_LOGIN_IP
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

// defaultTrustedProxies are loopback and the private ranges: nginx on the
// same host or on the deployment's private network. An instance that
// faces clients directly sets SECKILL_TRUSTED_PROXIES=none.
const defaultTrustedProxies = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"

func loadWebConfig(getenv func(string) string) (webConfig, []string) {
	var errs []string
	str := func(name, def string) string { return cmp.Or(strings.TrimSpace(getenv(name)), def) }
	onOff := func(name string, def bool) bool {
		switch s := strings.ToLower(strings.TrimSpace(getenv(name))); s {
		case "":
			return def
		case "on", "true", "1", "yes":
			return true
		case "off", "false", "0", "no":
			return false
		}
		errs = append(errs, name+" must be on or off")
		return def
	}
	rule := func(name, def string) ratelimit.Rule {
		r, err := ratelimit.ParseRule(str(name, def))
		if err != nil {
			errs = append(errs, name+": "+err.Error())
		}
		return r
	}
	dur := func(name string, def, lo, hi time.Duration) time.Duration {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return def
		}
		d, err := time.ParseDuration(s)
		if err != nil || d < lo || d > hi {
			errs = append(errs, fmt.Sprintf("%s must be a duration from %s to %s", name, lo, hi))
		}
		return d
	}
	num := func(name string, def, lo, hi int) int {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return def
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			errs = append(errs, fmt.Sprintf("%s must be an integer from %d to %d", name, lo, hi))
		}
		return n
	}
	list := func(name, def string) []string {
		var out []string
		for f := range strings.SplitSeq(str(name, def), ",") {
			if f = strings.TrimSpace(f); f != "" && f != "none" {
				out = append(out, f)
			}
		}
		return out
	}

	// Codes on stdout are fine for the embedded developer's mode; with a
	// real database stdout is collected as logs, so the default is off.
	defSender := "console"
	if strings.TrimSpace(getenv("SECKILL_MYSQL_DSN")) != "" {
		defSender = "off"
	}
	w := webConfig{
		Page:         onOff("SECKILL_WEB", true),
		RateLimit:    onOff("SECKILL_RATE_LIMIT", true),
		PurchaseUser: rule("SECKILL_LIMIT_PURCHASE_USER", "5/1s"),
		// Per address only a flood guard: carrier NAT puts thousands of
		// phones behind one address. The per-user limit is the precise one.
		PurchaseIP:     rule("SECKILL_LIMIT_PURCHASE_IP", "2000/1s"),
		CodeIP:         rule("SECKILL_LIMIT_CODE_IP", "20/1m"),
		LoginIP:        rule("SECKILL_LIMIT_LOGIN_IP", "60/1m"),
		TrustedProxies: list("SECKILL_TRUSTED_PROXIES", defaultTrustedProxies),
		LoginSender:    str("SECKILL_LOGIN_SENDER", defSender),
		LoginOutbox:    str("SECKILL_LOGIN_OUTBOX", ""),
		WebhookURL:     str("SECKILL_LOGIN_WEBHOOK_URL", ""),
		WebhookSecret:  getenv("SECKILL_LOGIN_WEBHOOK_SECRET"),
		WebhookTimeout: dur("SECKILL_LOGIN_WEBHOOK_TIMEOUT", 5*time.Second, 100*time.Millisecond, time.Minute),
		CodeTTL:        dur("SECKILL_LOGIN_CODE_TTL", 5*time.Minute, 30*time.Second, time.Hour),
		Resend:         dur("SECKILL_LOGIN_RESEND", time.Minute, time.Second, time.Hour),
		MaxCodes:       num("SECKILL_LOGIN_MAX_CODES", 10, 1, 1000),
		MaxTries:       num("SECKILL_LOGIN_MAX_TRIES", 5, 1, 20),
		AdminPhones:    list("SECKILL_ADMIN_PHONES", ""),
	}
	switch w.LoginSender {
	case "console", "off":
	case "file":
		if w.LoginOutbox == "" {
			errs = append(errs, "SECKILL_LOGIN_SENDER=file needs SECKILL_LOGIN_OUTBOX (a file path)")
		}
	case "webhook":
		if _, err := auth.NewWebhookSender(w.webhook()); err != nil {
			errs = append(errs, "SECKILL_LOGIN_SENDER=webhook: "+err.Error()+" (SECKILL_LOGIN_WEBHOOK_URL, SECKILL_LOGIN_WEBHOOK_SECRET)")
		}
	default:
		errs = append(errs, "SECKILL_LOGIN_SENDER must be console, file, webhook or off")
	}
	for _, p := range w.TrustedProxies {
		if _, err := netip.ParsePrefix(p); err != nil {
			if _, err := netip.ParseAddr(p); err != nil {
				errs = append(errs, fmt.Sprintf("SECKILL_TRUSTED_PROXIES: %q is neither an address nor a CIDR", p))
			}
		}
	}
	for _, p := range w.AdminPhones {
		if !auth.ValidPhone(p) {
			errs = append(errs, fmt.Sprintf("SECKILL_ADMIN_PHONES: %q is not an E.164 number such as +8613800138000", p))
		}
	}
	return w, errs
}

// webhook is the configuration of SECKILL_LOGIN_SENDER=webhook.
func (w webConfig) webhook() auth.WebhookConfig {
	return auth.WebhookConfig{URL: w.WebhookURL, Secret: []byte(w.WebhookSecret), Timeout: w.WebhookTimeout}
}
