package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"seckill/internal/auth"
	"seckill/internal/voucher"
)

// TestDrawPageHoldsItsCommitment: the shop page keeps the commitment it
// showed when the buyer joined, beside the ticket, and holds the secret
// published once the draw is done to it. A buyer joins a draw; then the
// draw's secret is swapped before the close by someone holding both the
// database (the trigger dropped) and the instances' secret (a salt and
// the commitment that matches it): the API then publishes a secret whose
// SHA-256 is not the commitment the page kept, and the page says so in a
// warning that names the commitment shown at the entry. Meanwhile the
// page asked only for the draw's small status (sending its ETag back) and
// then once for the buyer's own entry: it never downloaded the list.
func TestDrawPageHoldsItsCommitment(t *testing.T) {
	ctx := browser(t)
	s := startWeb(t, nil)
	defer watchConsole(t, ctx)()
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	b := tab{t: t, ctx: tctx, dir: artifacts(t)}
	do, text, visible := b.do, b.text, waitVisible

	// What the page asks the API for, by path (and whether with an ETag).
	var (
		mu   sync.Mutex
		asks = map[string]int{}
	)
	listen := chromedp.Listen(tctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok && strings.Contains(e.Request.URL, "/api/v1/") {
			path, _, _ := strings.Cut(strings.TrimPrefix(e.Request.URL, s.base), "?")
			if _, etag := e.Request.Headers["If-None-Match"]; etag {
				path += " (If-None-Match)"
			}
			mu.Lock()
			asks[path]++
			mu.Unlock()
		}
	})
	if listen != nil {
		t.Fatal(listen)
	}
	if _, err := chromedp.Call(tctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}

	const user = 4242
	do("open the page", chromedp.Navigate(s.base+"/"), visible("#login-panel"))
	session := fmt.Sprintf(`(localStorage.setItem("seckill.session", JSON.stringify({token: %q, role: %q, user_id: %d, expires_at: %q})), true)`,
		token(t, user, auth.RoleUser), auth.RoleUser, user, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if _, err := chromedp.Run(tctx, chromedp.Evaluate[bool](session)); err != nil {
		t.Fatal(err)
	}
	do("logged in", chromedp.Reload(), visible("#logout"))

	begin := time.Now().Add(time.Second)
	a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "Fair ¥20", "face_value": 2000, "stock": 1, "fair_window_ms": 5_000,
		"begin_at": begin.Format(time.RFC3339Nano), "end_at": begin.Add(time.Hour).Format(time.RFC3339Nano),
	})
	if a.status != 201 {
		t.Fatalf("create a fair voucher: %d %s", a.status, a.raw)
	}
	id := int64(a.body["voucher"].(map[string]any)["id"].(float64))
	shown := a.body["voucher"].(map[string]any)["draw"].(map[string]any)["commitment"].(string)
	card := fmt.Sprintf(`li[data-voucher-id="%d"]`, id)
	do("join the draw", visible(card+`[data-draw="open"] .grab:enabled`), chromedp.Click(chromedp.CSS(card+" .grab")),
		visible(card+` .v-msg[data-code="entered"]`))
	kept, err := chromedp.Run(tctx, chromedp.Evaluate[string](fmt.Sprintf(`JSON.parse(localStorage.getItem("seckill.draws.%d"))[%d].commitment`, user, id)))
	if err != nil || kept != shown {
		t.Fatalf("the page kept commitment %q (%v) with the ticket, want the one it showed, %s", kept, err, shown)
	}

	// Someone with the database and the instances' secret swaps the
	// draw's secret before the close: the trigger dropped, a new salt and
	// the commitment that matches it written (the draw then uses it).
	salt, err := voucher.NewDrawSecret()
	if err != nil {
		t.Fatal(err)
	}
	swapped := voucher.DrawCommitment(voucher.DrawSecretOf(drawKeyOf(testSecret), salt))
	if err := s.db(t).Exec("DROP TRIGGER trg_vouchers_draw_commitment_once").Error; err != nil {
		t.Fatal(err)
	}
	if err := s.db(t).Exec("UPDATE vouchers SET draw_salt = ?, draw_commitment = ? WHERE id = ?", salt, swapped, id).Error; err != nil {
		t.Fatal(err)
	}

	do("the draw's result", visible(card+`[data-draw-result] .draw-result`), visible(card+`[data-draw-check="mismatch"] .draw-verify`))
	// What the API published: a secret whose SHA-256 is not the commitment
	// the page kept.
	st := sendJSON(t, "GET", fmt.Sprintf("%s/api/v1/vouchers/%d/draw", s.base, id), "", nil)
	secret, _ := st.body["draw"].(map[string]any)["secret"].(string)
	sum := sha256.Sum256([]byte(secret))
	if secret == "" || hex.EncodeToString(sum[:]) == kept {
		t.Fatalf("the API published secret %q: it hashes to the commitment the page kept, nothing to warn of (%s)", secret, st.raw)
	}
	warning := text(card + " .draw-verify")
	for _, want := range []string{"Warning: the published secret does not match the commitment this page showed when you joined", kept[:12], hex.EncodeToString(sum[:])[:12]} {
		if !strings.Contains(warning, want) {
			t.Errorf("the warning reads %q; want it to say %q", warning, want)
		}
	}
	if mine := text(card + " .draw-mine"); !strings.HasPrefix(mine, "Your place in the draw: 1 of 1 (ticket ") {
		t.Errorf("the buyer's place reads %q", mine)
	}
	b.shot("draw-commitment-mismatch.png")

	// Kept on this device: a reload still warns, asking nothing again.
	do("reload", chromedp.Reload(), visible(card+`[data-draw-check="mismatch"] .draw-verify`))

	mu.Lock()
	defer mu.Unlock()
	draw := fmt.Sprintf("/api/v1/vouchers/%d/draw", id)
	for path, n := range asks {
		if strings.HasPrefix(path, draw+"/entries") {
			t.Errorf("the page asked for the list %d times (%s)", n, path)
		}
	}
	if asks[draw+"/me"] != 1 || asks[draw] < 1 {
		t.Errorf("the page asked for %v; want the draw's status, then the buyer's entry once", asks)
	}
	t.Logf("the page's requests: %v", asks)
}
