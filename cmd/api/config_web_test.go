package main

import (
	"strings"
	"testing"
	"time"

	"seckill/internal/ratelimit"
)

func TestWebConfigDefaults(t *testing.T) {
	t.Parallel()
	w, errs := loadWebConfig(func(string) string { return "" })
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if !w.Page || !w.RateLimit || w.LoginSender != "console" || w.CodeTTL != 5*time.Minute || w.MaxTries != 5 {
		t.Fatalf("defaults: %+v", w)
	}
	if w.PurchaseUser != (ratelimit.Rule{Burst: 5, Per: time.Second}) {
		t.Fatalf("purchase per user %v", w.PurchaseUser)
	}
	// With a real database stdout is collected as logs: no console codes.
	w, _ = loadWebConfig(func(k string) string {
		if k == "SECKILL_MYSQL_DSN" {
			return "u:p@tcp(db:3306)/seckill"
		}
		return ""
	})
	if w.LoginSender != "off" {
		t.Fatalf("sender with MySQL: %q, want off", w.LoginSender)
	}
}

func TestWebConfigRefused(t *testing.T) {
	t.Parallel()
	for k, v := range map[string]string{
		"SECKILL_WEB": "maybe", "SECKILL_RATE_LIMIT": "2", "SECKILL_LIMIT_PURCHASE_USER": "5",
		"SECKILL_LIMIT_PURCHASE_IP": "x/1s", "SECKILL_LIMIT_CODE_IP": "1/0s", "SECKILL_LIMIT_LOGIN_IP": "-1/1m",
		"SECKILL_TRUSTED_PROXIES": "nginx.local", "SECKILL_LOGIN_SENDER": "sms", "SECKILL_LOGIN_CODE_TTL": "1s",
		"SECKILL_LOGIN_RESEND": "forever", "SECKILL_LOGIN_MAX_CODES": "0", "SECKILL_LOGIN_MAX_TRIES": "100",
		"SECKILL_ADMIN_PHONES": "13800138000",
	} {
		_, errs := loadWebConfig(func(name string) string {
			if name == k {
				return v
			}
			return ""
		})
		if len(errs) != 1 || !strings.Contains(errs[0], k) {
			t.Errorf("%s=%q: errors %v, want one naming %s", k, v, errs, k)
		}
	}
	if _, errs := loadWebConfig(func(k string) string {
		return map[string]string{"SECKILL_LOGIN_SENDER": "file"}[k]
	}); len(errs) != 1 || !strings.Contains(errs[0], "SECKILL_LOGIN_OUTBOX") {
		t.Errorf("file sender without outbox: %v", errs)
	}
	w, errs := loadWebConfig(func(k string) string {
		return map[string]string{"SECKILL_RATE_LIMIT": "off", "SECKILL_TRUSTED_PROXIES": "none", "SECKILL_ADMIN_PHONES": "+8613900000000, +15550000001"}[k]
	})
	if len(errs) > 0 || w.RateLimit || len(w.TrustedProxies) != 0 || len(w.AdminPhones) != 2 {
		t.Errorf("off/none/two admins: %+v %v", w, errs)
	}
}
