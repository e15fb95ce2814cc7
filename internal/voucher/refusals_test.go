package voucher

import (
	"errors"
	"log/slog"
	"testing"
	"time"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newFakeRefusals(ttl time.Duration, buyers int) (*Refusals, *fakeClock) {
	c := &fakeClock{t: time.Unix(1_000_000, 0)}
	return NewRefusals(nil, NewKeys("t", 4), RefusalsConfig{TTL: ttl, Buyers: buyers, Now: c.now}, slog.New(slog.DiscardHandler)), c
}

// TestRefusalsKeep: what is kept, for how long, and what an event drops.
func TestRefusalsKeep(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	r, c := newFakeRefusals(ttl, 0)

	r.Learn(r.Mark(), 1, 10, Reservation{}, ErrSoldOut)
	c.t = c.t.Add(ttl - time.Millisecond)
	_ = r.Lookup(1, 12) // the one sent to Redis to renew it (TestRefusalRenewedByOnePurchase)
	if err := r.Lookup(1, 11); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("within the bound: %v, want sold out", err)
	}
	c.t = c.t.Add(time.Millisecond)
	if err := r.Lookup(1, 11); err != nil {
		t.Fatalf("at the bound: %v, want nothing", err)
	}

	// not_started: kept only until one bound before the begin.
	m := r.Mark()
	r.Learn(m, 2, 10, Reservation{}, &NotStartedError{Until: 250 * time.Millisecond})
	if err := r.Lookup(2, 10); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("begin 250ms away: %v, want not started", err)
	}
	c.t = c.t.Add(50 * time.Millisecond)
	if err := r.Lookup(2, 10); err != nil {
		t.Fatalf("begin one bound away: %v, want nothing", err)
	}
	r.Learn(r.Mark(), 3, 10, Reservation{}, &NotStartedError{Until: ttl})
	if err := r.Lookup(3, 10); err != nil {
		t.Fatalf("begin one bound away when answered: %v kept", err)
	}

	// A buyer's order comes before the voucher's refusal.
	r.Learn(r.Mark(), 4, 10, Reservation{OrderID: 77}, nil)
	r.Learn(r.Mark(), 4, 11, Reservation{}, ErrEnded)
	var held *PurchasedError
	if err := r.Lookup(4, 10); !errors.As(err, &held) || held.OrderID != 77 {
		t.Fatalf("buyer 10: %v, want order 77", err)
	}
	if err := r.Lookup(4, 12); !errors.Is(err, ErrEnded) {
		t.Fatalf("buyer 12: %v, want ended", err)
	}

	// An event between the send and the answer: the answer is not kept.
	m = r.Mark()
	r.apply("g 5 10")
	r.Learn(m, 5, 11, Reservation{}, ErrSoldOut)
	if err := r.Lookup(5, 11); err != nil {
		t.Fatalf("answer sent before an event kept: %v", err)
	}

	// Events: a give-back drops the voucher's refusal and that buyer only.
	r.Learn(r.Mark(), 4, 13, Reservation{OrderID: 78}, nil)
	r.apply("g 4 10")
	if err := r.Lookup(4, 12); err != nil {
		t.Fatalf("after a give-back: %v", err)
	}
	if err := r.Lookup(4, 10); err != nil {
		t.Fatalf("given-back buyer still held: %v", err)
	}
	if err := r.Lookup(4, 13); err == nil {
		t.Fatal("another buyer forgotten on a give-back")
	}
	// A rebuild of shard 0 (vouchers 4, 8 of 4 shards) drops them, not 5.
	r.Learn(r.Mark(), 8, 1, Reservation{}, ErrSoldOut)
	r.Learn(r.Mark(), 5, 1, Reservation{}, ErrSoldOut)
	r.apply("r 0")
	if r.Lookup(4, 13) != nil || r.Lookup(8, 1) != nil || r.Lookup(5, 1) == nil {
		t.Fatal("a rebuild of shard 0 dropped the wrong answers")
	}
	r.apply("l 5")
	if r.Lookup(5, 1) != nil {
		t.Fatal("a loaded voucher's refusal kept")
	}
	r.Learn(r.Mark(), 6, 1, Reservation{}, ErrSoldOut)
	r.apply("nonsense")
	if r.Lookup(6, 1) != nil {
		t.Fatal("an unknown event did not drop everything")
	}
	// Answers that are no refusal are never kept.
	for _, err := range []error{ErrNotReady, ErrNoState, ErrNotReplicated, ErrWrongType, errors.New("down")} {
		r.Learn(r.Mark(), 7, 1, Reservation{}, err)
		if got := r.Lookup(7, 1); got != nil {
			t.Fatalf("after %v: %v kept", err, got)
		}
	}
	var nilRefusals *Refusals
	nilRefusals.Learn(nilRefusals.Mark(), 1, 1, Reservation{}, ErrSoldOut)
	if nilRefusals.Lookup(1, 1) != nil {
		t.Fatal("nil Refusals answered")
	}
}

// TestRefusalsBuyerCap: however many buyers are learnt, no more than the
// cap are remembered.
func TestRefusalsBuyerCap(t *testing.T) {
	t.Parallel()
	const cap = 640
	r, _ := newFakeRefusals(time.Hour, cap)
	for u := range int64(20_000) {
		r.Learn(r.Mark(), 1+u%3, u, Reservation{OrderID: u}, nil)
		if u%1000 == 0 && r.Buyers() > cap {
			t.Fatalf("%d buyers remembered, cap %d", r.Buyers(), cap)
		}
	}
	if n := r.Buyers(); n > cap || n < cap/2 {
		t.Fatalf("%d buyers remembered, want at most %d (and most of it used)", n, cap)
	}
}

// TestRefusalsHolderNeverSoldOut: a buyer known to hold an order is
// answered already_purchased while that answer is fresh, and after it is
// asked of Redis again, never answered the voucher's sold_out: Redis checks
// the buyer first.
func TestRefusalsHolderNeverSoldOut(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	r, c := newFakeRefusals(ttl, 0)
	r.Learn(r.Mark(), 1, 10, Reservation{OrderID: 77}, nil)
	c.t = c.t.Add(ttl)
	r.Learn(r.Mark(), 1, 11, Reservation{}, ErrSoldOut) // learnt after the buyer's answer expired
	if err := r.Lookup(1, 10); err != nil {
		t.Fatalf("holder whose answer expired: %v, want nothing (ask Redis)", err)
	}
	if err := r.Lookup(1, 12); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("unknown buyer: %v, want sold out", err)
	}
	// Events that drop answers expire the buyers' instead: asked of Redis.
	r.Learn(r.Mark(), 1, 10, Reservation{}, &PurchasedError{OrderID: 77})
	r.apply("l 1")
	r.Learn(r.Mark(), 1, 11, Reservation{}, ErrSoldOut)
	if err := r.Lookup(1, 10); err != nil {
		t.Fatalf("holder after a load: %v, want nothing (ask Redis)", err)
	}
	r.forgetAll()
	r.Learn(r.Mark(), 1, 11, Reservation{}, ErrSoldOut)
	if err := r.Lookup(1, 10); err != nil {
		t.Fatalf("holder after a resubscribe: %v, want nothing (ask Redis)", err)
	}
}

// TestRefusalsAnnouncements: what one instance queues, encoded and applied
// by another, makes it answer already_purchased with the order, for what
// is left of the bound; an announcement older than the bound, and a
// written order, make it ask Redis about that buyer.
func TestRefusalsAnnouncements(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	a, ca := newFakeRefusals(ttl, 0)
	b, cb := newFakeRefusals(ttl, 0)
	b.Learn(b.Mark(), 1, 99, Reservation{}, ErrSoldOut)
	a.Learn(a.Mark(), 1, 10, Reservation{OrderID: 77}, nil)
	a.Learn(a.Mark(), 2, 11, Reservation{OrderID: 78}, nil)
	ca.t = ca.t.Add(50 * time.Millisecond) // queued 50ms before the publish
	batch := []accepted{<-a.out, <-a.out}
	b.apply(string(a.encodeAccepted(nil, batch)))
	var held *PurchasedError
	if err := b.Lookup(1, 10); !errors.As(err, &held) || held.OrderID != 77 {
		t.Fatalf("announced buyer: %v, want order 77", err)
	}
	cb.t = cb.t.Add(ttl - 50*time.Millisecond)
	if err := b.Lookup(1, 10); err != nil {
		t.Fatalf("announced buyer past the bound: %v, want nothing (ask Redis)", err)
	}

	// Too old when it arrives: asked of Redis, not sold out.
	b.Learn(b.Mark(), 3, 99, Reservation{}, ErrSoldOut)
	b.apply("a 300000 3 12 79")
	if err := b.Lookup(3, 12); err != nil {
		t.Fatalf("buyer announced too late: %v, want nothing (ask Redis)", err)
	}
	if err := b.Lookup(3, 13); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("other buyer: %v, want sold out", err)
	}

	// Written: a fresh answer and an unknown buyer are both asked of Redis.
	b.apply("a 0 3 14 80")
	b.apply("w 3 14 81 3 15 82")
	if b.Lookup(3, 14) != nil || b.Lookup(3, 15) != nil || !errors.Is(b.Lookup(3, 16), ErrSoldOut) {
		t.Fatal("a written event did not send exactly its buyers to Redis")
	}
	for _, bad := range []string{"a", "a x 1 2 3", "a 0 1 2", "w 1 2", "w 1 2 x"} {
		b.Learn(b.Mark(), 4, 99, Reservation{}, ErrSoldOut)
		b.apply(bad)
		if b.Lookup(4, 1) != nil {
			t.Fatalf("malformed %q did not drop everything", bad)
		}
	}
}

// TestRefusalsAnnounceQueueBounded: with nothing publishing, accepted
// purchases past the queue's bound are dropped, never waited for.
func TestRefusalsAnnounceQueueBounded(t *testing.T) {
	t.Parallel()
	c := &fakeClock{t: time.Unix(1_000_000, 0)}
	r := NewRefusals(nil, NewKeys("t", 4), RefusalsConfig{TTL: time.Second, Queue: 8, Now: c.now}, slog.New(slog.DiscardHandler))
	for u := range int64(100) {
		r.Learn(r.Mark(), 1, u, Reservation{OrderID: u}, nil)
	}
	if len(r.out) != 8 {
		t.Fatalf("%d queued, want the bound 8", len(r.out))
	}
}

// TestRefusalsBuyerCapAnnounced: announcements and written orders from
// other instances stay under the same cap.
func TestRefusalsBuyerCapAnnounced(t *testing.T) {
	t.Parallel()
	const cap = 640
	r, _ := newFakeRefusals(time.Hour, cap)
	for round := range int64(40) {
		var a, w []byte
		a = append(a, eventAccepted+" 0"...)
		w = append(w, eventWritten...)
		for i := range int64(500) {
			u := round*500 + i
			a = appendInts(a, 1+u%3, u, u)
			w = appendInts(w, 4+u%3, u, u)
		}
		r.apply(string(a))
		r.apply(string(w))
		if r.Buyers() > cap {
			t.Fatalf("%d buyers remembered, cap %d", r.Buyers(), cap)
		}
	}
	if n := r.Buyers(); n < cap/2 {
		t.Fatalf("%d buyers remembered, want most of the cap %d used", n, cap)
	}
}

// TestLateAnnouncementAfterGiveBack: an accepted purchase is announced in
// a batch some milliseconds after it was accepted; when its reservation was
// given back meanwhile (a dead letter), the give-back may arrive first. The
// late announcement must not make the buyer's order look held again: the
// buyer may buy again, and is asked of Redis.
func TestLateAnnouncementAfterGiveBack(t *testing.T) {
	t.Parallel()
	r, _ := newFakeRefusals(time.Hour, 0)
	r.Learn(r.Mark(), 3, 99, Reservation{}, ErrSoldOut)
	r.apply("g 3 12 79")   // order 79 of buyer 12 given back
	r.apply("a 0 3 12 79") // its announcement, late
	if err := r.Lookup(3, 12); err != nil {
		t.Fatalf("after the give-back and a late announcement: %v, want the buyer asked of Redis", err)
	}
	r.apply("a 0 3 12 81") // a new order of the same buyer is held
	var held *PurchasedError
	if err := r.Lookup(3, 12); !errors.As(err, &held) || held.OrderID != 81 {
		t.Fatalf("the buyer's new order: %v, want order 81", err)
	}
}

// TestRefusalRenewedByOnePurchase: in the last quarter of a sold-out
// answer's bound, exactly one purchase goes to Redis to renew it while the
// others are still answered from memory; once it is renewed, all are
// answered again, and an answer that nobody renewed expires on time.
func TestRefusalRenewedByOnePurchase(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	r, c := newFakeRefusals(ttl, 0)
	r.Learn(r.Mark(), 1, 10, Reservation{}, ErrSoldOut)
	c.t = c.t.Add(ttl * 3 / 4)
	toRedis := 0
	for u := range int64(100) {
		if r.Lookup(1, 100+u) == nil {
			toRedis++
		}
	}
	if toRedis != 1 {
		t.Fatalf("%d of 100 purchases sent to Redis in the renewal window, want 1", toRedis)
	}
	// Redis answers the renewing purchase: sold out for another bound.
	r.Learn(r.Mark(), 1, 200, Reservation{}, ErrSoldOut)
	c.t = c.t.Add(ttl / 2)
	if err := r.Lookup(1, 300); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("after the renewal: %v, want sold out", err)
	}
	// Nobody renews this time (the purchase sent failed): it expires.
	c.t = c.t.Add(ttl / 4)
	_ = r.Lookup(1, 301) // the one sent to renew it
	c.t = c.t.Add(ttl / 4)
	if err := r.Lookup(1, 302); err != nil {
		t.Fatalf("past the bound, not renewed: %v, want nothing", err)
	}
}

// TestAnnouncedAgeIsTheOldest: purchases are queued for announcement in
// the order Redis answered them, so an older purchase can follow a younger
// one; the batch is aged by its oldest, and no instance keeps an answer
// past its bound.
func TestAnnouncedAgeIsTheOldest(t *testing.T) {
	t.Parallel()
	const ttl = 200 * time.Millisecond
	a, ca := newFakeRefusals(ttl, 0)
	b, cb := newFakeRefusals(ttl, 0)
	sentA := a.Mark() // purchase A sent at 0
	ca.t = ca.t.Add(150 * time.Millisecond)
	sentB := a.Mark() // purchase B sent at 150ms
	ca.t = ca.t.Add(5 * time.Millisecond)
	a.Learn(sentB, 1, 20, Reservation{OrderID: 2}, nil) // B answered first
	a.Learn(sentA, 1, 10, Reservation{OrderID: 1}, nil) // then A
	ca.t = ca.t.Add(5 * time.Millisecond)               // announced at 160ms
	b.apply(string(a.encodeAccepted(nil, []accepted{<-a.out, <-a.out})))
	// Both are kept on b for what is left of the oldest's bound: 40ms.
	cb.t = cb.t.Add(39 * time.Millisecond) // 199ms after A was sent
	for user, order := range map[int64]int64{10: 1, 20: 2} {
		var held *PurchasedError
		if err := b.Lookup(1, user); !errors.As(err, &held) || held.OrderID != order {
			t.Fatalf("buyer %d, 199ms after the oldest was sent (bound 200ms): %v, want order %d", user, err, order)
		}
	}
	cb.t = cb.t.Add(2 * time.Millisecond) // 201ms after A was sent
	for _, user := range []int64{10, 20} {
		if err := b.Lookup(1, user); err != nil {
			t.Fatalf("buyer %d, 201ms after the oldest of the batch was sent (bound 200ms), still answered: %v", user, err)
		}
	}
	cb.t = cb.t.Add(59 * time.Millisecond) // 260ms after A was sent
	var held *PurchasedError
	if err := b.Lookup(1, 10); errors.As(err, &held) {
		t.Fatalf("A's answer, sent to Redis 260ms ago (bound 200ms), still answered: %v", err)
	}
}

// TestGivenBackSurvivesAReload: a voucher loaded or a shard rebuilt
// expires what is kept, but an order given back stays given back, so its
// late announcement is still ignored.
func TestGivenBackSurvivesAReload(t *testing.T) {
	t.Parallel()
	r, _ := newFakeRefusals(time.Hour, 0)
	r.apply("a 0 3 12 79")
	var held *PurchasedError
	if err := r.Lookup(3, 12); !errors.As(err, &held) || held.OrderID != 79 {
		t.Fatalf("an announced order: %v, want order 79 held", err)
	}
	r.apply("g 3 12 79")
	r.apply("l 3")
	r.apply("a 0 3 12 79")
	if err := r.Lookup(3, 12); errors.As(err, &held) {
		t.Fatalf("a given-back order answered as held after a reload: %v", err)
	}
	// Announcements after the reload are kept: the same buyer's next
	// order, and another buyer's.
	r.apply("a 0 3 12 80 3 13 81")
	for user, order := range map[int64]int64{12: 80, 13: 81} {
		if err := r.Lookup(3, user); !errors.As(err, &held) || held.OrderID != order {
			t.Fatalf("buyer %d after the reload: %v, want order %d held", user, err, order)
		}
	}
}
