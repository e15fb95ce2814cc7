package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// hostile is one bad request and the answer it must get.
type hostile struct {
	name   string
	method string
	path   string
	tok    string // bearer token; "" for none
	hdr    map[string]string
	body   string
	status int
	code   string // "" accepts any JSON code
}

// TestHostileInput sends what a hostile client sends to every route: each
// gets its 4xx with a JSON code, and nothing changes in Redis or MariaDB.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	s := startWeb(t, map[string]string{"SECKILL_RATE_LIMIT": "off"})
	admin, user := token(t, 1, auth.RoleAdmin), token(t, 2, auth.RoleUser)
	vid := createVoucher(t, s.base, 10)
	// One accepted order, so that order routes have something to protect.
	if st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, vid), user, nil); st != 202 {
		t.Fatalf("purchase: %d %v", st, body)
	}

	cases := hostileCases(t, vid, admin, user)
	g := s.db(t)
	rdb := testenv.Redis(t)
	// The accepted order drains to MariaDB first, acknowledged and gone
	// from the stream, so the worker changes nothing while the hostile
	// requests run.
	stream := voucher.NewKeys(s.prefix, 1).Stream(0)
	testenv.WaitFor(t, 30*time.Second, "the accepted order written and acknowledged", func() bool {
		var n int64
		g.Table("orders").Count(&n)
		l, err := rdb.XLen(context.Background(), stream).Result()
		return n == 1 && err == nil && l == 0
	})
	before := s.snapshot(t, rdb, g)
	for _, tc := range cases {
		hdr := map[string]string{"Content-Type": "application/json"}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		if tc.tok != "" {
			hdr["Authorization"] = "Bearer " + tc.tok
		}
		var body []byte
		if tc.body != "" {
			body = []byte(tc.body)
		}
		a := send(t, tc.method, s.base+tc.path, body, hdr)
		if a.status != tc.status || (tc.code != "" && a.code() != tc.code) || a.code() == "" {
			t.Errorf("%s: %s %s: got %d %s, want %d %s", tc.name, tc.method, tc.path, a.status, a.raw, tc.status, tc.code)
		}
	}
	after := s.snapshot(t, rdb, g)
	if d := before.diff(after); len(d) > 0 {
		t.Errorf("refused requests changed state: %v", d)
	}
	for _, secret := range []string{testSecret, admin, user} {
		if strings.Contains(s.logs(), secret) {
			t.Errorf("a secret or token appears in the log")
		}
	}
}

func hostileCases(t testing.TB, vid int64, admin, user string) []hostile {
	other, _ := auth.NewSigner([]byte("not-the-secret-not-the-secret-xx"))
	forged, _ := other.Mint(auth.Identity{UserID: 2, Role: auth.RoleAdmin}, time.Hour)
	expired, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": "seckill", "sub": "2", "role": "admin", "exp": time.Now().Add(-time.Hour).Unix(),
	}).SignedString([]byte(testSecret))
	parts := strings.Split(admin, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	userZero, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": "seckill", "sub": "0", "role": "user", "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(testSecret))

	v := fmt.Sprintf("/api/v1/vouchers/%d", vid)
	future := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339) }
	voucher := func(fields string) string {
		return `{"title":"t","face_value":100,"stock":5,"begin_at":"` + future(-time.Minute) + `","end_at":"` + future(time.Hour) + `"` + fields + `}`
	}
	// withField is a valid voucher body with fields replaced: name, value
	// pairs of raw JSON; an empty value drops the field.
	withField := func(pairs ...string) string {
		m := map[string]string{
			"title": `"t"`, "face_value": "100", "stock": "5",
			"begin_at": `"` + future(-time.Minute) + `"`, "end_at": `"` + future(time.Hour) + `"`,
		}
		for i := 0; i+1 < len(pairs); i += 2 {
			m[pairs[i]] = pairs[i+1]
		}
		var fields []string
		for _, k := range []string{"title", "face_value", "stock", "begin_at", "end_at"} {
			if m[k] != "" {
				fields = append(fields, fmt.Sprintf("%q:%s", k, m[k]))
			}
		}
		return "{" + strings.Join(fields, ",") + "}"
	}

	var cs []hostile
	// Ids: non-numeric, zero, negative, beyond int64, odd spellings.
	for _, id := range []string{"abc", "0", "-1", "9223372036854775808", "99999999999999999999", "1e3", "0x10", "1.5", "%20" + fmt.Sprint(vid), "%00", "%EF%BC%91"} {
		cs = append(cs,
			hostile{"voucher id " + id, "GET", "/api/v1/vouchers/" + id, "", nil, "", 400, "bad_request"},
			hostile{"purchase id " + id, "POST", "/api/v1/vouchers/" + id + "/orders", user, nil, "", 400, "bad_request"},
			hostile{"order id " + id, "GET", "/api/v1/orders/" + id, user, nil, "", 400, "bad_request"},
		)
	}
	cs = append(cs,
		hostile{"unknown voucher", "GET", "/api/v1/vouchers/9223372036854775807", "", nil, "", 404, "voucher_not_found"},
		hostile{"purchase unknown voucher", "POST", "/api/v1/vouchers/9223372036854775807/orders", user, nil, "", 404, "voucher_not_found"},
		hostile{"unknown order", "GET", "/api/v1/orders/9223372036854775807", user, nil, "", 404, "order_not_found"},
		hostile{"list limit 0", "GET", "/api/v1/vouchers?limit=0", "", nil, "", 400, "bad_request"},
		hostile{"list limit huge", "GET", "/api/v1/vouchers?limit=100000", "", nil, "", 400, "bad_request"},
		hostile{"list before negative", "GET", "/api/v1/vouchers?before=-5", "", nil, "", 400, "bad_request"},
		hostile{"list before text", "GET", "/api/v1/vouchers?before=x", "", nil, "", 400, "bad_request"},
		hostile{"my orders limit", "GET", "/api/v1/users/me/orders?limit=-1", user, nil, "", 400, "bad_request"},
		hostile{"method", "PUT", v, admin, nil, "{}", 405, "method_not_allowed"},
		hostile{"method delete", "DELETE", "/api/v1/vouchers", admin, nil, "", 405, "method_not_allowed"},
		hostile{"no route", "GET", "/api/v1/admin", admin, nil, "", 404, "not_found"},
	)

	// Tokens: missing, malformed, expired, forged, alg none, wrong role.
	purchase := v + "/orders"
	for name, tok := range map[string]string{
		"garbage token": "not.a.token", "expired token": expired, "forged token": forged,
		"alg none token": none, "user zero token": userZero, "token with a tail": user + "x",
	} {
		cs = append(cs,
			hostile{name + " purchase", "POST", purchase, tok, nil, "", 401, "unauthorized"},
			hostile{name + " create", "POST", "/api/v1/vouchers", tok, nil, voucher(""), 401, "unauthorized"},
			hostile{name + " orders", "GET", "/api/v1/users/me/orders", tok, nil, "", 401, "unauthorized"},
		)
	}
	cs = append(cs,
		hostile{"no token", "POST", purchase, "", nil, "", 401, "unauthorized"},
		hostile{"basic auth", "POST", purchase, "", map[string]string{"Authorization": "Basic " + user}, "", 401, "unauthorized"},
		hostile{"lowercase bearer", "POST", purchase, "", map[string]string{"Authorization": "bearer " + user}, "", 401, "unauthorized"},
		hostile{"user creates voucher", "POST", "/api/v1/vouchers", user, nil, voucher(""), 403, "forbidden"},
	)

	// Voucher bodies: malformed, unknown fields, wrong types, oversized.
	for name, body := range map[string]string{
		"empty body": "", "malformed": "{", "array": "[]", "string": `"x"`, "two objects": voucher("") + voucher(""),
		"trailing garbage": voucher("") + "x", "unknown field": voucher(`,"admin":true`), "stock as string": withField("stock", `"5"`),
		"stock fraction": withField("stock", "1.5"), "stock exponent": withField("stock", "1e12"), "title number": withField("title", "5"),
		"face value string": withField("face_value", `"100"`), "begin not a time": withField("begin_at", `"tomorrow"`),
		"begin without zone": withField("begin_at", `"2030-01-01T00:00:00"`), "stock beyond int64": withField("stock", "99999999999999999999"),
	} {
		cs = append(cs, hostile{name, "POST", "/api/v1/vouchers", admin, nil, body, 400, "bad_request"})
	}
	cs = append(cs,
		hostile{"oversized", "POST", "/api/v1/vouchers", admin, nil, voucher(`,"x":"` + strings.Repeat("a", 20<<10) + `"`), 413, "body_too_large"},
		hostile{"huge", "POST", "/api/v1/vouchers", admin, nil, `{"title":"` + strings.Repeat("a", 1<<20) + `"}`, 413, "body_too_large"},
	)
	// Voucher fields: empty title, stock <= 0 or absurd, begin >= end, end in the past.
	for name, body := range map[string]string{
		"no fields": "{}", "null": "null", "empty title": withField("title", `""`), "blank title": withField("title", `"   "`),
		"long title": withField("title", `"`+strings.Repeat("x", 201)+`"`), "no stock": withField("stock", ""),
		"stock 0": withField("stock", "0"), "stock -1": withField("stock", "-1"), "stock absurd": withField("stock", "2000000000"),
		"face value negative": withField("face_value", "-1"), "face value absurd": withField("face_value", "9000000000000"),
		"begin = end":     withField("begin_at", `"`+future(2*time.Hour)+`"`, "end_at", `"`+future(2*time.Hour)+`"`),
		"begin after end": withField("begin_at", `"`+future(2*time.Hour)+`"`),
		"ended":           withField("begin_at", `"`+future(-2*time.Hour)+`"`, "end_at", `"`+future(-time.Hour)+`"`),
		"no end":          withField("end_at", ""),
	} {
		cs = append(cs, hostile{name, "POST", "/api/v1/vouchers", admin, nil, body, 422, "invalid_voucher"})
	}

	// Login bodies and fields.
	for name, body := range map[string]string{
		"code malformed": "{", "code unknown field": `{"phone":"+8613800138000","admin":true}`, "code phone number": `{"phone":8613800138000}`,
		"code two objects": `{"phone":"+8613800138000"}{}`, "code empty body": "",
	} {
		cs = append(cs, hostile{name, "POST", "/api/v1/auth/code", "", nil, body, 400, "bad_request"})
	}
	for name, phone := range map[string]string{
		"no plus": "8613800138000", "letters": "+86abc", "short": "+1234", "long": "+1234567890123456", "spaces": "+86 138 0013 8000",
		"braces": "+86{13}800138000", "newline": "+8613800138000\n", "empty": "",
	} {
		cs = append(cs, hostile{"phone " + name, "POST", "/api/v1/auth/code", "", nil, fmt.Sprintf(`{"phone":%q}`, phone), 422, "invalid_phone"})
	}
	cs = append(cs,
		hostile{"code oversized", "POST", "/api/v1/auth/code", "", nil, `{"phone":"` + strings.Repeat("1", 4<<10) + `"}`, 413, "body_too_large"},
		hostile{"login unknown field", "POST", "/api/v1/auth/login", "", nil, `{"phone":"+8613800138000","code":"123456","role":"admin"}`, 400, "bad_request"},
		hostile{"login code number", "POST", "/api/v1/auth/login", "", nil, `{"phone":"+8613800138000","code":123456}`, 400, "bad_request"},
		hostile{"login code letters", "POST", "/api/v1/auth/login", "", nil, `{"phone":"+8613800138000","code":"12345a"}`, 422, "invalid_code"},
		hostile{"login code long", "POST", "/api/v1/auth/login", "", nil, `{"phone":"+8613800138000","code":"1234567"}`, 422, "invalid_code"},
		hostile{"login bad phone", "POST", "/api/v1/auth/login", "", nil, `{"phone":"x","code":"123456"}`, 422, "invalid_phone"},
		// No code was ever sent to this phone: no try is counted, no key is made.
		hostile{"login without code", "POST", "/api/v1/auth/login", "", nil, `{"phone":"+8613800138000","code":"123456"}`, 401, "code_expired"},
	)
	return cs
}

// TestHostileVoucherDates: dates the database cannot store, or that no
// sale has, are refused as invalid input (422), not failed on as a
// database error (503) or stored: begin_at from 2000-01-01, end_at at most
// 366 days ahead.
func TestHostileVoucherDates(t *testing.T) {
	t.Parallel()
	s := startWeb(t, map[string]string{"SECKILL_RATE_LIMIT": "off"})
	admin := token(t, 1, auth.RoleAdmin)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	g := s.db(t)
	rdb := testenv.Redis(t)
	testenv.WaitFor(t, 30*time.Second, "the service ready", func() bool { st, _ := call(t, "GET", s.base+"/readyz", "", nil); return st == 200 })
	before := s.snapshot(t, rdb, g)
	for name, body := range map[string]string{
		"begin in year 1":     `{"title":"t","face_value":1,"stock":1,"begin_at":"0001-01-01T00:00:00Z","end_at":"` + future + `"}`,
		"begin in year 999":   `{"title":"t","face_value":1,"stock":1,"begin_at":"0999-01-01T00:00:00Z","end_at":"` + future + `"}`,
		"end in year 9999":    `{"title":"t","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"9999-12-31T23:59:59Z"}`,
		"end past 9999 (UTC)": `{"title":"t","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"9999-12-31T23:59:59-05:00"}`,
	} {
		a := send(t, "POST", s.base+"/api/v1/vouchers", []byte(body), map[string]string{"Authorization": "Bearer " + admin})
		if a.status != 422 || a.code() != "invalid_voucher" {
			t.Errorf("%s: %d %s, want 422 invalid_voucher", name, a.status, a.raw)
		}
	}
	// Nothing stored: no voucher row, no Redis key written or changed.
	var rows int64
	if err := g.Table("vouchers").Count(&rows).Error; err != nil || rows != 0 {
		t.Errorf("%d voucher rows after the refusals (%v), want none", rows, err)
	}
	if d := before.diff(s.snapshot(t, rdb, g)); len(d) > 0 {
		t.Errorf("refused vouchers changed state: %v", d)
	}
}
