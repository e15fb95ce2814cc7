package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// drawnVoucher creates a fair voucher whose draw closes in a second and a
// half, enters users into it, and waits until the draw is done.
func drawnVoucher(t testing.TB, base string, users ...int64) int64 {
	t.Helper()
	now := time.Now().UTC()
	begin := now.Add(-time.Minute).Truncate(time.Millisecond)
	st, v := call(t, "POST", base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "drawn", "face_value": 1000, "stock": 1, "fair_window_ms": now.Add(1500 * time.Millisecond).Sub(begin).Milliseconds(),
		"begin_at": begin.Format(time.RFC3339Nano), "end_at": now.Add(time.Hour).Format(time.RFC3339Nano),
	})
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher: %d %v", st, v)
	}
	id := int64(v["voucher"].(map[string]any)["id"].(float64))
	for _, u := range users {
		if st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, id), token(t, u, auth.RoleUser), nil); st != http.StatusAccepted {
			t.Fatalf("user %d enters: %d %v", u, st, body)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the draw done", func() bool {
		_, body := call(t, "GET", fmt.Sprintf("%s/api/v1/vouchers/%d/draw", base, id), "", nil)
		d, _ := body["draw"].(map[string]any)
		return d != nil && d["status"] == "done"
	})
	return id
}

// TestDrawPagesLimitedPerAddress: the draw's pages (its status, the
// buyer's entry, its list) are limited per client address as purchases
// are, by SECKILL_LIMIT_DRAW_IP, one bucket for the three: an address past
// it is answered 429 too_many_requests with Retry-After, before the
// token is looked at; another address has its own.
func TestDrawPagesLimitedPerAddress(t *testing.T) {
	t.Parallel()
	o := startObserved(t, map[string]string{
		"SECKILL_RATE_LIMIT": "on", "SECKILL_LIMIT_DRAW_IP": "3/1m", "SECKILL_TRUSTED_PROXIES": "none",
	})
	id := drawnVoucher(t, o.base, 7)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", o.base, id)
	ask := func(from, url, tok string) (int, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := clientFrom(t, from).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	tok := token(t, 7, auth.RoleUser)
	for i, step := range []struct {
		from, url, tok string
		want           int
	}{
		{"127.0.0.2", draw, "", 200},
		{"127.0.0.2", draw + "/entries", "", 200},
		{"127.0.0.2", draw + "/me", tok, 200},
		{"127.0.0.2", draw, "", 429},
		{"127.0.0.2", draw + "/entries", "", 429},
		{"127.0.0.2", draw + "/me", "", 429}, // before the token
		{"127.0.0.3", draw, "", 200},
		{"127.0.0.3", draw + "/me", tok, 200},
	} {
		st, h := ask(step.from, step.url, step.tok)
		if st != step.want {
			t.Errorf("step %d: %s from %s answered %d, want %d", i, step.url, step.from, st, step.want)
		}
		if st == 429 && h.Get("Retry-After") == "" {
			t.Errorf("step %d: 429 without Retry-After", i)
		}
	}
}
