package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/auth"
)

// dbFigures is a voucher's sale as the database holds it, counted here
// the test's own way, to hold the console's figures against.
type dbFigures struct {
	stockLeft, sold, awaiting, paid, used, cancelled, expired, refunded, revenue int64
}

func readFigures(t testing.TB, s webService, vid int64) dbFigures {
	t.Helper()
	g := s.db(t)
	var f dbFigures
	if err := g.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&f.stockLeft).Error; err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Status, Reason string
		N, Amount      int64
	}
	if err := g.Raw("SELECT status, COALESCE(cancel_reason, '') AS reason, COUNT(*) AS n, SUM(amount) AS amount FROM orders WHERE voucher_id = ? GROUP BY status, reason", vid).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch {
		case r.Status == "awaiting_payment":
			f.awaiting = r.N
		case r.Status == "paid":
			f.paid, f.revenue = r.N, f.revenue+r.Amount
		case r.Status == "used":
			f.used, f.revenue = r.N, f.revenue+r.Amount
		case r.Status == "cancelled" && r.Reason == "expired":
			f.expired = r.N
		case r.Status == "cancelled":
			f.cancelled = r.N
		case r.Status == "refunded":
			f.refunded = r.N
		}
	}
	f.sold = f.awaiting + f.paid + f.used
	return f
}

// cells is how the console's row spells the figures (data-n of each cell,
// revenue in cents).
func (f dbFigures) cells() string {
	return fmt.Sprintf("%d %d %d %d %d %d %d %d %d", f.stockLeft, f.sold, f.awaiting, f.paid, f.used, f.cancelled, f.expired, f.refunded, f.revenue)
}

// figuresRowJS reads a voucher's row of the console's figures table in the
// order of dbFigures.cells.
const figuresRowJS = `(() => {
	const tr = document.querySelector('#figures tr[data-voucher-id="%d"]');
	if (!tr) return "";
	return [...tr.querySelectorAll("td[data-n]")].map(td => td.dataset.n).concat([tr.dataset.revenue]).join(" ");
})()`

// TestConsoleInBrowser drives the shop's console (/admin) in chromium as
// the shop's staff during a priced sale: a shopper's token is refused and
// an admin token pasted opens it; the live figures change while buyers buy
// and pay and agree with the database; an order is found by its voucher
// code; the code is redeemed, and redeemed again is refused with the time
// it was used; an order found by its id is refunded, asked first (one
// click refunds nothing, Keep takes it back, Confirm refund refunds), its
// money listed to return, and marked returned; a buyer is found by the
// phone typed as staff type it (138 0013 8000, 13800138000, 138-0013-8000,
// +86 138 0013 8000); a voucher is created with its price. At desktop and
// phone sizes (390px: nothing scrolls sideways, the figures a card per
// voucher), with screenshots as artifacts.
//
// Not parallel, as TestSaleInBrowser.
func TestConsoleInBrowser(t *testing.T) {
	ctx := browser(t)
	s := startWeb(t, map[string]string{"SECKILL_PAY_WINDOW": "10m", "SECKILL_PAY_PROVIDER": "dev"})
	adminTok := token(t, 1, auth.RoleAdmin)
	vid := func() int64 {
		a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", adminTok, map[string]any{
			"title": "¥50 for ¥9.90", "face_value": 5000, "price": 990, "stock": 30,
			"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
		})
		if a.status != 201 {
			t.Fatalf("create voucher: %d %s", a.status, a.raw)
		}
		return int64(a.body["voucher"].(map[string]any)["id"].(float64))
	}()

	tctx, cancel := context.WithTimeout(ctx, 150*time.Second)
	defer cancel()
	b := tab{t: t, ctx: tctx, dir: artifacts(t)}
	do, text, shot, visible := b.do, b.text, b.shot, waitVisible
	row := func() string {
		t.Helper()
		v, err := chromedp.Run(tctx, chromedp.Evaluate[string](fmt.Sprintf(figuresRowJS, vid)))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// agree waits until the console's row shows what the database holds.
	agree := func(what string) dbFigures {
		t.Helper()
		var f dbFigures
		deadline := time.Now().Add(15 * time.Second)
		for {
			f = readFigures(t, s, vid)
			if row() == f.cells() {
				return f
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the console shows %q, the database %q", what, row(), f.cells())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Staff sign in with a token; a shopper's is refused.
	do("open the console", chromedp.Navigate(s.base+"/admin"), visible("#token-form"))
	do("a shopper's token", chromedp.SetValue(chromedp.ID("token"), token(t, 5, auth.RoleUser)), chromedp.Click(chromedp.ID("use-token")),
		visible("#token-msg.bad"))
	do("the admin token", chromedp.SetValue(chromedp.ID("token"), "Bearer "+adminTok), chromedp.Click(chromedp.ID("use-token")),
		visible("#figures-panel"), visible(fmt.Sprintf(`#figures tr[data-voucher-id="%d"]`, vid)))
	before := agree("before the sale")
	if before.sold != 0 || before.stockLeft != 30 {
		t.Fatalf("figures before the sale: %+v", before)
	}

	// Buyers buy while the console watches: 8 grab, 5 pay, 1 cancels.
	var orders []string
	for u := range int64(8) {
		orders = append(orders, buyWritten(t, s.base, strconv.FormatInt(vid, 10), token(t, 100+u, auth.RoleUser)))
	}
	agree("after 8 grabs")
	for i := range 5 {
		if a := sendJSON(t, "POST", s.base+"/api/v1/orders/"+orders[i]+"/pay", token(t, 100+int64(i), auth.RoleUser), nil); a.status != 200 {
			t.Fatalf("pay: %d %s", a.status, a.raw)
		}
	}
	if a := sendJSON(t, "POST", s.base+"/api/v1/orders/"+orders[7]+"/cancel", token(t, 107, auth.RoleUser), nil); a.status != 200 {
		t.Fatalf("cancel: %d %s", a.status, a.raw)
	}
	f := agree("after 5 payments and a cancel")
	if f.sold != 7 || f.paid != 5 || f.awaiting != 2 || f.cancelled != 1 || f.revenue != 5*990 || f.stockLeft != 23 {
		t.Fatalf("the sale in the database: %+v", f)
	}
	if rate := text(fmt.Sprintf(`#figures tr[data-voucher-id="%d"] td[data-k="per_second"]`, vid)); rate == "0.0" {
		t.Errorf("purchases per second read %s right after 8 purchases", rate)
	}
	shot("console-figures-desktop.png")

	// Find an order by the code its buyer shows.
	var code string
	if err := s.db(t).Raw("SELECT code FROM orders WHERE id = ?", orders[0]).Scan(&code).Error; err != nil || len(code) != 10 {
		t.Fatalf("code of order %s: %q %v", orders[0], code, err)
	}
	do("search by code", chromedp.SetValue(chromedp.ID("q"), strings.ToLower(code)), chromedp.Click(chromedp.ID("search")),
		visible(fmt.Sprintf(`#found li[data-code="%s"]`, code)))
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll("#found li").length`)); err != nil || n != 1 {
		t.Errorf("search by code found %d orders (%v)", n, err)
	}

	// Redeem by the code, then again: refused, with when it was used.
	do("redeem by code", chromedp.SetValue(chromedp.ID("r-code"), code), chromedp.Click(chromedp.ID("r-redeem")),
		visible(`#redeem-msg[data-code="redeemed"]`))
	var status string
	if err := s.db(t).Raw("SELECT status FROM orders WHERE id = ?", orders[0]).Scan(&status).Error; err != nil || status != "used" {
		t.Fatalf("order redeemed in the console: %q %v", status, err)
	}
	shot("console-redeemed-desktop.png")
	do("redeem again", chromedp.SetValue(chromedp.ID("r-code"), code), chromedp.Click(chromedp.ID("r-redeem")),
		visible(`#redeem-msg[data-code="code_used"]`))
	if msg := text("#redeem-msg"); !strings.HasPrefix(msg, "Already used at ") {
		t.Errorf("a code redeemed twice reads %q", msg)
	}

	// Refund an order found by its id: its money is listed to return, and
	// marked returned.
	refunded := orders[1]
	item := fmt.Sprintf(`#found li[data-order-id="%s"]`, refunded)
	do("search by order id", chromedp.SetValue(chromedp.ID("q"), refunded), chromedp.Click(chromedp.ID("search")),
		visible(item+`[data-status="paid"] .refund:enabled`))
	// Refund asks first: one click refunds nothing, Keep takes it back.
	stillPaid := func(when string) {
		t.Helper()
		var st string
		if err := s.db(t).Raw("SELECT status FROM orders WHERE id = ?", refunded).Scan(&st).Error; err != nil || st != "paid" {
			t.Fatalf("%s: order %s is %q (%v), want paid", when, refunded, st, err)
		}
		if n := len(readRefunds(t, s, adminTok)); n != 0 {
			t.Fatalf("%s: %d payments listed to return, want none", when, n)
		}
	}
	do("refund, once", chromedp.Click(chromedp.CSS(item+" .refund")),
		visible(item+`[data-status="paid"] .confirm-refund:enabled`), visible(item+" .keep"))
	if label, msg := text(item+" .confirm-refund"), text("#search-msg"); label != "Confirm refund ¥9.90" || !strings.HasPrefix(msg, "Refund order "+refunded+"?") {
		t.Errorf("the refund asks %q with %q", msg, label)
	}
	stillPaid("Refund clicked once")
	shot("console-refund-confirm-desktop.png")
	do("keep the order", chromedp.Click(chromedp.CSS(item+" .keep")),
		visible(item+`[data-status="paid"] .refund:enabled`), chromedp.WaitNotPresent(chromedp.CSS(item+" .confirm-refund")))
	stillPaid("Keep clicked")
	do("refund, confirmed", chromedp.Click(chromedp.CSS(item+" .refund")), visible(item+" .confirm-refund"),
		chromedp.Click(chromedp.CSS(item+" .confirm-refund")),
		visible(item+`[data-status="refunded"]`),
		visible(fmt.Sprintf(`#refunds li[data-order-id="%s"]`, refunded)))
	f = agree("after a redeem and a refund")
	if f.used != 1 || f.refunded != 1 || f.paid != 3 || f.revenue != 4*990 || f.stockLeft != 24 {
		t.Fatalf("the sale in the database: %+v", f)
	}
	shot("console-refund-desktop.png")
	do("mark the money returned", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#refunds li[data-order-id="%s"] button`, refunded))),
		visible("#refunds-empty"))
	var pay string
	if err := s.db(t).Raw("SELECT status FROM payments WHERE order_id = ?", refunded).Scan(&pay).Error; err != nil || pay != "refunded" {
		t.Fatalf("payment of order %s after Mark returned: %q %v", refunded, pay, err)
	}

	// A buyer known by a phone is found by the number as staff type it:
	// national (no +86), spaced, dashed, or international. An empty search
	// between two shows each one's own answer.
	const buyerPhone = "+8613800138000"
	buyerTok, _, _ := s.login(t, buyerPhone)
	phoneOrder := buyWritten(t, s.base, strconv.FormatInt(vid, 10), buyerTok)
	if a := sendJSON(t, "POST", s.base+"/api/v1/orders/"+phoneOrder+"/pay", buyerTok, nil); a.status != 200 {
		t.Fatalf("pay: %d %s", a.status, a.raw)
	}
	for _, typed := range []string{"138 0013 8000", "13800138000", "138-0013-8000", "+86 138 0013 8000"} {
		do("search for nothing", chromedp.SetValue(chromedp.ID("q"), "no such order"), chromedp.Click(chromedp.ID("search")),
			visible("#found-empty"))
		do("search by phone "+typed, chromedp.SetValue(chromedp.ID("q"), typed), chromedp.Click(chromedp.ID("search")),
			visible(fmt.Sprintf(`#found li[data-order-id="%s"]`, phoneOrder)))
		if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll("#found li").length`)); err != nil || n != 1 {
			t.Errorf("search by %q found %d orders (%v), want the buyer's one", typed, n, err)
		}
		if got := text("#found li"); !strings.Contains(got, buyerPhone) {
			t.Errorf("search by %q: %q does not show the buyer's phone", typed, got)
		}
	}

	// A new voucher, its price and pay window explained beside the fields.
	if hint := text("#create-panel"); !strings.Contains(hint, "pay window") || !strings.Contains(hint, "What a buyer pays") {
		t.Errorf("the new voucher form explains nothing: %q", hint)
	}
	do("create a voucher", chromedp.SendKeys(chromedp.ID("v-title"), "Made in the console"),
		chromedp.SendKeys(chromedp.ID("v-face"), "12.50"), chromedp.SendKeys(chromedp.ID("v-price"), "9.90"),
		chromedp.SendKeys(chromedp.ID("v-stock"), "7"), chromedp.Click(chromedp.ID("v-create")),
		visible("#admin-msg.ok"))
	var made struct {
		ID               int64
		FaceValue, Price int64
		TotalStock       int
	}
	if err := s.db(t).Raw("SELECT id, face_value, price, total_stock FROM vouchers WHERE title = ?", "Made in the console").Scan(&made).Error; err != nil ||
		made.FaceValue != 1250 || made.Price != 990 || made.TotalStock != 7 {
		t.Fatalf("voucher made in the console: %+v, %v", made, err)
	}
	do("it shows in the figures", visible(fmt.Sprintf(`#figures tr[data-voucher-id="%d"]`, made.ID)))

	// On a phone nothing scrolls sideways, the page nor the figures'
	// table: each voucher's figures are a card, every figure on the
	// screen beside its name.
	do("phone-sized", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	agree("on a phone")
	do("search on a phone", chromedp.SetValue(chromedp.ID("q"), "138 0013 8000"), chromedp.Click(chromedp.ID("search")),
		visible(fmt.Sprintf(`#found li[data-order-id="%s"][data-status="paid"] .refund:enabled`, phoneOrder)))
	shot("console-phone.png")
	fit, err := chromedp.Run(tctx, chromedp.Poll[phoneFit](phoneFitJS, chromedp.WithPollingTimeout(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if p := fit.problem(); p != "" {
		t.Errorf("the console on a 390px phone: %s (%+v)", p, fit)
	}
	if label, err := chromedp.Run(tctx, chromedp.Evaluate[string](fmt.Sprintf(
		`getComputedStyle(document.querySelector('#figures tr[data-voucher-id="%d"] td[data-k="refunded"]'), "::before").content`, vid))); err != nil || label != `"Refunded"` {
		t.Errorf("a figure on a phone is labelled %s (%v), want \"Refunded\"", label, err)
	}
	do("refund asks on a phone too", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#found li[data-order-id="%s"] .refund`, phoneOrder))),
		visible(fmt.Sprintf(`#found li[data-order-id="%s"] .confirm-refund`, phoneOrder)))
	shot("console-phone-refund-confirm.png")
}

// readRefunds is the console's list of money to return.
func readRefunds(t testing.TB, s webService, tok string) []any {
	t.Helper()
	a := sendJSON(t, "GET", s.base+"/api/v1/admin/refunds", tok, nil)
	if a.status != 200 {
		t.Fatalf("refunds: %d %s", a.status, a.raw)
	}
	p, _ := a.body["payments"].([]any)
	return p
}

// phoneFitJS measures what could scroll sideways on the console: the page,
// the figures' box, and the right edge of the widest figure cell; ready
// once the figures are drawn.
const phoneFitJS = `(() => {
	const cells = [...document.querySelectorAll("#figures tbody th, #figures tbody td")];
	if (cells.length === 0) return null;
	const box = document.querySelector("#figures-panel .scroll");
	return {
		page: document.scrollingElement.scrollWidth, viewport: window.innerWidth,
		box: box.scrollWidth, boxVisible: box.clientWidth,
		rightmost: Math.max(...cells.map(c => c.getBoundingClientRect().right)),
		rows: document.querySelectorAll("#figures tbody tr").length,
	};
})()`

type phoneFit struct {
	Page, Viewport, Box, BoxVisible, Rightmost float64
	Rows                                       int
}

// problem says what scrolls sideways, or "".
func (f phoneFit) problem() string {
	switch {
	case f.Rows == 0:
		return "no figures"
	case f.Page > f.Viewport:
		return "the page scrolls sideways"
	case f.Box > f.BoxVisible:
		return "the figures' table scrolls sideways"
	case f.Rightmost > f.Viewport:
		return "a figure is off the screen"
	}
	return ""
}
