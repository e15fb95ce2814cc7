package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/auth"
)

// browser starts Debian's chromium, headless, with its own profile and
// nothing that reaches for the network; it is killed on cleanup. Without
// chromium the test skips, or fails under CI=true.
func browser(t *testing.T) context.Context {
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
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	return ctx
}

// artifacts is where screenshots go: $SECKILL_ARTIFACTS, else a test dir.
func artifacts(t *testing.T) string {
	dir := os.Getenv("SECKILL_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// waitCode polls the outbox until a code for phone is there: the page
// asks for it asynchronously.
func waitCode(t *testing.T, outbox, phone string) string {
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
// upcoming voucher's buttons are disabled; log in with a code read from the
// sender; grab and watch pending turn into created; grab again and read
// "already purchased"; my orders; an admin creates a voucher. Screenshots
// of the sale page, desktop and phone-sized, are saved as artifacts.
//
// It is not parallel: chromium's processes would starve the load tests of
// this package (the embedded flash sale has 1s Redis timeouts) on 2 cores.
func TestSaleInBrowser(t *testing.T) {
	ctx := browser(t)
	const buyer, admin = "+8613800138000", "+8613900000000"
	s := startWeb(t, map[string]string{"SECKILL_ADMIN_PHONES": admin})

	onSale := createVoucher(t, s.base, 5)
	soldOut := createVoucher(t, s.base, 1)
	if a := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, soldOut), token(t, 77, auth.RoleUser), nil); a.status != 202 {
		t.Fatalf("buy the sold-out voucher's only unit: %d %s", a.status, a.raw)
	}
	up := sendJSON(t, "POST", s.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "Tonight's ¥50 flash", "face_value": 5000, "stock": 20,
		"begin_at": time.Now().Add(time.Hour).Format(time.RFC3339), "end_at": time.Now().Add(3 * time.Hour).Format(time.RFC3339),
	})
	if up.status != 201 {
		t.Fatalf("create upcoming voucher: %d %s", up.status, up.raw)
	}
	upcoming := int64(up.body["voucher"].(map[string]any)["id"].(float64))

	// Script errors and CSP violations fail the test; refused requests
	// (409, 401) are the page's business, logged by the browser as network
	// errors, and not counted.
	var mu sync.Mutex
	var problems []string
	cctx, stopConsole := context.WithCancel(ctx)
	consoleDone := make(chan struct{})
	msgs := chromedp.Console(cctx)
	go func() {
		defer close(consoleDone)
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
	defer func() { stopConsole(); <-consoleDone }()

	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(tctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	visible := func(sel string) chromedp.Action[chromedp.Void] { return chromedp.WaitVisible(chromedp.CSS(sel)) }
	card := func(id int64) string { return fmt.Sprintf(`li[data-voucher-id="%d"]`, id) }

	do("open the page", chromedp.Navigate(s.base+"/"),
		visible(card(onSale)+`[data-phase="on_sale"] .grab:enabled`),
		visible(card(soldOut)+`[data-phase="sold_out"] .grab:disabled`),
		visible(card(upcoming)+`[data-phase="upcoming"] .grab:disabled`))
	if sold, when := text(card(soldOut)+" .grab"), text(card(upcoming)+" .v-when"); sold != "Sold out" || !strings.HasPrefix(when, "Starts in 00:59:") {
		t.Errorf("sold-out button %q, upcoming countdown %q", sold, when)
	}

	login := func(phone string) {
		t.Helper()
		do("ask for a code", chromedp.SetValue(chromedp.ID("phone"), phone),
			chromedp.Click(chromedp.ID("send-code")), visible("#login-form"))
		do("log in", chromedp.SendKeys(chromedp.ID("code"), waitCode(t, s.outbox, phone)),
			chromedp.Click(chromedp.ID("login")), visible("#logout"))
	}
	login(buyer)

	do("grab", chromedp.Click(chromedp.CSS(card(onSale)+" .grab")), visible(card(onSale)+` .v-msg[data-status="created"]`))
	seen, err := chromedp.Run(tctx, chromedp.AttributeValue(chromedp.CSS(card(onSale)+" .v-msg"), "data-seen"))
	if err != nil {
		t.Fatal(err)
	}
	if msg := text(card(onSale) + " .v-msg"); seen.Value != "pending,created" || !strings.Contains(msg, "created") {
		t.Errorf("order statuses shown %q, message %q; want pending then created", seen.Value, msg)
	}
	do("grab again", chromedp.Click(chromedp.CSS(card(onSale)+" .grab")),
		visible(card(onSale)+` .v-msg[data-code="already_purchased"]`), visible(`#orders .st-created`))
	again, orders, left := text(card(onSale)+" .v-msg"), text("#orders"), text(card(onSale)+" .v-left")
	if !strings.HasPrefix(again, "Already purchased") || !strings.Contains(orders, "created") || left != "4 of 5 left" {
		t.Errorf("second grab %q; my orders %q; stock %q", again, orders, left)
	}

	dir := artifacts(t)
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}
	shot("sale-desktop.png")
	do("phone-sized", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	shot("sale-phone.png")
	do("desktop-sized", chromedp.EmulateViewport(1200, 900))

	// The admin's form is there only for an admin.
	do("log out", chromedp.Click(chromedp.ID("logout")), visible("#login-panel"))
	login(admin)
	do("create a voucher", visible("#admin-panel"),
		chromedp.SendKeys(chromedp.ID("v-title"), "Made in the browser"),
		chromedp.SendKeys(chromedp.ID("v-face"), "12.50"),
		chromedp.SendKeys(chromedp.ID("v-stock"), "7"),
		chromedp.Click(chromedp.ID("v-create")))
	if _, err := chromedp.Run(tctx, chromedp.Poll[bool](`[...document.querySelectorAll(".v-title")].some(e => e.textContent === "Made in the browser")`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the new voucher never showed: %v (admin message %q)", err, text("#admin-msg"))
	}
	var made struct {
		FaceValue  int64
		TotalStock int
	}
	if err := s.db(t).Raw("SELECT face_value, total_stock FROM vouchers WHERE title = ?", "Made in the browser").Scan(&made).Error; err != nil ||
		made.FaceValue != 1250 || made.TotalStock != 7 {
		t.Errorf("voucher made in the browser: %+v, %v", made, err)
	}
	shot("sale-admin.png")

	mu.Lock()
	defer mu.Unlock()
	for _, p := range problems {
		t.Errorf("browser: %s", p)
	}
}
