package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// browser starts Debian's chromium, headless, with its own profile and
// nothing that reaches for the network; it is killed on cleanup. Without
// chromium the test skips, or fails under CI=true.
func browser(t testing.TB) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (scripts/deps.sh installs it)")
		}
		t.Skip("chromium is not installed; scripts/deps.sh installs it")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(1200, 900),
		// Not the machine's zone (often UTC), and a half-hour offset: dates
		// the page shows must be the device's local time.
		chromedp.Env("TZ=" + browserTZ),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	return ctx
}

// browserTZ is chromium's time zone; browserZone is the same in Go (no
// daylight saving time in India).
const browserTZ = "Asia/Kolkata"

var browserZone = time.FixedZone("IST", 5*3600+1800)

// artifacts is where screenshots go: $SECKILL_ARTIFACTS, else a test dir.
func artifacts(t testing.TB) string {
	dir := os.Getenv("SECKILL_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tab drives a browser tab for a test: each step fails the test on an
// error; screenshots go to dir.
type tab struct {
	t   *testing.T
	ctx context.Context
	dir string
}

func (b tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b tab) text(sel string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// shot saves a screenshot of the whole page, scrolled to the top first: a
// sticky bar would be drawn where the page was scrolled to.
func (b tab) shot(name string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`(window.scrollTo(0, 0), true)`)); err != nil {
		b.t.Fatalf("screenshot %s: scroll to the top: %v", name, err)
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(b.dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// waitVisible waits until the element sel names is visible.
func waitVisible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(chromedp.CSS(sel))
}

// waitCode polls the outbox until a code for phone is there: the page
// asks for it asynchronously.
func waitCode(t testing.TB, outbox, phone string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(outbox); err == nil && strings.Contains(string(b), "dev sms to "+phone+":") {
			return lastCode(t, outbox, phone)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no code for %s in the outbox within 10s", phone)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSaleInBrowser drives the shop page in chromium: a sold-out and an
// upcoming voucher's buttons are disabled, a sale more than a day away shows
// its local start date, not a countdown; on a phone-sized screen the phone
// field and the resend button sit side by side without overlap (stacked on
// a very narrow one); log in with a code read from the sender; grab a free
// voucher, watch pending turn into paid and the button turn into a disabled
// "Yours" with its voucher code; a voucher bought elsewhere reads "already
// yours" and "Yours" too, and both stay "Yours" after a reload; my orders;
// a priced voucher reads what the buyer pays first, its grab is "Reserved,
// pay within m:ss" counting down (never "Yours" before the payment), with
// one Pay and one Cancel on the page (on the card; My orders says so), and
// once paid with Pay it is "Yours" with its code and how to use it, no
// order id anywhere: the code big and monospace, whole on a 320px screen,
// copied by its Copy button (to the clipboard, or from a selection without
// navigator.clipboard); another buyer's is cancelled with Cancel and its unit
// is on sale again; a sold-out voucher whose only order was never paid
// reopens when it expires; no token box for shoppers; only an admin is
// linked to the console. Screenshots are saved as artifacts.
//
// It is not parallel: chromium's processes would starve the load tests of
// this package (the embedded flash sale has 1s Redis timeouts) on 2 cores.
func TestSaleInBrowser(t *testing.T) {
	ctx := browser(t)
	const buyer, buyer2, admin = "+8613800138000", "+8613700000000", "+8613900000000"
	// The window to pay is long enough for a press under load, short enough
	// that an unpaid order expires while the test runs.
	const payWindow = 20 * time.Second
	s := startWeb(t, map[string]string{
		"SECKILL_ADMIN_PHONES": admin, "SECKILL_PAY_WINDOW": payWindow.String(), "SECKILL_PAY_PROVIDER": "dev",
	})

	onSale := createVoucher(t, s.base, 5)
	elsewhere := createVoucher(t, s.base, 5)
	soldOut := createVoucher(t, s.base, 1)
	if a := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, soldOut), token(t, 77, auth.RoleUser), nil); a.status != 202 {
		t.Fatalf("buy the sold-out voucher's only unit: %d %s", a.status, a.raw)
	}
	newVoucher := func(title string, begin, end time.Time, stock int, price int64) int64 {
		t.Helper()
		a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
			"title": title, "face_value": 5000, "price": price, "stock": stock,
			"begin_at": begin.Format(time.RFC3339), "end_at": end.Format(time.RFC3339),
		})
		if a.status != 201 {
			t.Fatalf("create voucher %q: %d %s", title, a.status, a.raw)
		}
		return int64(a.body["voucher"].(map[string]any)["id"].(float64))
	}
	upcoming := newVoucher("Tonight's ¥50 flash", time.Now().Add(time.Hour), time.Now().Add(3*time.Hour), 20, 0)
	farBegin := time.Now().Add(3*24*time.Hour + 7*time.Hour).Truncate(time.Minute)
	farOff := newVoucher("Next week's ¥50 flash", farBegin, farBegin.Add(2*time.Hour), 20, 0)
	priced := newVoucher("¥50 for ¥9.90", time.Now().Add(-time.Minute), time.Now().Add(time.Hour), 2, 990)
	expiring := newVoucher("¥50 for ¥5", time.Now().Add(-time.Minute), time.Now().Add(time.Hour), 1, 500)

	// Script errors and CSP violations fail the test (watchConsole).
	defer watchConsole(t, ctx)()

	tctx, cancel := context.WithTimeout(ctx, 180*time.Second)
	defer cancel()
	b := tab{t: t, ctx: tctx, dir: artifacts(t)}
	do, text, shot, visible := b.do, b.text, b.shot, waitVisible
	card := func(id int64) string { return fmt.Sprintf(`li[data-voucher-id="%d"]`, id) }

	do("open the page", chromedp.Navigate(s.base+"/"),
		visible(card(onSale)+`[data-phase="on_sale"] .grab:enabled`),
		visible(card(soldOut)+`[data-phase="sold_out"] .grab:disabled`),
		visible(card(upcoming)+`[data-phase="upcoming"] .grab:disabled`),
		visible(card(farOff)+`[data-phase="upcoming"] .grab:disabled`))
	// The only unit of this one is grabbed elsewhere and never paid: sold
	// out until its order expires (grabbed once the page is up, so a slow
	// browser start does not eat the window).
	if a := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, expiring), token(t, 78, auth.RoleUser), nil); a.status != 202 {
		t.Fatalf("grab the expiring voucher's only unit: %d %s", a.status, a.raw)
	}
	do("the expiring voucher sells out", visible(card(expiring)+`[data-phase="sold_out"] .grab:disabled`))
	if sold, when := text(card(soldOut)+" .grab"), text(card(upcoming)+" .v-when"); sold != "Sold out" || !strings.HasPrefix(when, "Starts in 00:59:") {
		t.Errorf("sold-out button %q, upcoming countdown %q", sold, when)
	}
	if got, want := text(card(farOff)+" .v-when"), "Starts "+farBegin.In(browserZone).Format("Mon 2 Jan 2006, 15:04"); got != want {
		t.Errorf("a sale three days away reads %q, want %q (its local start)", got, want)
	}
	if ends := text(card(onSale) + " .v-when"); !strings.HasPrefix(ends, "Ends in 00:5") {
		t.Errorf("a sale ending within the hour reads %q, want a countdown", ends)
	}
	// What the buyer pays is the main figure, what it is worth beside it.
	if free, paid, worth := text(card(onSale)+" .v-price"), text(card(priced)+" .v-price"), text(card(priced)+" .v-face"); free != "Free" || paid != "¥9.90" || worth != "worth ¥50" {
		t.Errorf("prices: %q and %q worth %q, want Free and ¥9.90 worth ¥50", free, paid, worth)
	}
	// No empty line under a card's button, no token box for shoppers, a
	// phone placeholder that is not a number.
	if h, err := chromedp.Run(tctx, chromedp.Evaluate[float64](fmt.Sprintf(`document.querySelector(%q).getBoundingClientRect().height`, card(onSale)+" .v-msg"))); err != nil || h != 0 {
		t.Errorf("an empty message under the button takes %vpx (%v)", h, err)
	}
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll("#token, #token-entry").length`)); err != nil || n != 0 {
		t.Errorf("the shop page offers a token box (%d, %v)", n, err)
	}
	if ph, err := chromedp.Run(tctx, chromedp.Evaluate[string](`document.getElementById("phone").placeholder`)); err != nil || strings.ContainsAny(strings.TrimPrefix(ph, "+86"), "0123456789") {
		t.Errorf("the phone placeholder reads %q, like a number filled in (%v)", ph, err)
	}

	// On a phone the phone field, with a number in it, and the resend
	// button (its longest label) must both be whole and on the screen.
	askCode := func(phone string) {
		t.Helper()
		do("ask for a code", chromedp.SetValue(chromedp.ID("phone"), phone),
			chromedp.Click(chromedp.ID("send-code")), visible("#login-form"))
	}
	enterCode := func(phone string) {
		t.Helper()
		do("log in", chromedp.SendKeys(chromedp.ID("code"), waitCode(t, s.outbox, phone)),
			chromedp.Click(chromedp.ID("login")), visible("#logout"))
	}
	do("phone-sized", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	askCode(buyer)
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](`document.getElementById("send-code").textContent.startsWith("Resend in")`,
		chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Fatalf("the send button never counted down: %v", err)
	}
	for _, width := range []int64{600, 390, 320} {
		do("phone-sized", chromedp.EmulateViewport(width, 844, chromedp.EmulateMobile))
		for _, row := range [][3]string{{"phone", "send-code", buyer}, {"code", "login", "123456"}} {
			g, err := chromedp.Run(tctx, chromedp.Evaluate[rowGeometry](fmt.Sprintf(geometryJS, row[0], row[1], row[2])))
			if err != nil {
				t.Fatal(err)
			}
			if p := g.problem(); p != "" {
				t.Errorf("%dpx wide, #%s and #%s: %s (%+v)", width, row[0], row[1], p, g)
			}
		}
		shot(fmt.Sprintf("login-phone-%d.png", width))
	}
	do("desktop-sized", chromedp.EmulateViewport(1200, 900))
	enterCode(buyer)

	// A grab of a free voucher that lands is paid at once and turns the
	// button into a disabled "Yours". My orders is read again once the
	// order is written; after that the page asks nothing about orders until
	// its next grab.
	do("grab", chromedp.Click(chromedp.CSS(card(onSale)+" .grab")),
		visible(card(onSale)+` .v-msg[data-status="paid"]`), visible(card(onSale)+` .grab.yours:disabled`),
		visible(`#orders .st-paid`))
	seen, err := chromedp.Run(tctx, chromedp.AttributeValue(chromedp.CSS(card(onSale)+" .v-msg"), "data-seen"))
	if err != nil {
		t.Fatal(err)
	}
	if msg, code := text(card(onSale)+" .v-msg"), text(card(onSale)+" .v-code .code-big"); seen.Value != "pending,paid" || msg != "Free ✓ yours." || len(code) != 10 {
		t.Errorf("order statuses shown %q, message %q, code %q; want pending then paid, and the code", seen.Value, msg, code)
	}
	if label := text(card(onSale) + " .grab"); label != "Yours" {
		t.Errorf("the button after a grab reads %q, want Yours", label)
	}

	// The same buyer bought the other voucher elsewhere (another tab, a
	// phone): this page does not know, its grab is told "already
	// purchased", and the voucher is theirs here too.
	uid, err := chromedp.Run(tctx, chromedp.Evaluate[int64](`JSON.parse(localStorage.getItem("seckill.session")).user_id`))
	if err != nil {
		t.Fatal(err)
	}
	bought := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, elsewhere), token(t, uid, auth.RoleUser), nil)
	if bought.status != 202 {
		t.Fatalf("buy elsewhere: %d %s", bought.status, bought.raw)
	}
	do("grab what was bought elsewhere", chromedp.Click(chromedp.CSS(card(elsewhere)+" .grab:enabled")),
		visible(card(elsewhere)+` .v-msg[data-code="already_purchased"]`), visible(card(elsewhere)+` .grab.yours:disabled`))
	again, orders, left := text(card(elsewhere)+" .v-msg"), text("#orders"), text(card(onSale)+" .v-left")
	if !strings.HasPrefix(again, "Already yours") || !strings.Contains(orders, "Free ✓ yours") || left != "4 of 5 left" {
		t.Errorf("grab of a voucher bought elsewhere %q; my orders %q; stock %q", again, orders, left)
	}

	// After a reload the page learns from my orders which vouchers are the
	// buyer's (the one bought elsewhere once the worker wrote it).
	orderID, _ := bought.body["order_id"].(string)
	testenv.WaitFor(t, 10*time.Second, "order "+orderID+" written", func() bool {
		a := sendJSON(t, "GET", s.base+"/api/v1/orders/"+orderID, token(t, uid, auth.RoleUser), nil)
		return a.status == 200 && a.body["status"] == "paid"
	})
	do("reload", chromedp.Reload(),
		visible(card(onSale)+` .grab.yours:disabled`), visible(card(elsewhere)+` .grab.yours:disabled`))
	if a, b := text(card(onSale)+" .grab"), text(card(elsewhere)+" .grab"); a != "Yours" || b != "Yours" {
		t.Errorf("after a reload the buyer's vouchers read %q and %q, want Yours", a, b)
	}
	shot("sale-desktop.png")
	do("phone-sized", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	shot("sale-phone.png")
	do("desktop-sized", chromedp.EmulateViewport(1200, 900))

	// A priced voucher: the grab reserves it, not yet the buyer's: its
	// button reads "Reserved, pay within m:ss", counting down, and my
	// orders counts too, with Pay and Cancel.
	do("grab a priced voucher", chromedp.Click(chromedp.CSS(card(priced)+" .grab")),
		visible(card(priced)+` .v-msg[data-status="awaiting_payment"]`), visible(card(priced)+" .grab.reserved:disabled"),
		visible(`#orders li[data-status="awaiting_payment"] .pay-box .due`))
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, card(priced)+" .grab.yours"))); err != nil || n != 0 {
		t.Errorf("a reserved, unpaid voucher reads Yours")
	}
	first := strings.TrimPrefix(text(card(priced)+" .grab"), "Reserved, ")
	if left, ok := payLeft(strings.Replace(first, "pay", "Pay", 1)); !ok || left <= 0 || left > payWindow {
		t.Errorf("the reserved button reads %q, want Reserved, pay within m:ss of at most %s", first, payWindow)
	}
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](fmt.Sprintf(`(() => { const t = document.querySelector(%q).textContent; return t.startsWith("Reserved, pay within ") && t !== %q; })()`,
		card(priced)+" .grab", "Reserved, "+first), chromedp.WithPollingTimeout(5*time.Second))); err != nil {
		t.Fatalf("the time to pay did not count down from %q: %v", first, err)
	}
	if label := text(card(priced) + " .v-pay .pay"); label != "Pay ¥9.90" {
		t.Errorf("the pay button reads %q, want Pay ¥9.90", label)
	}
	// Pay and Cancel show once, on the card; My orders says where.
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[[]int](visibleCountJS)); err != nil || len(n) != 2 || n[0] != 1 || n[1] != 1 {
		t.Errorf("the page shows %v Pay and Cancel buttons (%v), want one of each", n, err)
	}
	do("My orders says where to pay", visible(`#orders li[data-status="awaiting_payment"] .pay-where`))
	shot("sale-awaiting-payment.png")
	do("pay", chromedp.Click(chromedp.CSS(card(priced)+" .v-pay .pay")),
		visible(card(priced)+` .v-msg[data-status="paid"]`), chromedp.WaitNotVisible(chromedp.CSS(card(priced)+" .v-pay")),
		visible(card(priced)+` .grab.yours:disabled`), visible(`#orders li[data-status="paid"]`))
	paidAttr, err := chromedp.Run(tctx, chromedp.AttributeValue(chromedp.CSS(card(priced)+" .v-msg"), "data-order"))
	if err != nil {
		t.Fatal(err)
	}
	paidOrder := paidAttr.Value
	var row struct {
		Status string
		Amount int64
		Code   *string
	}
	if err := s.db(t).Raw("SELECT status, amount, code FROM orders WHERE id = ?", paidOrder).Scan(&row).Error; err != nil || row.Status != "paid" || row.Amount != 990 || row.Code == nil {
		t.Fatalf("order %s paid in the browser: %+v, %v", paidOrder, row, err)
	}
	// Paid: the voucher code, with how to use it, and no order id.
	if msg, want := text(card(priced)+" .v-msg"), "Paid ¥9.90 ✓ yours."; msg != want {
		t.Errorf("a paid order reads %q, want %q", msg, want)
	}
	if code, label := text(card(priced)+" .v-code .code-big"), text(card(priced)+" .v-code-label"); code != *row.Code || label != "Voucher code: show it at the shop" {
		t.Errorf("a paid order's code box reads %q, %q; want %s and how to use it", label, code, *row.Code)
	}
	if orders := text("#orders"); !strings.Contains(orders, "code "+*row.Code) {
		t.Errorf("my orders %q do not show the code %s", orders, *row.Code)
	}
	if page := text("main"); longID.MatchString(page) {
		t.Errorf("the buyer's page shows an order id: %q", longID.FindString(page))
	}
	shot("sale-paid-desktop.png")
	// A cashier reads the code off a phone: big, monospace, whole on the
	// screen, and the buyer may copy it.
	for _, width := range []int64{390, 320, 1200} {
		do("sized", chromedp.EmulateViewport(width, 844, chromedp.EmulateMobile))
		look, err := chromedp.Run(tctx, chromedp.Evaluate[codeLook](fmt.Sprintf(codeLookJS, card(priced)+" .v-code")))
		if err != nil {
			t.Fatal(err)
		}
		if p := look.problem(); p != "" {
			t.Errorf("%dpx wide, the voucher code: %s (%+v)", width, p, look)
		}
	}
	do("phone-sized", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	shot("sale-paid-phone.png")
	copied := func(how string) {
		t.Helper()
		do("copy the code "+how, chromedp.Click(chromedp.CSS(card(priced)+" .copy")),
			visible(card(priced)+` .copy[data-copied="yes"]`))
		if label := text(card(priced) + " .copy"); label != "Copied" {
			t.Errorf("copied %s, the button reads %q", how, label)
		}
	}
	if err := chromedp.Do(tctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		for _, name := range []string{"clipboard-read", "clipboard-write"} {
			if _, err := chromedp.CallBrowser(ctx, cdpbrowser.SetPermission, cdpbrowser.SetPermissionParams{
				Permission: &cdpbrowser.PermissionDescriptor{Name: name}, Setting: cdpbrowser.PermissionSettingGranted, Origin: s.base,
			}); err != nil {
				return fmt.Errorf("grant %s: %w", name, err)
			}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	copied("to the clipboard")
	if got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`navigator.clipboard.readText()`, chromedp.EvalAwaitPromise)); err != nil || got != *row.Code {
		t.Errorf("the clipboard holds %q (%v), want the code %s", got, err, *row.Code)
	}
	// Without navigator.clipboard (a page over plain http, an old
	// browser) the code is copied from a selection.
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`(() => {
		Object.defineProperty(navigator, "clipboard", { value: undefined, configurable: true });
		window.copiedText = "";
		document.addEventListener("copy", () => { window.copiedText = String(getSelection()); });
		document.querySelector(".copy[data-copied]").removeAttribute("data-copied");
		return true;
	})()`)); err != nil {
		t.Fatal(err)
	}
	copied("without navigator.clipboard")
	if got, err := chromedp.Run(tctx, chromedp.Evaluate[string](`window.copiedText`)); err != nil || got != *row.Code {
		t.Errorf("copied by selection %q (%v), want the code %s", got, err, *row.Code)
	}
	do("desktop-sized", chromedp.EmulateViewport(1200, 900))

	// Another user (or nobody) may grab it.
	do("log out", chromedp.Click(chromedp.ID("logout")), visible("#login-panel"),
		visible(card(onSale)+`[data-phase="on_sale"] .grab:enabled:not(.yours)`))

	// Another buyer grabs the priced voucher's last unit and cancels: the
	// order reads cancelled, the unit is on sale again, and the buyer may
	// grab it again.
	askCode(buyer2)
	enterCode(buyer2)
	do("grab the last unit", chromedp.Click(chromedp.CSS(card(priced)+" .grab:enabled")),
		visible(card(priced)+` .v-msg[data-status="awaiting_payment"]`), visible(card(priced)+" .v-pay .cancel:enabled"))
	waitText := func(sel, want string) {
		t.Helper()
		if _, err := chromedp.Run(tctx, chromedp.Poll[bool](fmt.Sprintf(`document.querySelector(%q).textContent === %q`, sel, want),
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("%s never read %q (it reads %q): %v", sel, want, text(sel), err)
		}
	}
	waitText(card(priced)+" .v-left", "0 of 2 left")
	do("cancel", chromedp.Click(chromedp.CSS(card(priced)+" .v-pay .cancel")),
		visible(card(priced)+` .v-msg[data-status="cancelled"]`), chromedp.WaitNotVisible(chromedp.CSS(card(priced)+" .v-pay")),
		visible(`#orders li[data-status="cancelled"]`))
	waitText(card(priced)+" .v-left", "1 of 2 left")
	do("the unit is on sale again", visible(card(priced)+`[data-phase="on_sale"] .grab:enabled:not(.yours)`))
	if msg, orders := text(card(priced)+" .v-msg"), text("#orders"); !strings.Contains(msg, "Cancelled (by you)") || !strings.Contains(orders, "Cancelled (by you)") {
		t.Errorf("a cancelled order reads %q on its card, my orders %q", msg, orders)
	}

	// After a cancellation the buyer may grab again; this time the order
	// is left unpaid.
	do("grab again", chromedp.Click(chromedp.CSS(card(priced)+" .grab:enabled")),
		visible(card(priced)+` .v-msg[data-status="awaiting_payment"]`), visible(card(priced)+" .grab.reserved"))
	shot("sale-cancelled.png")

	// The sold-out voucher's only order was never paid: once it expires
	// the unit is back, the stock rises and the button is enabled again.
	waitText(card(expiring)+" .v-left", "1 of 1 left")
	do("the expired unit is on sale again", visible(card(expiring)+`[data-phase="on_sale"] .grab:enabled`))

	// When the buyer's own time to pay runs out, the page asks for the
	// order again and shows it cancelled, its unit back on sale.
	do("the unpaid order expires", visible(card(priced)+` .v-msg[data-status="cancelled"]`),
		chromedp.WaitNotVisible(chromedp.CSS(card(priced)+" .v-pay")))
	waitText(card(priced)+" .v-left", "1 of 2 left")
	if msg := text(card(priced) + " .v-msg"); !strings.Contains(msg, "Cancelled (expired: not paid in time)") {
		t.Errorf("an expired order reads %q on its card", msg)
	}
	do("and may be grabbed again", visible(card(priced)+`[data-phase="on_sale"] .grab:enabled:not(.yours)`))
	do("log out", chromedp.Click(chromedp.ID("logout")), visible("#login-panel"))

	// A shopper has no link to the console; an admin has, and the console
	// shares the login.
	if hidden, err := chromedp.Run(tctx, chromedp.Evaluate[bool](`document.getElementById("console-link").hidden`)); err != nil || !hidden {
		t.Errorf("a logged-out page links the console (%v)", err)
	}
	askCode(admin)
	enterCode(admin)
	do("the admin's console link", visible("#console-link"), chromedp.Click(chromedp.ID("console-link")),
		visible("#figures-panel"), visible(fmt.Sprintf(`#figures tr[data-voucher-id="%d"]`, priced)))
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll(".grab, #phone").length`)); err != nil || n != 0 {
		t.Errorf("the console has shopper controls (%d, %v)", n, err)
	}
	do("back to the shop", chromedp.Navigate(s.base+"/"), visible("#logout"))

	// The footer's API link opens the API reference, built from
	// /openapi.json under the page's CSP (a violation would be a console
	// error), listing every route.
	do("open the API page from the footer", chromedp.Click(chromedp.ID("api-link")), visible(`body[data-routes]`),
		visible(`article[data-route="POST /api/v1/vouchers/{id}/orders"]`))
	if n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`Number(document.body.dataset.routes)`)); err != nil || n < 15 {
		t.Errorf("the API page lists %d routes (%v)", n, err)
	}
	if title := text("#api-title"); title != "seckill API reference" {
		t.Errorf("API page title %q", title)
	}
	shot("api-docs.png")

}

// visibleCountJS counts the Pay and the Cancel buttons on the screen.
const visibleCountJS = `[".pay", ".cancel"].map(sel => [...document.querySelectorAll("button" + sel)].filter(b => b.checkVisibility()).length)`

// codeLookJS measures a card's code box: the code's computed font and
// whether it and the Copy button are whole on the screen.
const codeLookJS = `(() => {
	const box = document.querySelector(%q), code = box.querySelector(".code-big"), copy = box.querySelector("button.copy");
	const st = getComputedStyle(code), c = code.getBoundingClientRect(), b = copy.getBoundingClientRect();
	return {
		fontSize: parseFloat(st.fontSize), fontFamily: st.fontFamily, lines: Math.round(c.height / parseFloat(st.lineHeight)),
		codeRight: c.right, copyRight: b.right, copyVisible: copy.checkVisibility(), copyLabel: copy.textContent,
		viewport: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
	};
})()`

type codeLook struct {
	FontSize             float64
	FontFamily           string
	Lines                int
	CodeRight, CopyRight float64
	CopyVisible          bool
	CopyLabel            string
	Viewport, Page       float64
}

// problem says what keeps a cashier from reading the code, or "".
func (l codeLook) problem() string {
	switch {
	case l.FontSize < 24:
		return fmt.Sprintf("%.0fpx is small to read across a counter (body text is 16px)", l.FontSize)
	case !strings.HasSuffix(l.FontFamily, "monospace"):
		return "not monospace: " + l.FontFamily
	case l.Lines != 1:
		return fmt.Sprintf("broken over %d lines", l.Lines)
	case l.Page > l.Viewport || l.CodeRight > l.Viewport || l.CopyRight > l.Viewport:
		return "off the screen"
	case !l.CopyVisible || l.CopyLabel == "":
		return "no Copy button"
	}
	return ""
}

// longID is an order id (18 or more digits) in a text.
var longID = regexp.MustCompile(`[0-9]{15,}`)

// payLeft reads "Pay within m:ss" (or h:mm:ss).
func payLeft(s string) (time.Duration, bool) {
	rest, ok := strings.CutPrefix(s, "Pay within ")
	if !ok {
		return 0, false
	}
	var d time.Duration
	for part := range strings.SplitSeq(rest, ":") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return 0, false
		}
		d = d*60 + time.Duration(n)*time.Second
	}
	return d, true
}

// geometryJS measures one row of the login form, in CSS pixels: an input
// holding a sample of what it takes, and its button.
const geometryJS = `(() => {
	const input = document.getElementById(%q), button = document.getElementById(%q);
	const saved = input.value;
	input.value = %q;
	const i = input.getBoundingClientRect(), b = button.getBoundingClientRect();
	const g = {
		inputLeft: i.left, inputRight: i.right, inputTop: i.top, inputBottom: i.bottom,
		buttonLeft: b.left, buttonRight: b.right, buttonTop: b.top, buttonBottom: b.bottom,
		textWidth: input.scrollWidth, boxWidth: input.clientWidth,
		buttonTextWidth: button.scrollWidth, buttonBoxWidth: button.clientWidth,
		viewport: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
	};
	input.value = saved;
	return g;
})()`

type rowGeometry struct {
	InputLeft, InputRight, InputTop, InputBottom     float64
	ButtonLeft, ButtonRight, ButtonTop, ButtonBottom float64
	TextWidth, BoxWidth                              float64
	ButtonTextWidth, ButtonBoxWidth                  float64
	Viewport, Page                                   float64
}

// problem says what is wrong with the row, or "".
func (g rowGeometry) problem() string {
	switch {
	case g.Page > g.Viewport:
		return "the page scrolls sideways"
	case g.InputLeft < 0 || g.InputRight > g.Viewport || g.ButtonLeft < 0 || g.ButtonRight > g.Viewport:
		return "off the screen"
	case g.InputRight > g.ButtonLeft && g.ButtonRight > g.InputLeft && g.InputBottom > g.ButtonTop && g.ButtonBottom > g.InputTop:
		return "the button covers the input"
	case g.TextWidth > g.BoxWidth:
		return "what it takes does not fit in the input"
	case g.ButtonTextWidth > g.ButtonBoxWidth:
		return "the button's label does not fit"
	}
	return ""
}

// watchConsole collects the page's script errors and CSP violations while
// a browser test runs; the function it returns stops watching and fails
// the test with each. Refused requests (409, 401) are the page's
// business, logged by the browser as network errors, and not counted.
func watchConsole(t *testing.T, ctx context.Context) func() {
	var (
		mu       sync.Mutex
		problems []string
	)
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	msgs := chromedp.Console(cctx)
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || (m.Type == chromedp.ConsoleError && m.Source != "network") {
				mu.Lock()
				problems = append(problems, fmt.Sprintf("%s %s: %s", m.Type, m.Source, m.Text))
				mu.Unlock()
			}
		}
	}()
	return func() {
		stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, p := range problems {
			t.Errorf("browser: %s", p)
		}
	}
}
