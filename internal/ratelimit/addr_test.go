package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// TestAddrKey: IPv4 addresses are keyed as they are, IPv6 addresses by
// their /64, mapped IPv4 as IPv4, zones dropped.
func TestAddrKey(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"203.0.113.7":                      "203.0.113.7",
		"198.51.100.1":                     "198.51.100.1",
		"2001:db8:1:2:3:4:5:6":             "2001:db8:1:2::/64",
		"2001:db8:1:2:ffff:ffff:ffff:ffff": "2001:db8:1:2::/64",
		"2001:DB8:1:2::1":                  "2001:db8:1:2::/64",
		"2001:db8:1:3::1":                  "2001:db8:1:3::/64",
		"::1":                              "::/64",
		"fe80::1%eth0":                     "fe80::/64",
		"::ffff:203.0.113.7":               "203.0.113.7",
		"":                                 "",
		"not an address":                   "not an address",
	} {
		if got := AddrKey(in); got != want {
			t.Errorf("AddrKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAddrKeyShares64: through the middleware, every address of one IPv6
// /64 draws from one bucket, another /64 from its own, and IPv4 addresses
// each from their own.
func TestAddrKeyShares64(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 2, Per: time.Hour}, c.now)
	r := gin.New()
	r.GET("/x", Middleware(l, func(c *gin.Context) string { return AddrKey(c.ClientIP()) }), func(c *gin.Context) { c.Status(204) })
	from := func(remote string) int {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/x", nil)
		req.RemoteAddr = remote
		r.ServeHTTP(w, req)
		return w.Code
	}
	for i, remote := range []string{"[2001:db8:7:7::1]:1000", "[2001:db8:7:7:a:b:c:d]:1000"} {
		if code := from(remote); code != 204 {
			t.Fatalf("request %d of the /64, from %s: %d", i, remote, code)
		}
	}
	if code := from("[2001:db8:7:7:ffff::9]:1000"); code != 429 {
		t.Errorf("a third address of the same /64 answered %d, want 429: each address of a /64 has its own bucket", code)
	}
	if code := from("[2001:db8:7:8::1]:1000"); code != 204 {
		t.Errorf("the next /64 answered %d, want 204", code)
	}
	for _, remote := range []string{"192.0.2.1:1", "192.0.2.1:2", "192.0.2.2:1"} {
		if code := from(remote); code != 204 {
			t.Errorf("%s answered %d, want 204", remote, code)
		}
	}
	if code := from("192.0.2.1:3"); code != 429 {
		t.Errorf("a third request from 192.0.2.1 answered %d, want 429", code)
	}
}
