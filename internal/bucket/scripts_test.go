package bucket

import (
	"context"
	"errors"
	"slices"
	"testing"

	"seckill/internal/lease"
	"time"
)

// TestApplyOnce: a second apply of the same move changes nothing and
// reports the first's outcome.
func TestApplyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{})
	mv, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if out, err := m.applyOrResolve(ctx, mv); err != nil || out != outcomeApplied {
			t.Fatalf("apply %d = %q, %v", i, out, err)
		}
	}
	if s := e.bucket(1); s.stock != 4 || s.alloc != 4 {
		t.Errorf("receiver %+v, want stock and alloc 4", s)
	}
	if err := m.close(ctx, mv, outcomeApplied, &m.stats); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

// TestLateApplyRefused: once resolve wrote its tombstone, an apply of the
// move (its mover woke up late) is refused and adds nothing; closing the
// move refused gives the units back.
func TestLateApplyRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{})
	mv, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := m.resolve(ctx, mv); err != nil || out != outcomeRefused {
		t.Fatalf("resolve = %q, %v", out, err)
	}
	if out, err := m.applyOrResolve(ctx, mv); err != nil || out != outcomeRefused {
		t.Fatalf("late apply = %q, %v; want refused", out, err)
	}
	if s := e.bucket(1); s.stock != 0 || s.alloc != 0 {
		t.Errorf("receiver %+v, want nothing added", s)
	}
	if err := m.close(ctx, mv, outcomeRefused, &m.stats); err != nil {
		t.Fatal(err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v", got)
	}
	e.settled()
}

// TestApplyTooOld: a take older than ApplyWindow by the receiver's clock
// is refused (mark "refused"), adds nothing, and a second try still
// refuses.
func TestApplyTooOld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{ApplyWindow: time.Second})
	mv, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	old := mv
	old.at -= 2000 // taken 2s earlier than it was
	for i := range 2 {
		if out, err := m.applyOrResolve(ctx, old); err != nil || out != outcomeRefused {
			t.Fatalf("apply %d of a 2s old take = %q, %v; want refused", i, out, err)
		}
	}
	if s := e.bucket(1); s.stock != 0 || s.alloc != 0 {
		t.Errorf("receiver %+v, want nothing added", s)
	}
	if out, err := m.applyOrResolve(ctx, mv); err != nil || out != outcomeRefused {
		t.Fatalf("apply after the refusal = %q, %v; want refused", out, err)
	}
	if err := m.close(ctx, mv, outcomeRefused, &m.stats); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

// TestTakeSameIDTwice: a take retried with its id journals and takes
// once, and answers the journaled record.
func TestTakeSameIDTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{})
	id := lease.NewToken()
	first, err := m.take(ctx, id, e.v, 0, 1, 4, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.take(ctx, id, e.v, 0, 1, 4, e.nb)
	if err != nil || again != first {
		t.Fatalf("take again = %+v, %v; want %+v", again, err, first)
	}
	if s := e.bucket(0); s.stock != 6 || s.alloc != 6 || s.out != 4 {
		t.Errorf("donor %+v, want one take of 4", s)
	}
	if n := e.journaled(); n != 1 {
		t.Errorf("%d journaled", n)
	}
}

// TestTakeFenced: a fenced bucket gives nothing; lifting the fence lets
// it give again. Empty and not-ready donors give nothing either.
func TestTakeFenced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{})
	for _, b := range []int{0, 1} {
		if _, err := m.fenceOp(ctx, e.v, e.nb, b, "set", "3:t"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrFenced) {
		t.Fatalf("take from a fenced bucket = %v, want ErrFenced", err)
	}
	if s := e.bucket(0); s.stock != 10 || s.out != 0 {
		t.Errorf("fenced donor %+v changed", s)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 2, 1, 4, e.nb); err != nil {
		t.Fatalf("take from the unfenced bucket: %v", err)
	}
	if _, err := m.fenceOp(ctx, e.v, e.nb, 0, "lift", "3:other"); !errors.Is(err, ErrFenceLost) {
		t.Fatalf("lift of another's fence = %v, want ErrFenceLost", err)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrFenced) {
		t.Fatalf("take after another's lift = %v, want ErrFenced", err)
	}
	for _, b := range []int{0, 1} {
		if _, err := m.fenceOp(ctx, e.v, e.nb, b, "lift", "3:t"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb); err != nil {
		t.Fatalf("take after the fence lifted: %v", err)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 1, 0, 4, e.nb); !errors.Is(err, ErrEmpty) {
		t.Errorf("take from an empty bucket = %v, want ErrEmpty", err)
	}
	if err := e.rdb.Del(ctx, e.keys.Ready(e.shard(0))).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrNotReady) {
		t.Errorf("take from a bucket not ready = %v, want ErrNotReady", err)
	}
}

// TestCloseDonorWithoutStateForgets: a donor that lost its state (its
// shard not ready), or a donor bucket left out of its shard's rebuild
// (ready shard, no state: voucher.State.DropAt), has the move dropped from
// its journal with no stock or alloc change and no state made up; its
// rebuild or load counts it. (Left out, the close used to answer "no
// state" and keep the move, and the load's drain failed on it for ever.)
func TestCloseDonorWithoutStateForgets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		drop func(e *env) string // the key deleted
	}{
		{"shard not ready", func(e *env) string { return e.keys.Ready(e.shard(0)) }},
		{"bucket without state", func(e *env) string { return e.state(0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 10, 0, 5)
			ctx := context.Background()
			m := e.mover(Config{})
			mv, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.rdb.Del(ctx, c.drop(e)).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := m.settle(ctx, journaled{id: mv.id, e: mv}, &m.stats); err != nil {
				t.Fatal(err)
			}
			if n := e.journaled(); n != 0 {
				t.Errorf("%d journaled, want the move forgotten", n)
			}
			state, err := e.rdb.HGetAll(ctx, e.state(0)).Result()
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.name == "bucket without state" && len(state) != 0:
				t.Errorf("the close made up a state for the donor: %v", state)
			case c.name == "shard not ready" && (state["stock"] != "6" || state["alloc"] != "6" || state["out"] != "4"):
				t.Errorf("donor %v, want untouched by the close (stock 6, alloc 6, out 4)", state)
			}
		})
	}
}

// TestMoveToReceiverNotReady: a receiver that is not ready refuses the
// move for good (resolve's tombstone) and the units go back at once.
func TestMoveToReceiverNotReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	if err := e.rdb.Del(ctx, e.keys.Ready(e.shard(1))).Err(); err != nil {
		t.Fatal(err)
	}
	m := e.mover(Config{})
	if moved, err := m.Move(ctx, e.v, 0, 1, 4, e.nb); err != nil || moved != 0 {
		t.Fatalf("Move = %d, %v; want 0, nil", moved, err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v", got)
	}
	e.settled()
}

// TestTakeChecksBeforeWriting: a stock that is not an integer, or a
// journal of another type, refuses the take with nothing written.
func TestTakeChecksBeforeWriting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	m := e.mover(Config{})
	if err := e.rdb.HSet(ctx, e.state(2), "stock", "5.5").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 2, 1, 1, e.nb); !errors.Is(err, ErrNoState) {
		t.Errorf("take from stock 5.5 = %v, want ErrNoState", err)
	}
	if err := e.rdb.Set(ctx, e.journal(0), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrWrongType) {
		t.Errorf("take with a string journal = %v, want ErrWrongType", err)
	}
	if s := e.bucket(0); s != (bucketState{10, 10, 0}) {
		t.Errorf("donor %+v changed", s)
	}
	if n, _ := e.rdb.HLen(ctx, e.journal(2)).Result(); n != 0 {
		t.Errorf("%d journaled", n)
	}
}

// TestMoveToReceiverWithoutState: a receiver whose shard is ready but
// that has no state for the voucher cannot take the units either: the
// move is refused for good (resolve's tombstone) and the units go back
// to the donor at once, none left in transit for the Recoverer.
func TestMoveToReceiverWithoutState(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	if err := e.rdb.Del(ctx, e.state(1)).Err(); err != nil {
		t.Fatal(err)
	}
	m := e.mover(Config{StaleAfter: time.Hour})
	if moved, err := m.Move(ctx, e.v, 0, 1, 4, e.nb); err != nil || moved != 0 {
		t.Fatalf("Move = %d, %v; want 0, nil", moved, err)
	}
	if n := e.journaled(); n != 0 {
		t.Errorf("%d moves journaled, want the refused move closed at once", n)
	}
	if s := e.bucket(0); s != (bucketState{10, 10, 0}) {
		t.Errorf("donor %+v, want its 4 units back: {10 10 0}", s)
	}
	if st := m.Stats(); st != (Stats{Returned: 1}) {
		t.Errorf("stats %+v, want one returned", st)
	}
}
