package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"seckill/internal/auth"
)

// The fuzz targets run the whole service (run()) on the real Redis and
// MariaDB of testenv, and send it what the fuzzer makes. Their seeds run
// as ordinary tests; `go test -fuzz FuzzPurchase ./cmd/api` explores.

// FuzzPurchase: any path id, token and body. The answer is never a 5xx,
// always JSON with a code when it is an error, and exactly what the input
// deserves: 401 for a bad token, 400 for a bad id, 404 for another
// voucher, 202 once per buyer and 409 already_purchased after; the live
// stock falls by one per 202 and by nothing else.
func FuzzPurchase(f *testing.F) {
	s := startWeb(f, map[string]string{"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn"})
	const stock = 1_000_000
	vid := createVoucher(f, s.base, stock)
	signer, err := auth.NewSigner([]byte(testSecret))
	if err != nil {
		f.Fatal(err)
	}
	other, _ := auth.NewSigner([]byte("not-the-secret-not-the-secret-xx"))
	bought := map[int64]string{} // user -> order id
	vs := strconv.FormatInt(vid, 10)

	for _, id := range []string{vs, "0" + vs, "+" + vs, "0", "-1", "abc", "9223372036854775807", "9223372036854775808", "", "/", "..", ".", "%", "1/2", " " + vs, vs + "\x00", "１"} {
		f.Add(id, uint8(0), uint16(1), []byte(nil))
	}
	for who := range uint8(6) {
		f.Add(vs, who, uint16(2), []byte(`{"voucher_id":1}`))
	}
	f.Add(vs, uint8(0), uint16(1), bytes.Repeat([]byte("x"), 70<<10))

	f.Fuzz(func(t *testing.T, id string, who uint8, user uint16, body []byte) {
		uid := int64(user) + 1
		var tok string
		valid := true
		switch who % 6 {
		case 0:
			tok, _ = signer.Mint(auth.Identity{UserID: uid, Role: auth.RoleUser}, time.Hour)
		case 1:
			uid += 100_000
			tok, _ = signer.Mint(auth.Identity{UserID: uid, Role: auth.RoleAdmin}, time.Hour)
		case 2:
			tok, valid = "", false
		case 3:
			tok, valid = "x.y.z", false
		case 4:
			tok, _ = other.Mint(auth.Identity{UserID: uid, Role: auth.RoleUser}, time.Hour)
			valid = false
		case 5:
			tok, _ = signer.Mint(auth.Identity{UserID: uid, Role: auth.RoleUser}, time.Hour)
			tok, valid = tok[:len(tok)-1], false
		}
		hdr := map[string]string{}
		if tok != "" {
			hdr["Authorization"] = "Bearer " + tok
		}
		a := send(t, "POST", s.base+"/api/v1/vouchers/"+url.PathEscape(id)+"/orders", body, hdr)
		if a.status >= 500 || a.body == nil || (a.status >= 400 && a.code() == "") {
			t.Fatalf("id %q: %d %s", id, a.status, a.raw)
		}
		routed := id != "" && !strings.Contains(id, "/")
		n, perr := strconv.ParseInt(id, 10, 64)
		switch {
		case !routed:
			if a.status == 202 {
				t.Fatalf("id %q off the route was accepted", id)
			}
		case !valid:
			if a.status != 401 || a.code() != "unauthorized" {
				t.Fatalf("bad token: %d %s", a.status, a.raw)
			}
		case perr != nil || n <= 0:
			if a.status != 400 || a.code() != "bad_request" {
				t.Fatalf("id %q: %d %s, want 400", id, a.status, a.raw)
			}
		case n != vid:
			if a.status != 404 || a.code() != "voucher_not_found" {
				t.Fatalf("id %q: %d %s, want 404", id, a.status, a.raw)
			}
		case bought[uid] != "":
			if a.status != 409 || a.code() != "already_purchased" || a.body["order_id"] != bought[uid] {
				t.Fatalf("second purchase of user %d: %d %s, want 409 with order %s", uid, a.status, a.raw, bought[uid])
			}
		default:
			if a.status != 202 {
				t.Fatalf("first purchase of user %d: %d %s", uid, a.status, a.raw)
			}
			bought[uid] = a.body["order_id"].(string)
		}
		v := send(t, "GET", s.base+"/api/v1/vouchers/"+vs, nil, nil)
		if got := v.body["stock"]; got != float64(stock-len(bought)) {
			t.Fatalf("live stock %v after %d purchases of %d", got, len(bought), stock)
		}
	})
}

// createBody is the voucher-create body as the API documents it.
type createBody struct {
	Title     string     `json:"title"`
	FaceValue *int64     `json:"face_value"`
	Stock     *int       `json:"stock"`
	BeginAt   *time.Time `json:"begin_at"`
	EndAt     *time.Time `json:"end_at"`
}

// expectCreate is the documented contract, written apart from the handler:
// the status a body must get (bodies over 16 KiB may get 413 instead).
func expectCreate(body []byte, now time.Time) (status int, title string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var b createBody
	if err := dec.Decode(&b); err != nil {
		return 400, ""
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return 400, ""
	}
	title = strings.TrimSpace(b.Title)
	lo, hi := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), now.AddDate(0, 0, 366)
	switch {
	case title == "" || utf8.RuneCountInString(title) > 200,
		b.FaceValue == nil || *b.FaceValue < 0 || *b.FaceValue > 1_000_000_000,
		b.Stock == nil || *b.Stock < 1 || *b.Stock > 10_000_000,
		b.BeginAt == nil || b.EndAt == nil || !b.BeginAt.Before(*b.EndAt) || !b.EndAt.After(now),
		b.BeginAt.Before(lo) || b.EndAt.After(hi):
		return 422, ""
	}
	return 201, title
}

// FuzzVoucherCreate: any body an admin sends. Never a 5xx; 400, 413, 422
// or 201 exactly as the documented contract says; a refused body adds no
// voucher and an accepted one adds exactly one, as sent.
func FuzzVoucherCreate(f *testing.F) {
	s := startWeb(f, map[string]string{"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn"})
	admin := token(f, 1, auth.RoleAdmin)
	g := s.db(f)
	at := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339) }
	good := fmt.Sprintf(`{"title":"t","face_value":100,"stock":5,"begin_at":%q,"end_at":%q}`, at(-time.Minute), at(time.Hour))
	end := at(30 * 24 * time.Hour) // within the longest sale
	for _, seed := range []string{
		good, "", "{", "[]", "null", "{}", `"x"`, good + good, good + "x", good[:len(good)-1] + `,"admin":true}`,
		`{"title":"  ","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","face_value":-1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","face_value":1,"stock":0,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","face_value":1,"stock":1e3,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","face_value":1,"stock":"1","begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","face_value":1,"stock":1,"begin_at":"` + end + `","end_at":"` + end + `"}`,
		`{"title":"t","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"2021-01-01T00:00:00Z"}`,
		`{"title":"t\u0000\u202e","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00+14:00","end_at":"` + end + `"}`,
		`{"title":"` + strings.Repeat("😀", 200) + `","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"\xff\xfe","face_value":1,"stock":10000000,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"t","title":"","face_value":1,"stock":1,"begin_at":"2020-01-01T00:00:00Z","end_at":"` + end + `"}`,
		`{"title":"` + strings.Repeat("a", 17<<10) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	count := func(t testing.TB) int64 {
		var n int64
		if err := g.Table("vouchers").Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := count(t)
		want, title := expectCreate(body, time.Now())
		a := send(t, "POST", s.base+"/api/v1/vouchers", body, map[string]string{"Authorization": "Bearer " + admin})
		if a.status >= 500 || a.body == nil || (a.status >= 400 && a.code() == "") {
			t.Fatalf("body %.300q: %d %s", body, a.status, a.raw)
		}
		if a.status != want && !(len(body) > 16<<10 && a.status == 413) {
			t.Fatalf("body %.300q: %d %s, want %d", body, a.status, a.raw, want)
		}
		added := count(t) - before
		switch {
		case a.status == 201 && added != 1:
			t.Fatalf("201 added %d vouchers", added)
		case a.status != 201 && added != 0:
			t.Fatalf("%d added %d vouchers", a.status, added)
		case a.status == 201 && a.body["voucher"].(map[string]any)["title"] != title:
			t.Fatalf("stored title %q, sent %q", a.body["voucher"].(map[string]any)["title"], title)
		}
	})
}
