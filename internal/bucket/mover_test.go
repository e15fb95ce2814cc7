package bucket

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestMoveCompletes: a move that runs to the end (T1, T2, T3) leaves the
// units in the receiver, nothing journaled, the move's mark "applied".
func TestMoveCompletes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	m := e.mover(Config{})
	moved, err := m.Move(context.Background(), e.v, 0, 1, 4, e.nb)
	if err != nil || moved != 4 {
		t.Fatalf("Move = %d, %v; want 4", moved, err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{6, 4, 5}) {
		t.Errorf("stocks %v, want [6 4 5]", got)
	}
	if a := e.bucket(1).alloc; a != 4 {
		t.Errorf("receiver alloc %d, want 4", a)
	}
	e.settled()
	if s := m.Stats(); s != (Stats{Applied: 1, Units: 4}) {
		t.Errorf("stats %+v", s)
	}
	// More than the donor holds: the donor's stock.
	if moved, err := m.Move(context.Background(), e.v, 2, 1, 100, e.nb); err != nil || moved != 5 {
		t.Fatalf("Move of 100 from 5 = %d, %v; want 5", moved, err)
	}
	e.settled()
}

// TestCrashAfterTake (row T1): the mover dies after the take; the units
// are in the donor's journal only; the Recoverer refuses the move on the
// receiver (a tombstone) and gives the units back to the donor.
func TestCrashAfterTake(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	m := e.mover(Config{AfterStep: stopAfter("take"), StaleAfter: time.Millisecond})
	if _, err := m.Move(context.Background(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatalf("Move = %v, want ErrStopped", err)
	}
	if got, d := e.stocks(), e.bucket(0); !slices.Equal(got, []int64{6, 0, 5}) || d.out != 4 || d.alloc != 6 {
		t.Fatalf("after take: stocks %v, donor %+v", got, d)
	}
	r := NewRecoverer(m)
	e.recoverAll(r)
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v, want the units back: [10 0 5]", got)
	}
	e.settled()
	if s := r.Stats(); s != (Stats{Returned: 1}) {
		t.Errorf("recoverer stats %+v", s)
	}
}

// TestCrashAfterApply (row T2): the mover dies after the apply; the
// receiver holds the units and the donor still owes the move (out); the
// Recoverer reads "applied" and closes the move on the donor.
func TestCrashAfterApply(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	m := e.mover(Config{AfterStep: stopAfter("apply"), StaleAfter: time.Millisecond})
	if _, err := m.Move(context.Background(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatalf("Move = %v, want ErrStopped", err)
	}
	if got, d := e.stocks(), e.bucket(0); !slices.Equal(got, []int64{6, 4, 5}) || d.out != 4 {
		t.Fatalf("after apply: stocks %v, donor %+v", got, d)
	}
	r := NewRecoverer(m)
	e.recoverAll(r)
	if got := e.stocks(); !slices.Equal(got, []int64{6, 4, 5}) {
		t.Errorf("stocks %v, want [6 4 5]", got)
	}
	e.settled()
	if s := r.Stats(); s != (Stats{Applied: 1, Units: 4}) {
		t.Errorf("recoverer stats %+v", s)
	}
}

// TestWaitShortStopsMove (rows WAIT): a take no replica confirms (this
// server has none) stops the move after T1 and is returned at once by
// its mover; a move cut after its take is not closed by a Recoverer whose
// resolve no replica confirms; one that asks for none returns it.
func TestWaitShortStopsMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond, StaleAfter: time.Hour})
	if _, err := m.Move(ctx, e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("Move = %v, want ErrNotReplicated", err)
	}
	// The unconfirmed take is returned at once, not left in transit.
	if n := e.journaled(); n != 0 {
		t.Fatalf("%d moves journaled after an unconfirmed take, want it closed", n)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v, want [10 0 5]", got)
	}
	if st := m.Stats(); st.Returned != 1 || st.Applied != 0 {
		t.Errorf("stats %+v, want one returned", st)
	}
	e.settled()

	// A move cut after its take, then recovered by a Recoverer whose
	// resolve is not confirmed: the entry stays until a resolve is.
	crash := e.mover(Config{AfterStep: stopAfter("take")})
	if _, err := crash.Move(ctx, e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	ids, err := e.rdb.HKeys(ctx, e.journal(0)).Result()
	if err != nil || len(ids) != 1 {
		t.Fatal(ids, err)
	}
	unconfirmed := NewRecoverer(e.mover(Config{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond, StaleAfter: time.Millisecond}))
	testenv.WaitFor(t, 5*time.Second, "the move resolved", func() bool {
		if err := unconfirmed.Once(ctx); err != nil {
			t.Fatal(err)
		}
		mark, _ := e.rdb.Get(ctx, markKey(e.keys, e.shard(1), ids[0])).Result()
		return mark == outcomeRefused
	})
	if n := e.journaled(); n != 1 {
		t.Fatalf("%d moves journaled after an unconfirmed resolve, want 1", n)
	}
	e.recoverAll(NewRecoverer(e.mover(Config{StaleAfter: time.Millisecond})))
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v, want [10 0 5]", got)
	}
	e.settled()
}

// TestRecovererLeavesFreshMoves: a move younger than StaleAfter is its
// mover's to finish; the Recoverer reports its age and leaves it.
func TestRecovererLeavesFreshMoves(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	m := e.mover(Config{AfterStep: stopAfter("take"), StaleAfter: time.Hour})
	if _, err := m.Move(context.Background(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	r := NewRecoverer(m)
	if err := r.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.journaled(); n != 1 {
		t.Errorf("%d moves journaled, want the fresh one left", n)
	}
	if r.Oldest() < 0 || r.Oldest() > time.Minute {
		t.Errorf("Oldest = %s", r.Oldest())
	}
}

// TestRecovererBadEntry: an unparseable journal entry and a move whose
// receiver state is a wrong-typed key are left (and logged); the other
// moves are recovered in the same pass.
func TestRecovererBadEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{AfterStep: stopAfter("take"), StaleAfter: time.Millisecond})
	if _, err := m.Move(ctx, e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, e.journal(0), "junk", "not a record").Err(); err != nil {
		t.Fatal(err)
	}
	bad, err := m.take(ctx, "badmark", e.v, 2, 1, 2, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.HSet(ctx, markKey(e.keys, e.shard(1), bad.id), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	r := NewRecoverer(m)
	testenv.WaitFor(t, 5*time.Second, "good move recovered", func() bool { _ = r.Once(ctx); return e.bucket(0).out == 0 })
	if n := e.journaled(); n != 2 {
		t.Errorf("%d entries journaled, want the 2 bad ones left", n)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 3}) {
		t.Errorf("stocks %v, want [10 0 3]", got)
	}
}

// TestRecovererRun: the loop recovers a crashed move by itself and
// returns when its context ends.
func TestRecovererRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	m := e.mover(Config{AfterStep: stopAfter("take"), StaleAfter: time.Millisecond})
	if _, err := m.Move(context.Background(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewRecoverer(m).Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "move recovered", func() bool { return e.journaled() == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.settled()
}

// TestRecovererClosesMoveOlderThanMarks: a move older than half the
// marks' life may have lost its mark. It is closed with the mark when the
// mark is still there (refused: its units back), and as applied when it
// is gone: never with a tombstone, which could give applied units back
// twice. A move never applied whose mark is gone loses its units (the
// allocs add up to less than the total), and never makes any.
func TestRecovererClosesMoveOlderThanMarks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	old := strconv.FormatInt(time.Now().Add(-2*time.Hour).UnixMilli(), 10)
	// Two old takes of 3 units each out of bucket 0 toward bucket 1, never
	// applied: one's receiver still holds a "refused" mark, the other's
	// mark is gone.
	for _, id := range []string{"refused-kept", "mark-gone"} {
		if err := e.rdb.HSet(ctx, e.journal(0), id, strconv.FormatInt(e.v, 10)+":1:3:3:"+old).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.HSet(ctx, e.state(0), "stock", 4, voucher.FieldAlloc, 4, voucher.FieldOut, 6).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Set(ctx, markKey(e.keys, e.shard(1), "refused-kept"), outcomeRefused, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	r := NewRecoverer(e.mover(Config{StaleAfter: time.Millisecond}))
	if err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.journaled(); n != 0 {
		t.Errorf("%d journaled, want both old moves closed", n)
	}
	if n, _ := e.rdb.Exists(ctx, markKey(e.keys, e.shard(1), "mark-gone")).Result(); n != 0 {
		t.Error("a tombstone was written for a move older than the marks")
	}
	if s := e.bucket(0); s.stock != 7 || s.alloc != 7 || s.out != 0 {
		t.Errorf("donor %+v, want the refused move's 3 units back and the other's closed as applied", s)
	}
	if s := e.bucket(1); s.stock != 0 || s.alloc != 0 {
		t.Errorf("receiver %+v, want nothing made", s)
	}
	if st := r.Stats(); st.Returned != 1 || st.Applied != 1 {
		t.Errorf("stats %+v, want one returned, one applied", st)
	}
}
