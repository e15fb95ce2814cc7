package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/auth"
)

// TestLoginFlow logs in through the HTTP API on real Redis and MariaDB:
// code, wrong code, right code, the token at work, single use, resend
// guard, admin by configuration; no code or token in a log line.
func TestLoginFlow(t *testing.T) {
	t.Parallel()
	const phone, adminPhone = "+8613800138000", "+8613900000000"
	s := startWeb(t, map[string]string{"SECKILL_ADMIN_PHONES": adminPhone})
	code := func(p string) answer {
		return sendJSON(t, "POST", s.base+"/api/v1/auth/code", "", map[string]string{"phone": p})
	}
	login := func(p, c string) answer {
		return sendJSON(t, "POST", s.base+"/api/v1/auth/login", "", map[string]string{"phone": p, "code": c})
	}

	a := code(phone)
	if a.status != 202 || a.body["expires_in"] != float64(300) || a.body["resend_after"] != float64(60) {
		t.Fatalf("code: %d %s", a.status, a.raw)
	}
	c := lastCode(t, s.outbox, phone)
	if strings.Contains(a.raw, c) {
		t.Fatal("the code is in the answer")
	}
	wrong := fmt.Sprintf("%06d", (mustAtoi(t, c)+1)%1_000_000)
	if a := login(phone, wrong); a.status != 401 || a.code() != "wrong_code" || a.body["tries_left"] != float64(4) {
		t.Fatalf("wrong code: %d %s", a.status, a.raw)
	}
	a = login(phone, c)
	if a.status != 200 || a.body["role"] != "user" || a.body["new_user"] != true {
		t.Fatalf("login: %d %s", a.status, a.raw)
	}
	tok := a.body["token"].(string)
	uid := int64(a.body["user_id"].(float64))
	if uid < 1_000_000 {
		t.Fatalf("user id %d, want >= 1000000", uid)
	}
	if a := login(phone, c); a.status != 401 || a.code() != "code_expired" {
		t.Fatalf("code used twice: %d %s", a.status, a.raw)
	}
	// The token buys.
	vid := createVoucher(t, s.base, 3)
	if a := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, vid), tok, nil); a.status != 202 {
		t.Fatalf("purchase with the login token: %d %s", a.status, a.raw)
	}
	// The first login made the user in MariaDB.
	var got struct {
		ID    int64
		Phone string
	}
	if err := s.db(t).Raw("SELECT id, phone FROM users WHERE phone = ?", phone).Scan(&got).Error; err != nil || got.ID != uid {
		t.Fatalf("users row: %+v, %v; want id %d", got, err, uid)
	}
	// Too soon for another code.
	if a := code(phone); a.status != 429 || a.code() != "too_many_requests" || a.header.Get("Retry-After") == "" {
		t.Fatalf("resend at once: %d %v %s", a.status, a.header, a.raw)
	} else if n, _ := strconv.Atoi(a.header.Get("Retry-After")); n < 1 || n > 60 {
		t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
	}
	// A configured phone is an admin, and can create vouchers.
	atok, aid, role := s.login(t, adminPhone)
	if role != auth.RoleAdmin || aid == uid {
		t.Fatalf("admin login: role %s, user %d", role, aid)
	}
	if a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", atok, map[string]any{
		"title": "by admin", "face_value": 1, "stock": 1, "begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	}); a.status != 201 {
		t.Fatalf("admin create: %d %s", a.status, a.raw)
	}
	if a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", tok, map[string]any{}); a.status != 403 {
		t.Fatalf("user create: %d %s", a.status, a.raw)
	}

	logs := s.logs()
	for what, secret := range map[string]string{"code": c, "token": tok, "admin token": atok, "token secret": testSecret, "phone": phone} {
		if strings.Contains(logs, secret) {
			t.Errorf("the %s appears in the log", what)
		}
	}
	if !strings.Contains(logs, `"msg":"login code sent"`) || !strings.Contains(logs, auth.MaskPhone(phone)) {
		t.Errorf("no masked log line for the code sent")
	}
}

func mustAtoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLoginLimitsPerAddress: code requests are limited per client address;
// X-Forwarded-For counts only from a trusted proxy.
func TestLoginLimitsPerAddress(t *testing.T) {
	t.Parallel()
	for _, trusted := range []bool{true, false} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"SECKILL_LIMIT_CODE_IP": "2/1h", "SECKILL_LIMIT_LOGIN_IP": "3/1h"}
			if !trusted {
				env["SECKILL_TRUSTED_PROXIES"] = "none"
			}
			s := startWeb(t, env)
			codeFrom := func(addr, phone string) answer {
				return send(t, "POST", s.base+"/api/v1/auth/code", fmt.Appendf(nil, `{"phone":%q}`, phone),
					map[string]string{"X-Forwarded-For": addr})
			}
			for i := range 2 {
				if a := codeFrom("203.0.113.7", fmt.Sprintf("+861380013800%d", i)); a.status != 202 {
					t.Fatalf("code %d: %d %s", i, a.status, a.raw)
				}
			}
			a := codeFrom("203.0.113.7", "+8613800138009")
			if a.status != 429 || a.code() != "too_many_requests" {
				t.Fatalf("3rd code from one address: %d %s", a.status, a.raw)
			}
			if n, _ := strconv.Atoi(a.header.Get("Retry-After")); n < 1 || n > 3600 {
				t.Fatalf("Retry-After %q", a.header.Get("Retry-After"))
			}
			// Another address: its own bucket, if a trusted proxy says so.
			a = codeFrom("203.0.113.8", "+8613800138009")
			if trusted && a.status != 202 {
				t.Fatalf("another address behind the proxy: %d %s", a.status, a.raw)
			}
			if !trusted && a.status != 429 {
				t.Fatalf("spoofed X-Forwarded-For changed the address: %d %s", a.status, a.raw)
			}
			// Login tries are limited per address too.
			statuses := []int{}
			for range 4 {
				a := send(t, "POST", s.base+"/api/v1/auth/login", []byte(`{"phone":"+8613800138000","code":"000000"}`),
					map[string]string{"X-Forwarded-For": "198.51.100.1"})
				statuses = append(statuses, a.status)
			}
			if statuses[3] != 429 {
				t.Fatalf("login statuses %v, want the 4th to be 429", statuses)
			}
		})
	}
}

// TestLoginSenderOff: with a real database and no sender chosen, codes are
// not sent (stdout is collected as logs there) and login says so.
func TestLoginSenderOff(t *testing.T) {
	t.Parallel()
	s := startWeb(t, map[string]string{"SECKILL_LOGIN_SENDER": "", "SECKILL_LOGIN_OUTBOX": ""})
	a := sendJSON(t, "POST", s.base+"/api/v1/auth/code", "", map[string]string{"phone": "+8613800138000"})
	if a.status != 503 || a.code() != "login_unavailable" {
		t.Fatalf("code with no sender: %d %s", a.status, a.raw)
	}
}
