package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAddressLimitsKeyIPv6By64: every per-address limit of the instances
// (purchases, login codes, logins) counts an IPv6 client by its /64: a
// second address of the same /64 finds the bucket the first emptied, the
// next /64 a bucket of its own; IPv4 addresses each have their own.
func TestAddressLimitsKeyIPv6By64(t *testing.T) {
	t.Parallel()
	r, _ := routeEngines(t, map[string]string{
		"SECKILL_LIMIT_PURCHASE_IP": "1/1m", "SECKILL_LIMIT_CODE_IP": "1/1m", "SECKILL_LIMIT_LOGIN_IP": "1/1m",
		"SECKILL_TRUSTED_PROXIES": "none",
	})
	for _, c := range []struct {
		name, path, body string
		passed           int // the answer behind the limit: no token, or a bad phone
	}{
		{"purchases", "/api/v1/vouchers/1/orders", "", http.StatusUnauthorized},
		{"login codes", "/api/v1/auth/code", `{"phone":"12"}`, http.StatusUnprocessableEntity},
		{"logins", "/api/v1/auth/login", `{"phone":"12","code":"123456"}`, http.StatusUnprocessableEntity},
	} {
		from := func(remote string) int {
			req := httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.RemoteAddr = remote
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			return w.Code
		}
		for _, step := range []struct {
			remote string
			want   int
		}{
			{"[2001:db8:40:1::1]:5000", c.passed},
			{"[2001:db8:40:1:8000::2]:5001", http.StatusTooManyRequests}, // the same /64
			{"[2001:db8:40:2::1]:5000", c.passed},                        // the next /64
			{"192.0.2.10:5000", c.passed},
			{"192.0.2.11:5000", c.passed},
			{"192.0.2.10:5001", http.StatusTooManyRequests},
		} {
			if got := from(step.remote); got != step.want {
				t.Errorf("%s: from %s answered %d, want %d", c.name, step.remote, got, step.want)
			}
		}
	}
}
