//go:build linux

package nginx

import (
	"net/http"
	"strings"
	"testing"

	"seckill/internal/testenv"
)

// TestSecurityHeaders: every answer, the instance's and nginx's own errors
// alike, carries nosniff, Referrer-Policy and, with a max-age set, HSTS,
// each once; Retry-After is nginx's on its own 429 and the instance's on
// the instance's 429. With max-age 0 there is no HSTS header.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	a := newStub(t, "a", "ok")
	start := func(upstream string) string {
		listen := "127.0.0.1:" + testenv.FreePort(t)
		v := vars(listen, upstream)
		v["SECKILL_NGINX_PURCHASE_RATE"], v["SECKILL_NGINX_PURCHASE_BURST"] = "1r/m", "1"
		v["SECKILL_NGINX_HSTS_MAX_AGE"] = "31536000"
		return startNginx(t, prefix(t, v), listen)
	}
	base, down := start(a.addr()), start("127.0.0.1:"+testenv.FreePort(t))

	once := func(what string, h http.Header, name, want string) {
		t.Helper()
		if got := h.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %s %q, want %q once", what, name, got, want)
		}
	}
	check := func(what string, got answer, status int, retryAfter string) {
		t.Helper()
		if got.status != status {
			t.Errorf("%s: status %d, want %d", what, got.status, status)
		}
		once(what, got.header, "X-Content-Type-Options", "nosniff")
		once(what, got.header, "Referrer-Policy", "no-referrer")
		once(what, got.header, "Strict-Transport-Security", "max-age=31536000")
		if retryAfter == "" {
			if ra := got.header.Values("Retry-After"); len(ra) > 0 {
				t.Errorf("%s: Retry-After %q, want none", what, ra)
			}
		} else {
			once(what, got.header, "Retry-After", retryAfter)
		}
	}
	check("the instance's answer", send(t, "GET", base+"/api/v1/vouchers/1", nil, nil), 200, "")
	check("the instance's 429", send(t, "GET", base+"/api/v1/limited", nil, nil), 429, "7")
	check("a purchase", send(t, "POST", base+purchase, nil, nil), 202, "")
	check("a purchase in the burst", send(t, "POST", base+purchase, nil, nil), 202, "")
	check("nginx's 429", send(t, "POST", base+purchase, nil, nil), 429, "1")
	check("nginx's 404", send(t, "GET", base+"/metrics", nil, nil), 404, "")
	check("nginx's 413", send(t, "POST", base+"/api/v1/vouchers", nil, strings.NewReader(strings.Repeat("x", 100<<10))), 413, "")
	check("nginx's 502", send(t, "GET", down+"/api/v1/vouchers/1", nil, nil), 502, "")

	// The default of the tests, as of plain-HTTP set-ups: no HSTS.
	listen := "127.0.0.1:" + testenv.FreePort(t)
	plain := startNginx(t, prefix(t, vars(listen, a.addr())), listen)
	if got := send(t, "GET", plain+"/api/v1/vouchers/1", nil, nil); got.header.Get("Strict-Transport-Security") != "" {
		t.Errorf("max-age 0: Strict-Transport-Security %q, want none", got.header.Get("Strict-Transport-Security"))
	}
}
