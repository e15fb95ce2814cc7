package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/payment"
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

// payState is what a payment notification may change: every payment's
// status, every order's state and the notifications recorded.
func payState(t testing.TB, g *gorm.DB) string {
	t.Helper()
	var rows []struct {
		ID     int64
		Status string
	}
	var b strings.Builder
	for _, q := range []string{"SELECT id, status FROM payments ORDER BY id", "SELECT id, status FROM orders ORDER BY id"} {
		if err := g.Raw(q).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%v;", rows)
	}
	var n int64
	if err := g.Table("payment_notifications").Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "notifications=%d", n)
	return b.String()
}

// headerValue reports whether an HTTP client sends v as a header value
// (no control bytes but tab), and v as the server reads it (trimmed).
func headerValue(v string) (string, bool) {
	for i := range len(v) {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return "", false
		}
	}
	return strings.Trim(v, " \t"), true
}

// FuzzNotify: any timestamp, signature and body posted to the payment
// gateway's callback. Never a 5xx; every error is JSON with a code; an
// unsigned, wrongly signed or stale notification is refused with 401
// before its body is read, whatever the body; a refused notification
// changes no payment, order or recorded notification; only a fresh,
// rightly signed notification naming a payment with its amount is taken
// (200 succeeded, needs_refund or duplicate).
func FuzzNotify(f *testing.F) {
	const secret = "fuzz-gateway-secret-0123456789"
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req payment.GatewayRequest
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		_ = json.NewEncoder(w).Encode(payment.GatewayAnswer{PayURL: "https://gateway.example/pay/" + req.Reference})
	}))
	f.Cleanup(gw.Close)
	s := startWeb(f, map[string]string{
		"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn",
		"SECKILL_PAY_PROVIDER": "webhook", "SECKILL_PAY_WEBHOOK_SECRET": secret, "SECKILL_PAY_GATEWAY_URL": gw.URL,
	})
	g := s.db(f)
	const price = 700
	vid := createPriced(f, s.base, 10, price)
	// Three payments opened at the gateway, their orders awaiting them.
	refs := map[string]bool{}
	var first string
	for user := range int64(3) {
		tok := token(f, 500+user, auth.RoleUser)
		id := buyWritten(f, s.base, vid, tok)
		status, body := call(f, "POST", s.base+"/api/v1/orders/"+id+"/pay", tok, nil)
		ref, _ := body["payment"].(map[string]any)["reference"].(string)
		if status != http.StatusOK || ref == "" {
			f.Fatalf("pay order %s: %d %v", id, status, body)
		}
		refs[ref] = true
		if first == "" {
			first = ref
		}
	}
	note := func(id, ref string, amount int64) []byte {
		return fmt.Appendf(nil, `{"notification_id":%q,"reference":%q,"amount":%d,"status":"succeeded"}`, id, ref, amount)
	}
	for ref := range refs {
		f.Add(uint8(0), "", uint8(0), "", note("n-"+ref, ref, price)) // taken
	}
	for i, body := range [][]byte{
		note("n-x", first, price), note("n-x", first, price+1), note("n-y", "pay_unknown", price), note("", first, price),
		[]byte(`{"notification_id":"n","reference":"` + first + `","amount":700,"status":"failed"}`),
		[]byte(`{"notification_id":"n","reference":"` + first + `","amount":-700,"status":"succeeded"}`),
		[]byte(`{"notification_id":"` + strings.Repeat("n", 65) + `","reference":"` + first + `","amount":700,"status":"succeeded"}`),
		[]byte(`[`), []byte(`null`), []byte(``), []byte("\xff"), bytes.Repeat([]byte("x"), 65<<10),
	} {
		for sig := range uint8(5) {
			f.Add(uint8(i%4), "", sig, "", body)
		}
	}
	for _, ts := range []string{"", "0", "-1", "+0", "1e9", "9223372036854775807", "9223372036854775808", "０", " 1 ", "1\t"} {
		f.Add(uint8(3), ts, uint8(0), "", note("n-ts", first, price))
	}
	for _, sig := range []string{"", "sha256=", "sha256=" + strings.Repeat("0", 64), "SHA256=", " ", "\t"} {
		f.Add(uint8(0), "", uint8(4), sig, note("n-sig", first, price))
	}

	f.Fuzz(func(t *testing.T, tsMode uint8, tsRaw string, sigMode uint8, sigRaw string, body []byte) {
		now := time.Now()
		var ts string
		switch tsMode % 4 {
		case 0:
			ts = strconv.FormatInt(now.Unix(), 10)
		case 1:
			ts = strconv.FormatInt(now.Add(-10*time.Minute).Unix(), 10)
		case 2:
			ts = strconv.FormatInt(now.Add(10*time.Minute).Unix(), 10)
		case 3:
			ts = tsRaw
		}
		hdr := map[string]string{auth.WebhookTimestampHeader: ts}
		switch sigMode % 5 {
		case 0:
			hdr[auth.WebhookSignatureHeader] = auth.Sign([]byte(secret), ts, body)
		case 1: // no signature header
		case 2:
			hdr[auth.WebhookSignatureHeader] = ""
		case 3:
			hdr[auth.WebhookSignatureHeader] = auth.Sign([]byte("not-the-gateway-secret-at-all"), ts, body)
		case 4:
			hdr[auth.WebhookSignatureHeader] = sigRaw
		}
		// What the server reads: values trimmed; one a client cannot send
		// is not a case.
		for _, v := range hdr {
			if _, ok := headerValue(v); !ok {
				t.Skip("not a header value")
			}
		}
		sts, _ := headerValue(hdr[auth.WebhookTimestampHeader])
		ssig, _ := headerValue(hdr[auth.WebhookSignatureHeader])
		signed := ssig == auth.Sign([]byte(secret), sts, body)
		sec, perr := strconv.ParseInt(sts, 10, 64)
		age := now.Sub(time.Unix(sec, 0))
		fresh := perr == nil && age < 5*time.Minute-5*time.Second && age > -5*time.Minute+5*time.Second
		stale := perr == nil && (age > 5*time.Minute+5*time.Second || age < -5*time.Minute-5*time.Second)

		before := payState(t, g)
		a := send(t, "POST", s.base+"/api/v1/payments/notify", body, hdr)
		after := payState(t, g)
		if a.status >= 500 || a.body == nil || (a.status >= 400 && a.code() == "") {
			t.Fatalf("ts %q sig %q body %.200q: %d %s", sts, ssig, body, a.status, a.raw)
		}
		if a.status != http.StatusOK && after != before {
			t.Fatalf("refused (%d %s) but the payments changed:\n%s\n%s", a.status, a.raw, before, after)
		}
		switch {
		case len(body) > 64<<10:
			if a.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("a body of %d bytes: %d %s, want 413", len(body), a.status, a.raw)
			}
		case !signed:
			if a.status != http.StatusUnauthorized || a.code() != "bad_signature" {
				t.Fatalf("ts %q sig %q not signed right: %d %s, want 401 bad_signature", sts, ssig, a.status, a.raw)
			}
		case stale:
			if a.status != http.StatusUnauthorized || a.code() != "stale_notification" {
				t.Fatalf("ts %q signed but stale: %d %s, want 401 stale_notification", sts, a.status, a.raw)
			}
		case fresh && a.status == http.StatusOK:
			var n payment.Notification
			if err := json.Unmarshal(body, &n); err != nil || !refs[n.Reference] || n.Amount != price {
				t.Fatalf("body %.200q taken (%s) but it names no payment with its amount", body, a.raw)
			}
			if st := a.body["status"]; st != "succeeded" && st != "needs_refund" && st != "duplicate" {
				t.Fatalf("taken with status %v", st)
			}
		case fresh:
			if a.status != http.StatusBadRequest && a.status != http.StatusNotFound && a.status != http.StatusUnprocessableEntity {
				t.Fatalf("signed, fresh body %.200q: %d %s, want 200, 400, 404 or 422", body, a.status, a.raw)
			}
		}
	})
}

// lifeRoutes are the lifecycle routes the fuzzer drives, and whether only
// an admin may call them.
var lifeRoutes = []struct {
	name  string
	admin bool
}{{"pay", false}, {"cancel", false}, {"redeem", true}, {"refund", true}}

// lifeModel is the documented lifecycle, written apart from the code: the
// state an order in from ends in after the route, or "" when the route is
// refused (409 wrong_state). A repeat of a move answers the order as it is.
func lifeModel(route, from string) string {
	moves := map[string]map[string]string{
		"pay":    {"awaiting_payment": "paid", "paid": "paid", "used": "used"},
		"cancel": {"awaiting_payment": "cancelled", "cancelled": "cancelled"},
		"redeem": {"paid": "used", "used": "used"},
		"refund": {"paid": "refunded", "refunded": "refunded"},
	}
	return moves[route][from]
}

// FuzzLifecycle: the lifecycle routes (pay, cancel, redeem, refund) with
// any id, caller and body, on orders of a priced sale paid with the dev
// provider. Never a 5xx; every error JSON with a code; 401 for a bad
// token, 403 for a buyer on an admin route, 400 for an id that is not a
// positive number, 404 for an unknown id or someone else's order; on an
// order, exactly the documented move (or 409 wrong_state and nothing
// changed). After each call the order's payments fit its state (one
// succeeded when paid or used, one owed back (order_refunded) when
// refunded, none otherwise) and the sale's units add up.
func FuzzLifecycle(f *testing.F) {
	s := startWeb(f, map[string]string{"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn", "SECKILL_PAY_PROVIDER": "dev"})
	g := s.db(f)
	vid := createPriced(f, s.base, 1000, 900)
	signer, err := auth.NewSigner([]byte(testSecret))
	if err != nil {
		f.Fatal(err)
	}
	other, _ := auth.NewSigner([]byte("not-the-secret-not-the-secret-xx"))
	mint := func(sg *auth.Signer, user int64, role string) string {
		tok, err := sg.Mint(auth.Identity{UserID: user, Role: role}, time.Hour)
		if err != nil {
			f.Fatal(err)
		}
		return tok
	}
	admin := mint(signer, 1, auth.RoleAdmin)

	// slots are orders the fuzzer acts on; one that ended (cancelled,
	// refunded) is bought again by a new buyer.
	type slot struct {
		id, state string
		buyer     int64
		tok       string
	}
	const slots = 4
	var ss [slots]slot
	nextBuyer := int64(10_000)
	fresh := func(t testing.TB, k int) {
		nextBuyer++
		tok := mint(signer, nextBuyer, auth.RoleUser)
		ss[k] = slot{id: buyWritten(t, s.base, vid, tok), state: "awaiting_payment", buyer: nextBuyer, tok: tok}
	}
	for k := range slots {
		fresh(f, k)
	}

	for route := range uint8(len(lifeRoutes)) {
		for who := range uint8(5) {
			f.Add(route, who, int8(route), "", []byte(nil))
		}
		for _, id := range []string{"0", "-1", "abc", "9223372036854775807", "9223372036854775808", "", "/", "..", "%", "1/2", " 1", "１", "1e3", "0x1f", "123"} {
			f.Add(route, uint8(2), int8(-1), id, []byte(nil))
			f.Add(route, uint8(0), int8(-1), id, []byte(`{"status":"paid"}`))
		}
		f.Add(route, uint8(2), int8(0), "", []byte(`{"amount":0,"order_id":"1"}`))
		f.Add(route, uint8(0), int8(1), "", bytes.Repeat([]byte("x"), 70<<10))
	}
	// A walk through the lifecycle on slot 2: pay, redeem, refund (used:
	// refused), and slot 3: pay, refund, pay (refunded: refused).
	for _, step := range [][2]uint8{{0, 0}, {2, 2}, {3, 2}, {1, 0}} {
		f.Add(step[0], step[1], int8(2), "", []byte(nil))
	}
	for _, step := range [][2]uint8{{0, 0}, {3, 2}, {3, 2}, {0, 0}} {
		f.Add(step[0], step[1], int8(3), "", []byte(nil))
	}

	f.Fuzz(func(t *testing.T, route, who uint8, slotPick int8, id string, body []byte) {
		r := lifeRoutes[int(route)%len(lifeRoutes)]
		var sl *slot
		if slotPick >= 0 {
			sl = &ss[int(slotPick)%slots]
			id = sl.id
		}
		// who: the order's buyer, another buyer, an admin, no token, a
		// token not signed by the service.
		var tok string
		switch who % 5 {
		case 0:
			tok = mint(signer, 20_000, auth.RoleUser)
			if sl != nil {
				tok = sl.tok
			}
		case 1:
			tok = mint(signer, 30_000, auth.RoleUser)
		case 2:
			tok = admin
		case 4:
			tok = mint(other, 20_000, auth.RoleAdmin)
		}
		hdr := map[string]string{"Content-Type": "application/json"}
		if tok != "" {
			hdr["Authorization"] = "Bearer " + tok
		}
		a := send(t, "POST", s.base+"/api/v1/orders/"+url.PathEscape(id)+"/"+r.name, body, hdr)
		if a.status >= 500 || a.body == nil || (a.status >= 400 && a.code() == "") {
			t.Fatalf("%s of %q: %d %s", r.name, id, a.status, a.raw)
		}
		routed := id != "" && !strings.Contains(id, "/") && id != "." && id != ".."
		n, perr := strconv.ParseInt(id, 10, 64)
		want, code := 0, ""
		switch {
		case !routed:
			if a.status == http.StatusOK {
				t.Fatalf("%s of %q off the route answered 200", r.name, id)
			}
			return
		case who%5 == 3 || who%5 == 4:
			want, code = http.StatusUnauthorized, "unauthorized"
		case r.admin && who%5 != 2:
			want, code = http.StatusForbidden, "forbidden"
		case perr != nil || n <= 0:
			want, code = http.StatusBadRequest, "bad_request"
		case sl == nil || who%5 == 1:
			want, code = http.StatusNotFound, "order_not_found"
		case lifeModel(r.name, sl.state) == "":
			want, code = http.StatusConflict, "wrong_state"
		default:
			want = http.StatusOK
		}
		if a.status != want || (code != "" && a.code() != code) {
			t.Fatalf("%s of %q (%v) by %d: %d %s, want %d %s", r.name, id, sl, who%5, a.status, a.raw, want, code)
		}
		if sl == nil {
			return
		}
		if want == http.StatusOK {
			sl.state = lifeModel(r.name, sl.state)
			got := a.body["status"]
			if o, ok := a.body["order"].(map[string]any); ok { // pay answers the order and its payment
				got = o["status"]
			}
			if got != sl.state {
				t.Fatalf("%s of order %s answered %v, want %s", r.name, id, got, sl.state)
			}
		}
		checkOrderPayments(t, g, sl.id, sl.state)
		var total, stock, live int64
		if err := g.Raw("SELECT total_stock, stock FROM vouchers WHERE id = ?", vid).Row().Scan(&total, &stock); err != nil {
			t.Fatal(err)
		}
		if err := g.Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ? AND live = 1", vid).Scan(&live).Error; err != nil {
			t.Fatal(err)
		}
		if total != stock+live {
			t.Fatalf("total stock %d, stock %d + live orders %d", total, stock, live)
		}
		if sl.state == "cancelled" || sl.state == "refunded" {
			fresh(t, int(slotPick)%slots)
		}
	})
}

// checkOrderPayments checks that an order is in state, and its payments
// fit it: paid or used, one succeeded; refunded, one owed back for the
// refund; awaiting payment or cancelled (never paid), none.
func checkOrderPayments(t testing.TB, g *gorm.DB, id, state string) {
	t.Helper()
	var got string
	if err := g.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&got).Error; err != nil {
		t.Fatal(err)
	}
	var ps []struct {
		Status       string
		RefundReason *string
	}
	if err := g.Raw("SELECT status, refund_reason FROM payments WHERE order_id = ?", id).Scan(&ps).Error; err != nil {
		t.Fatal(err)
	}
	ok := got == state
	switch state {
	case "paid", "used":
		ok = ok && len(ps) == 1 && ps[0].Status == payment.StatusSucceeded
	case "refunded":
		ok = ok && len(ps) == 1 && ps[0].Status == payment.StatusNeedsRefund && ps[0].RefundReason != nil && *ps[0].RefundReason == payment.ReasonOrderRefunded
	default:
		ok = ok && len(ps) == 0
	}
	if !ok {
		t.Fatalf("order %s is %s with payments %+v, want %s with payments to fit", id, got, ps, state)
	}
}
