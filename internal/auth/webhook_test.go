package auth

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gateway is an SMS gateway on loopback that checks every request the way
// a real one does: the signature over the raw body, and a fresh timestamp.
type gateway struct {
	secret []byte
	// answer gives the status of the nth request (0-based).
	answer func(n int) int
	hold   chan struct{} // when set, requests wait on it (or their context)

	calls atomic.Int32
	mu    sync.Mutex
	got   []WebhookMessage
	bad   []string // why a request was refused
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(g.calls.Add(1)) - 1
	if g.hold != nil {
		select {
		case <-g.hold:
		case <-r.Context().Done():
			return
		}
	}
	body, _ := io.ReadAll(r.Body)
	ts := r.Header.Get(WebhookTimestampHeader)
	sent, err := strconv.ParseInt(ts, 10, 64)
	why := ""
	switch {
	case r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json":
		why = "not a JSON POST"
	case err != nil || time.Since(time.Unix(sent, 0)).Abs() > 5*time.Minute:
		why = "stale or missing timestamp " + ts
	case !hmac.Equal([]byte(r.Header.Get(WebhookSignatureHeader)), []byte(Sign(g.secret, ts, body))):
		why = "bad signature"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if why != "" {
		g.bad = append(g.bad, why)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var m WebhookMessage
	if err := json.Unmarshal(body, &m); err != nil {
		g.bad = append(g.bad, "body: "+err.Error())
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	status := http.StatusOK
	if g.answer != nil {
		status = g.answer(n)
	}
	if status < 300 {
		g.got = append(g.got, m)
	}
	w.WriteHeader(status)
}

func newGateway(t testing.TB, answer func(n int) int) (*gateway, *httptest.Server) {
	t.Helper()
	g := &gateway{secret: []byte("gateway-shared-secret-0123456789"), answer: answer}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return g, srv
}

func newWebhook(t testing.TB, url string, secret []byte, timeout time.Duration) *WebhookSender {
	t.Helper()
	s, err := NewWebhookSender(WebhookConfig{URL: url, Secret: secret, Timeout: timeout, Retries: 2, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestWebhookSends: the gateway gets the phone, the code and the SMS text,
// signed so that it can check them.
func TestWebhookSends(t *testing.T) {
	t.Parallel()
	g, srv := newGateway(t, nil)
	s := newWebhook(t, srv.URL+"/sms?route=login", g.secret, 5*time.Second)
	if err := s.Send(context.Background(), "+8613800138000", "123456"); err != nil {
		t.Fatal(err)
	}
	if len(g.bad) != 0 || len(g.got) != 1 || g.got[0].Phone != "+8613800138000" || g.got[0].Code != "123456" ||
		!strings.Contains(g.got[0].Text, "123456") {
		t.Fatalf("gateway got %+v, refused %v", g.got, g.bad)
	}
}

// TestWebhookWrongSecretRefused: a gateway with another secret refuses the
// request, and the sender reports it at once (no retry of a 4xx).
func TestWebhookWrongSecretRefused(t *testing.T) {
	t.Parallel()
	g, srv := newGateway(t, nil)
	s := newWebhook(t, srv.URL, []byte("not-the-gateways-secret-at-all!!"), 5*time.Second)
	err := s.Send(context.Background(), "+8613800138000", "123456")
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("err %v, want the gateway's 401", err)
	}
	if n := g.calls.Load(); n != 1 || len(g.bad) != 1 || g.bad[0] != "bad signature" {
		t.Fatalf("%d calls, refused %v; want one, for its signature", n, g.bad)
	}
}

// TestWebhookRetries5xx: 5xx answers are retried up to the bound; the
// third attempt that succeeds delivers the code once.
func TestWebhookRetries5xx(t *testing.T) {
	t.Parallel()
	g, srv := newGateway(t, func(n int) int {
		if n < 2 {
			return http.StatusBadGateway
		}
		return http.StatusAccepted
	})
	s := newWebhook(t, srv.URL, g.secret, 5*time.Second)
	if err := s.Send(context.Background(), "+8613800138000", "654321"); err != nil {
		t.Fatal(err)
	}
	if n := g.calls.Load(); n != 3 || len(g.got) != 1 {
		t.Fatalf("%d calls, delivered %+v; want 3 calls and one delivery", n, g.got)
	}
}

// TestWebhookGivesUp: a gateway that keeps failing gets 1 + Retries
// attempts, and the error says what failed without the secret, the code or
// the URL's query.
func TestWebhookGivesUp(t *testing.T) {
	t.Parallel()
	g, srv := newGateway(t, func(int) int { return http.StatusServiceUnavailable })
	s := newWebhook(t, srv.URL+"/sms?key=query-secret", g.secret, 5*time.Second)
	err := s.Send(context.Background(), "+8613800138000", "777111")
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("err %v, want the gateway's 503", err)
	}
	if n := g.calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3 (one and two retries)", n)
	}
	for _, secret := range []string{string(g.secret), "777111", "query-secret"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("error %q holds %q", err, secret)
		}
	}
}

// TestWebhookTimeout: a gateway that never answers costs each attempt its
// timeout, no more, and the send fails.
func TestWebhookTimeout(t *testing.T) {
	t.Parallel()
	g, srv := newGateway(t, nil)
	g.hold = make(chan struct{})
	t.Cleanup(func() { close(g.hold) })
	s := newWebhook(t, srv.URL, g.secret, 50*time.Millisecond)
	began := time.Now()
	err := s.Send(context.Background(), "+8613800138000", "123456")
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("err %v, want a timeout", err)
	}
	if n := g.calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3", n)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("took %s: the per-attempt timeout did not bound it", took)
	}
}

// TestWebhookConfig: a URL that is not absolute http(s) or a short secret
// is refused when the sender is made.
func TestWebhookConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []WebhookConfig{
		{URL: "sms.example/x", Secret: []byte("0123456789abcdef")},
		{URL: "ftp://sms.example/x", Secret: []byte("0123456789abcdef")},
		{URL: "https://sms.example/x", Secret: []byte("short")},
	} {
		if _, err := NewWebhookSender(c); err == nil {
			t.Errorf("%q with a %d-byte secret accepted", c.URL, len(c.Secret))
		} else if strings.Contains(err.Error(), string(c.Secret)) {
			t.Errorf("error %q holds the secret", err)
		}
	}
}

// TestWebhookWireFormat pins what a gateway is told to check, with a
// signature computed outside this package (openssl dgst -sha256 -hmac):
// the body as posted, and the signature over "<timestamp>.<body>".
func TestWebhookWireFormat(t *testing.T) {
	t.Parallel()
	const (
		secret = "gateway-shared-secret-0123456789"
		body   = `{"phone":"+8613800138000","code":"123456","text":"your seckill login code is 123456"}`
		want   = "sha256=6c08cef4478b8c465c25047a2b93e3deaf3cebccf313a3860b199bc329078876"
	)
	if got := Sign([]byte(secret), "1700000000", []byte(body)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	var got struct {
		body, ts, sig string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.body, got.ts, got.sig = string(b), r.Header.Get(WebhookTimestampHeader), r.Header.Get(WebhookSignatureHeader)
	}))
	t.Cleanup(srv.Close)
	s, err := NewWebhookSender(WebhookConfig{URL: srv.URL, Secret: []byte(secret), Now: func() time.Time { return time.Unix(1_700_000_000, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(context.Background(), "+8613800138000", "123456"); err != nil {
		t.Fatal(err)
	}
	if got.body != body || got.ts != "1700000000" || got.sig != want {
		t.Fatalf("posted body %s, timestamp %q, signature %q; want %s, 1700000000, %s", got.body, got.ts, got.sig, body, want)
	}
}
