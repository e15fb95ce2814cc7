package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"seckill/internal/auth"
)

// TestConsoleRevokesTokens drives the console's Admin tokens card in
// chromium: a user id that is not one is refused; Revoke asks first (Keep
// revokes nothing); Confirm revokes, and the user's admin token is refused
// on the next request while the staff's own works on; revoking one's own
// tokens ends the console's session.
//
// Not parallel, as TestSaleInBrowser.
func TestConsoleRevokesTokens(t *testing.T) {
	ctx := browser(t)
	s := startWeb(t, nil)
	staff, other := token(t, 1, auth.RoleAdmin), token(t, 6, auth.RoleAdmin)
	works := func(who, tok string, want int) {
		t.Helper()
		if a := sendJSON(t, "GET", s.base+"/api/v1/admin/figures", tok, nil); a.status != want {
			t.Fatalf("%s's admin token: %d %s, want %d", who, a.status, a.raw, want)
		}
	}
	works("user 6", other, http.StatusOK)

	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	b := tab{t: t, ctx: tctx, dir: artifacts(t)}
	do, text, visible := b.do, b.text, waitVisible
	do("open the console", chromedp.Navigate(s.base+"/admin"), visible("#token-form"))
	do("sign in", chromedp.SetValue(chromedp.ID("token"), staff), chromedp.Click(chromedp.ID("use-token")), visible("#tokens-panel"))

	do("not a user id", chromedp.SetValue(chromedp.ID("revoke-user"), "six"), chromedp.Click(chromedp.ID("revoke")), visible("#revoke-msg.bad"))
	do("revoke user 6, once", chromedp.SetValue(chromedp.ID("revoke-user"), "6"), chromedp.Click(chromedp.ID("revoke")),
		visible("#revoke-confirm"), visible("#revoke-msg.warn"))
	if msg := text("#revoke-msg"); !strings.HasPrefix(msg, "Revoke every admin token of user 6") {
		t.Errorf("Revoke asks %q", msg)
	}
	b.shot("console-revoke-confirm-desktop.png")
	works("user 6, Revoke clicked once,", other, http.StatusOK)
	do("keep them", chromedp.Click(chromedp.ID("revoke-keep")), chromedp.WaitNotVisible(chromedp.ID("revoke-confirm")))
	works("user 6, after Keep,", other, http.StatusOK)

	do("revoke user 6, confirmed", chromedp.Click(chromedp.ID("revoke")), visible("#revoke-confirm"),
		chromedp.Click(chromedp.ID("revoke-confirm")), visible(`#revoke-msg[data-code="revoked"]`))
	if msg := text("#revoke-msg"); !strings.Contains(msg, "token version 1") {
		t.Errorf("the revocation reads %q", msg)
	}
	works("user 6, revoked,", other, http.StatusUnauthorized)
	works("the staff's own", staff, http.StatusOK)
	b.shot("console-revoked-desktop.png")

	do("revoke one's own", chromedp.SetValue(chromedp.ID("revoke-user"), "1"), chromedp.Click(chromedp.ID("revoke")),
		visible("#revoke-confirm"), chromedp.Click(chromedp.ID("revoke-confirm")), visible("#signin-panel"), visible("#notice"))
	if n := text("#notice"); !strings.Contains(n, "your own admin tokens") {
		t.Errorf("after revoking its own tokens the console says %q", n)
	}
	works("the staff's own, revoked,", staff, http.StatusUnauthorized)
}
