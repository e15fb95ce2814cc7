package main

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// clientFrom is an HTTP client whose connections leave from the loopback
// address ip (127.0.0.2, ...): another client, or a proxy, on this machine.
func clientFrom(t testing.TB, ip string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// TestDirectRequestLimitedByItsAddress: a client that reaches an instance
// straight from an address outside SECKILL_TRUSTED_PROXIES cannot pick
// its address for the per-address limits with X-Forwarded-For or
// X-Real-IP: a fresh forged address per request still draws from the
// bucket of its real one (127.0.0.1). Requests through a trusted proxy
// (127.0.0.2) are limited by the address the proxy names, each client its
// own bucket, apart from the direct client's.
func TestDirectRequestLimitedByItsAddress(t *testing.T) {
	t.Parallel()
	s := startWeb(t, map[string]string{
		"SECKILL_TRUSTED_PROXIES":   "10.9.9.9/32,127.0.0.2/32",
		"SECKILL_LIMIT_LOGIN_IP":    "2/1m",
		"SECKILL_LIMIT_PURCHASE_IP": "2/1m",
	})
	direct, proxy := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")
	type route struct {
		name, path, body string
		passed           int // the answer behind the limit: a bad phone, no token
	}
	send := func(c *http.Client, r route, hdr map[string]string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, s.base+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.name, r.path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, r := range []route{
		{"login", "/api/v1/auth/login", `{"phone":"12","code":"123456"}`, http.StatusUnprocessableEntity},
		{"purchase", "/api/v1/vouchers/1/orders", "", http.StatusUnauthorized},
	} {
		// Straight to the instance, a new forged address each time.
		for i, hdr := range []map[string]string{
			{"X-Forwarded-For": "203.0.113.1"},
			{"X-Forwarded-For": "203.0.113.2, 10.9.9.9", "X-Real-IP": "203.0.113.3"},
			{"X-Forwarded-For": "203.0.113.4", "X-Real-IP": "203.0.113.5"},
			{"X-Real-IP": "203.0.113.6"},
		} {
			want := r.passed
			if i >= 2 {
				want = http.StatusTooManyRequests
			}
			if got := send(direct, r, hdr); got != want {
				t.Errorf("%s straight from 127.0.0.1 claiming %v: %d, want %d (limited by 127.0.0.1 after 2)", r.name, hdr, got, want)
			}
		}
		// Through the trusted proxy: the address it names.
		for i, step := range []struct {
			client string
			want   int
		}{
			{"198.51.100.1", r.passed},
			{"198.51.100.1", r.passed},
			{"198.51.100.1", http.StatusTooManyRequests},
			{"198.51.100.2", r.passed},
		} {
			if got := send(proxy, r, map[string]string{"X-Forwarded-For": step.client}); got != step.want {
				t.Errorf("%s via the trusted proxy, request %d for %s: %d, want %d", r.name, i, step.client, got, step.want)
			}
		}
	}
	// The access log names the address each request was limited by: the
	// trusted proxy's client, the direct caller itself, never a forged one.
	logs := s.logs()
	for _, want := range []string{`"client":"198.51.100.1"`, `"client":"198.51.100.2"`, `"client":"127.0.0.1"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the access log has no line with %s", want)
		}
	}
	for _, forged := range []string{"203.0.113."} {
		if strings.Contains(logs, `"client":"`+forged) {
			t.Errorf("the access log names a forged address %s...", forged)
		}
	}
}
