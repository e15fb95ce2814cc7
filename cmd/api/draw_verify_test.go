package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"seckill/internal/draw"
	"seckill/internal/voucher"
)

// publishedDraw is a done draw of 20 entries and 5 winners, ordered by
// secret, as a service would publish it.
func publishedDraw(secret string) draw.Result {
	entries := make([]draw.Entry, 20)
	for i := range entries {
		entries[i] = draw.Entry{UserID: int64(i + 1), Ticket: int64(100 + i)}
	}
	digest := draw.Digest(entries)
	draw.Order(secret, digest, entries)
	for i := range entries[:5] {
		entries[i].Won = true
	}
	done := time.Now().UTC()
	return draw.Result{VoucherID: 7, Entries: entries, Draw: &voucher.DrawView{
		Status: "done", Commitment: voucher.DrawCommitment(secret), Secret: secret, Digest: digest, DoneAt: &done}}
}

// TestDrawVerifyHeldToCommitment: api draw verify needs the commitment
// published before the close and holds the draw to it. A service showing
// a swapped secret, with a commitment and an order to match (so Check of
// what it shows alone passes), is refused and both mismatches are
// reported; the honest draw passes; no commitment, or one that is not a
// SHA-256, is refused before anything is read.
func TestDrawVerifyHeldToCommitment(t *testing.T) {
	t.Parallel()
	honest := publishedDraw(strings.Repeat("ab", 32))
	swapped := publishedDraw(strings.Repeat("cd", 32))
	if err := draw.Check(swapped); err != nil {
		t.Fatalf("the swapped draw must check on its own: %v", err)
	}
	// The service: the draw's status, then its entries a page at a time.
	var shown draw.Result
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/vouchers/7/draw":
			n, won := len(shown.Entries), 5
			_ = json.NewEncoder(w).Encode(draw.Status{VoucherID: 7, Draw: shown.Draw, Entries: &n, Winners: &won})
		case "/api/v1/vouchers/7/draw/entries":
			_ = json.NewEncoder(w).Encode(draw.Page{VoucherID: 7, Status: "done", Entries: shown.Entries})
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	verify := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"api", "draw", "verify", "--url", srv.URL}, args...),
			func(string) string { return "" }, &out, &errOut)
		return out.String() + errOut.String(), err
	}
	published := honest.Draw.Commitment

	shown = honest
	if out, err := verify("--commitment", published, "7"); err != nil || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("the honest draw: %v\n%s", err, out)
	}
	shown = swapped
	out, err := verify("--commitment", published, "7")
	if err == nil || !strings.Contains(out, `"ok": false`) ||
		!strings.Contains(out, "the commitment the service shows now") || !strings.Contains(out, "revealed secret's SHA-256 is not the commitment published") {
		t.Fatalf("the swapped secret: %v\n%s; want refused, naming the commitment and the secret", err, out)
	}
	for _, args := range [][]string{{"7"}, {"--commitment", "abc", "7"}, {"--commitment", strings.Repeat("zz", 32), "7"}} {
		if out, err := verify(args...); err == nil || !strings.Contains(out+err.Error(), "commitment") {
			t.Errorf("verify %v: %v\n%s; want refused for its commitment", args, err, out)
		}
	}
}
