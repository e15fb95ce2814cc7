package auth

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// TestHTTPLimitsPerClientAddress: the login routes count codes per client
// address as gin sees it (X-Forwarded-For from a trusted proxy): a stranger
// behind the proxy running out of codes leaves the owner's alone.
func TestHTTPLimitsPerClientAddress(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodesPerRequester: 2, Window: time.Hour})
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	if err := r.SetTrustedProxies([]string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	r.POST("/code", f.login.RequestCode)
	r.POST("/login", f.login.SignIn)
	post := func(path, from, body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", from)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		var out map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &out)
		return w.Code, out
	}
	code := fmt.Sprintf(`{"phone":%q}`, phone)
	deadline := time.Now().Add(10 * time.Second)
	sent := 0
	for {
		st, out := post("/code", "203.0.113.1", code)
		if st == http.StatusAccepted {
			sent++
		} else if st != http.StatusTooManyRequests {
			t.Fatalf("stranger's code: %d %v", st, out)
		} else if !strings.Contains(fmt.Sprint(out["message"]), "a moment ago") {
			if sent != 2 || !strings.Contains(fmt.Sprint(out["message"]), "from your address") {
				t.Fatalf("stranger refused after %d codes with %v; want 2, then a refusal for its address", sent, out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stranger was never refused")
		}
		time.Sleep(time.Millisecond)
	}
	testWaitAccepted(t, func() int { st, _ := post("/code", home, code); return st })
	st, out := post("/login", home, fmt.Sprintf(`{"phone":%q,"code":%q}`, phone, f.box.last(t, phone)))
	if st != http.StatusOK || out["token"] == nil {
		t.Fatalf("owner's login: %d %v", st, out)
	}
}

// testWaitAccepted repeats a code request while the resend wait (set short
// by the test) has not run out.
func testWaitAccepted(t testing.TB, ask func() int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := ask()
		if st == http.StatusAccepted {
			return
		}
		if st != http.StatusTooManyRequests || time.Now().After(deadline) {
			t.Fatalf("owner's code: %d", st)
		}
		time.Sleep(time.Millisecond)
	}
}
