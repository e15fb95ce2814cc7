package draw

import (
	"context"
	"crypto/sha256"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// withPow gives the env's voucher a proof of work of k bits.
func (e env) withPow(t *testing.T, k int) env {
	t.Helper()
	if err := e.db.Exec("UPDATE vouchers SET pow_bits = ? WHERE id = ?", k, e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	e.v.PowBits = k
	// The sale state carries the draw's fields, as a load of the voucher
	// made with pow_bits writes them.
	if err := e.rdb.HSet(context.Background(), e.keys.State(e.v.ID), voucher.FieldDrawPow, k).Err(); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestPowOK: a nonce is a proof of work for one draw and one buyer: the
// SHA-256 of challenge:user:nonce starts with k zero bits, as sha256sum
// computes it; k = 0 takes anything.
func TestPowOK(t *testing.T) {
	t.Parallel()
	const challenge, user, k = "seckill-draw:7:abc", int64(42), 12
	nonce := SolvePow(challenge, user, k)
	sum := sha256.Sum256([]byte(challenge + ":42:" + nonce))
	if leadingZeros(sum) < k || sum[0] != 0 || sum[1]>>4 != 0 {
		t.Fatalf("SolvePow found %q, whose hash %x does not start with %d zero bits", nonce, sum, k)
	}
	for _, c := range []struct {
		what      string
		challenge string
		user      int64
		nonce     string
		k         int
		want      bool
	}{
		{"valid", challenge, user, nonce, k, true},
		{"valid for fewer bits", challenge, user, nonce, k - 4, true},
		{"wrong nonce", challenge, user, nonce + "x", k, false},
		{"another buyer's", challenge, user + 1, nonce, k, false},
		{"another draw's", challenge + "d", user, nonce, k, false},
		{"missing", challenge, user, "", k, false},
		{"too long", challenge, user, strings.Repeat("0", maxNonce+1), 1, false},
		{"k = 0 needs nothing", challenge, user, "", 0, true},
	} {
		if got := PowOK(c.challenge, c.user, c.nonce, c.k); got != c.want {
			t.Errorf("%s: PowOK = %v, want %v", c.what, got, c.want)
		}
	}
}

// TestEnterAsksForPow: a draw of pow_bits k writes no entry without a
// valid nonce (403 pow_required at the edge); with one it enters, and the
// same nonce again answers the same ticket; a draw of k = 0 needs none.
// After the close an entry without a nonce is told the draw is being
// drawn, and once it is done the purchase buys as in any sale, though the
// Router learnt of the draw before.
func TestEnterAsksForPow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const k = 10
	e := newEnv(t, "sqlite", 10, time.Now().Add(time.Hour)).withPow(t, k)
	free := newEnv(t, "sqlite", 10, time.Now().Add(time.Hour))
	challenge := voucher.DrawChallenge(e.v)
	r := NewRouter(e.rdb, e.keys)
	rFree := NewRouter(free.rdb, free.keys)
	valid := SolvePow(challenge, 5, k)
	wrong := "x"
	for PowOK(challenge, 5, wrong, k) {
		wrong += "x"
	}
	for _, c := range []struct {
		what   string
		r      *Router
		v      int64
		nonce  string
		send   int64 // the ticket the press brings
		ticket int64 // the ticket answered; 0: ErrPowRequired
	}{
		{"missing header", r, e.v.ID, "", 1, 0},
		{"wrong nonce", r, e.v.ID, wrong, 2, 0},
		{"another buyer's nonce", r, e.v.ID, SolvePow(challenge, 6, k), 3, 0},
		{"valid", r, e.v.ID, valid, 4, 4},
		{"the same nonce again", r, e.v.ID, valid, 5, 4},
		{"k = 0 needs nothing", rFree, free.v.ID, "", 6, 6},
	} {
		got, handled, err := c.r.Enter(ctx, c.v, 5, c.send, c.nonce)
		switch {
		case c.ticket == 0 && !errors.Is(err, voucher.ErrPowRequired):
			t.Errorf("%s: %+v handled %v, %v; want ErrPowRequired", c.what, got, handled, err)
		case c.ticket != 0 && (err != nil || !handled || got.Ticket != c.ticket):
			t.Errorf("%s: %+v handled %v, %v; want ticket %d", c.what, got, handled, err, c.ticket)
		}
	}
	if n, _ := e.rdb.HLen(ctx, entriesKey(e.keys, e.v.ID)).Result(); n != 1 {
		t.Fatalf("%d entries, want the one with a valid nonce", n)
	}

	// A draw that closed: no nonce is told it is drawing; once done, it
	// buys as in any sale.
	closed := newEnv(t, "sqlite", 10, time.Now().Add(-time.Second)).withPow(t, k)
	rc := NewRouter(closed.rdb, closed.keys)
	if got, handled, err := rc.Enter(ctx, closed.v.ID, 5, 1, ""); err != nil || !handled || !got.Closed {
		t.Fatalf("after the close without a nonce: %+v handled %v, %v; want closed", got, handled, err)
	}
	if err := closed.drawer().Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if _, handled, err := rc.Enter(ctx, closed.v.ID, 5, 2, ""); err != nil || handled {
		t.Fatalf("after the draw without a nonce: handled %v, %v; want to buy as in any sale", handled, err)
	}
}

// BenchmarkPowOK is the server's verify of an entry's proof of work.
func BenchmarkPowOK(b *testing.B) {
	challenge := "seckill-draw:123456789:" + strings.Repeat("ab", 32) + ":" + strings.Repeat("cd", 32)
	nonce := SolvePow(challenge, 987654321, 16)
	for b.Loop() {
		if !PowOK(challenge, 987654321, nonce, 16) {
			b.Fatal("the nonce was refused")
		}
	}
}

// TestPowOpensAtBegin: a draw with a proof of work takes entries from its
// begin, when its challenge, which ends with a nonce made at creation, is
// shown: before, the voucher shows no challenge, and an entry is refused
// as not started, without a proof (by the Router) and with a valid one
// (by draw_enter.lua, on Redis's clock: a leaked challenge gains
// nothing); a proof over the challenge without the nonce (what could be
// computed from creation) is refused once entries open, and a proof over
// the published challenge enters.
func TestPowOpensAtBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const k = 8
	e := newEnv(t, "sqlite", 10, time.Now().Add(4*time.Second))
	nonce := salt(t)
	if err := e.db.Exec("UPDATE vouchers SET pow_bits = ?, draw_pow_nonce = ? WHERE id = ?", k, nonce, e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	e.v = e.voucher(t)
	for shard := range e.keys.Shards() {
		if err := e.rdb.Del(ctx, e.keys.StateAt(shard, e.v.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.load(t)
	opens := e.v.BeginAt
	if e.v.EntriesOpen() != opens {
		t.Fatalf("entries open at %s, want the begin %s", e.v.EntriesOpen(), opens)
	}
	challenge := voucher.DrawChallenge(e.v)
	if !strings.HasSuffix(challenge, ":"+nonce) {
		t.Fatalf("challenge %q does not end with the nonce", challenge)
	}
	if d := voucher.DrawOf(e.v, opens.Add(-time.Millisecond)); d.Challenge != "" || !d.OpensAt.Equal(opens) {
		t.Fatalf("before the begin the voucher shows challenge %q, opens %s; want none, %s", d.Challenge, d.OpensAt, opens)
	}
	if d := voucher.DrawOf(e.v, opens); d.Challenge != challenge {
		t.Fatalf("at the begin the voucher shows challenge %q, want %q", d.Challenge, challenge)
	}
	r := NewRouter(e.rdb, e.keys)
	var early *voucher.NotStartedError
	for _, proof := range []string{"", SolvePow(challenge, 5, k)} {
		if got, handled, err := r.Enter(ctx, e.v.ID, 5, 50, proof); !errors.As(err, &early) || !handled {
			t.Fatalf("entry with proof %q before the begin: %+v handled %v, %v; want not started", proof, got, handled, err)
		}
	}
	if n, _ := e.rdb.HLen(ctx, entriesKey(e.keys, e.v.ID)).Result(); n != 0 {
		t.Fatalf("%d entries before the begin, want none", n)
	}
	testenv.WaitFor(t, 10*time.Second, "entries open", func() bool { return !time.Now().Before(opens.Add(10 * time.Millisecond)) })
	withoutNonce := strings.TrimSuffix(challenge, ":"+nonce)
	precomputed := ""
	for i := 0; precomputed == ""; i++ { // one not valid for both by chance
		if n := strconv.Itoa(i); PowOK(withoutNonce, 5, n, k) && !PowOK(challenge, 5, n, k) {
			precomputed = n
		}
	}
	if _, _, err := r.Enter(ctx, e.v.ID, 5, 51, precomputed); !errors.Is(err, voucher.ErrPowRequired) {
		t.Fatalf("a proof over the challenge without its nonce: %v, want ErrPowRequired", err)
	}
	if got, handled, err := r.Enter(ctx, e.v.ID, 5, 52, SolvePow(challenge, 5, k)); err != nil || !handled || got.Ticket != 52 {
		t.Fatalf("a proof over the published challenge: %+v handled %v, %v; want ticket 52", got, handled, err)
	}
}

// BenchmarkSolvePow is a native solver (Go, one core) of a proof of work
// of 16 bits for successive buyers: what a bot farm's own code pays per
// entry, against the page's solve in the browser (TestDrawInBrowser).
func BenchmarkSolvePow(b *testing.B) {
	challenge := "seckill-draw:123456789:" + strings.Repeat("ab", 32) + ":" + strings.Repeat("cd", 32)
	user := int64(0)
	for b.Loop() {
		user++
		SolvePow(challenge, user, 16)
	}
}

// TestRouterLearnsFromTheDatabase: taught the database's live vouchers, a
// Router sends the purchases of a voucher without a draw, or whose draw
// is done, to the purchase script without reading bucket 0's state (here
// made unreadable, as while its master is away: an untaught Router
// fails), and still enters the buyers of a draw not done.
func TestRouterLearnsFromTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "sqlite", 10, time.Now().Add(time.Hour))
	store := voucher.NewStore(e.db)
	now := time.Now()
	plain := voucher.Voucher{Title: "plain", FaceValue: 1, TotalStock: 5, BeginAt: now.Add(-time.Minute), EndAt: now.Add(time.Hour)}
	done := e.v
	done.ID, done.Title = 0, "drawn"
	done.DrawDoneAt = &now
	for _, v := range []*voucher.Voucher{&plain, &done} {
		if err := store.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.Set(ctx, e.keys.State(v.ID), "not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	taught := NewRouter(e.rdb, e.keys)
	taught.Learn([]voucher.Voucher{e.v, plain, done})
	for _, v := range []voucher.Voucher{plain, done} {
		if _, handled, err := taught.Enter(ctx, v.ID, 5, 1, ""); err != nil || handled {
			t.Errorf("taught, voucher %q: handled %v, %v; want a purchase, no read of its state", v.Title, handled, err)
		}
		if _, _, err := NewRouter(e.rdb, e.keys).Enter(ctx, v.ID, 5, 1, ""); err == nil {
			t.Errorf("untaught, voucher %q: no error; the test's unreadable state was not read", v.Title)
		}
	}
	if got, handled, err := taught.Enter(ctx, e.v.ID, 5, 9, ""); err != nil || !handled || got.Ticket != 9 {
		t.Fatalf("the draw not done, taught: %+v handled %v, %v; want entered with ticket 9", got, handled, err)
	}
}
