package main

import (
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/auth"
)

// smsGateway is an SMS gateway on loopback that checks the signature and
// the timestamp of each request, keeps the codes it was asked to send, and
// answers with the status the test sets.
type smsGateway struct {
	secret string
	mu     sync.Mutex
	codes  map[string]string // phone -> last code
	status int
	calls  int
	bad    []string
}

func (g *smsGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ts := r.Header.Get(auth.WebhookTimestampHeader)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls++
	sent, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sent, 0)).Abs() > 5*time.Minute {
		g.bad = append(g.bad, "timestamp "+ts)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if !hmac.Equal([]byte(r.Header.Get(auth.WebhookSignatureHeader)), []byte(auth.Sign([]byte(g.secret), ts, body))) {
		g.bad = append(g.bad, "signature")
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var m auth.WebhookMessage
	if err := json.Unmarshal(body, &m); err != nil {
		g.bad = append(g.bad, "body")
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if g.status >= 300 {
		w.WriteHeader(g.status)
		return
	}
	g.codes[m.Phone] = m.Code
	w.WriteHeader(http.StatusOK)
}

func (g *smsGateway) set(status int) (calls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.status = status
	return g.calls
}

// TestLoginThroughWebhook: with SECKILL_LOGIN_SENDER=webhook on real Redis
// and MariaDB, the code reaches the gateway signed, and the buyer logs in
// with it; a failing gateway (503 after retries) answers the buyer 503 and
// lets them ask again at once; the secret and the code appear in no log
// line.
func TestLoginThroughWebhook(t *testing.T) {
	t.Parallel()
	const phone = "+8613700137000"
	g := &smsGateway{secret: "shared-with-the-sms-gateway-0123", codes: map[string]string{}}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	s := startWeb(t, map[string]string{
		"SECKILL_LOGIN_SENDER":          "webhook",
		"SECKILL_LOGIN_WEBHOOK_URL":     srv.URL + "/sms",
		"SECKILL_LOGIN_WEBHOOK_SECRET":  g.secret,
		"SECKILL_LOGIN_WEBHOOK_TIMEOUT": "2s",
	})
	code := func() answer {
		return sendJSON(t, "POST", s.base+"/api/v1/auth/code", "", map[string]string{"phone": phone})
	}

	// The gateway is down: the buyer is told so, and may ask again at once.
	g.set(http.StatusServiceUnavailable)
	if a := code(); a.status != 503 || a.code() != "unavailable" {
		t.Fatalf("code with the gateway down: %d %s", a.status, a.raw)
	}
	if calls := g.set(0); calls != 3 {
		t.Fatalf("%d calls to the failing gateway, want 3 (one and two retries)", calls)
	}

	if a := code(); a.status != 202 {
		t.Fatalf("code: %d %s", a.status, a.raw)
	}
	g.mu.Lock()
	got, bad := g.codes[phone], g.bad
	g.mu.Unlock()
	if len(bad) != 0 || len(got) != 6 {
		t.Fatalf("gateway got code %q, refused %v", got, bad)
	}
	a := sendJSON(t, "POST", s.base+"/api/v1/auth/login", "", map[string]string{"phone": phone, "code": got})
	if a.status != 200 || a.body["token"] == nil || a.body["new_user"] != true {
		t.Fatalf("login with the gateway's code: %d %s", a.status, a.raw)
	}
	vid := createVoucher(t, s.base, 2)
	if a := sendJSON(t, "POST", s.base+"/api/v1/vouchers/"+strconv.FormatInt(vid, 10)+"/orders", a.body["token"].(string), nil); a.status != 202 {
		t.Fatalf("purchase with the login's token: %d %s", a.status, a.raw)
	}
	logs := s.logs()
	for _, secret := range []string{g.secret, got} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q", secret)
		}
	}
	if !strings.Contains(logs, "send login code") {
		t.Error("the gateway's failure was not logged")
	}
}
