package bucket

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSettleDecidesEveryMove: two moves cut by their movers' deaths, too
// fresh for the recovery loop, are listed with their receivers' marks and
// decided at once by Settle: the one never applied goes back to its donor,
// the applied one is closed; a fence no rebuild holds is lifted, and while
// a rebuild holds the voucher its fences stay.
func TestSettleDecidesEveryMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	cut := func(step string, from, units int) {
		t.Helper()
		m := e.mover(Config{AfterStep: stopAfter(step)})
		if _, err := m.Move(ctx, e.v, from, 1, units, e.nb); !errors.Is(err, ErrStopped) {
			t.Fatalf("Move = %v, want ErrStopped", err)
		}
	}
	cut("take", 0, 4)
	cut("apply", 2, 2)
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	if err := NewRecoverer(m).Once(ctx); err != nil || e.journaled() != 2 {
		t.Fatalf("recovery loop: %v, %d journaled; want both fresh moves left to their movers", err, e.journaled())
	}

	moves, err := m.Moves(ctx, e.v, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		from, to, units int
		mark            string
	}
	var got []seen
	for _, mv := range moves {
		got = append(got, seen{mv.From, mv.To, mv.Units, mv.Mark})
	}
	if want := []seen{{0, 1, 4, ""}, {2, 1, 2, outcomeApplied}}; !slices.Equal(got, want) {
		t.Fatalf("Moves = %+v, want %+v", got, want)
	}

	// A rebuild holds the voucher: the moves are settled, its fences kept.
	h, err := m.hold(ctx, e.v, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.fenceAll(h.l.Context(), e.v, e.nb, h.value); err != nil {
		t.Fatal(err)
	}
	settled, fenced, err := m.Settle(ctx, e.v, e.nb)
	if err != nil || !fenced {
		t.Fatalf("Settle = %v, fenced %v; want the moves settled and the rebuild's fences kept", err, fenced)
	}
	var outcomes []string
	for _, mv := range settled {
		outcomes = append(outcomes, mv.Outcome)
	}
	if want := []string{outcomeRefused, outcomeApplied}; !slices.Equal(outcomes, want) {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 2, 3}) {
		t.Errorf("stocks %v, want [10 2 3]", got)
	}
	e.settled()
	if f := e.fenceOf(0); f != h.value {
		t.Errorf("a held rebuild's fence is %q, want %q", f, h.value)
	}

	// The rebuild dies without lifting them: Settle lifts them.
	h.l.Stop()
	if err := e.rdb.Del(ctx, leaseKey(e.keys, e.v, e.nb)).Err(); err != nil {
		t.Fatal(err)
	}
	if settled, fenced, err := m.Settle(ctx, e.v, e.nb); err != nil || fenced || len(settled) != 0 {
		t.Fatalf("Settle = %v, %v, %v; want nothing to settle and the fences lifted", settled, fenced, err)
	}
	e.unfenced("after Settle")
}

// TestSettleNamesWhatItCannotDecide: a move whose receiver's mark key
// holds another type cannot be decided; Settle still decides the
// voucher's other moves, and reports that one in its Err and in the
// error (an operator must not be told the voucher is settled).
func TestSettleNamesWhatItCannotDecide(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	for _, from := range []int{0, 2} {
		if _, err := e.mover(Config{AfterStep: stopAfter("take")}).Move(ctx, e.v, from, 1, 2, e.nb); !errors.Is(err, ErrStopped) {
			t.Fatalf("Move = %v, want ErrStopped", err)
		}
	}
	ids, err := e.rdb.HKeys(ctx, e.journal(0)).Result()
	if err != nil || len(ids) != 1 {
		t.Fatal(ids, err)
	}
	bad := ids[0]
	if err := e.rdb.HSet(ctx, markKey(e.keys, e.shard(1), bad), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	moves, _, err := m.Settle(ctx, e.v, e.nb)
	if !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), bad) {
		t.Errorf("Settle = %v, want the move %s named, its mark of another type", err, bad)
	}
	for _, mv := range moves {
		switch {
		case mv.ID == bad && mv.Err == "":
			t.Errorf("the move left undecided has no Err: %+v", mv)
		case mv.ID != bad && (mv.Err != "" || mv.Outcome != outcomeRefused):
			t.Errorf("the other move %+v, want refused (never applied)", mv)
		}
	}
	if len(moves) != 2 || e.journaled() != 1 {
		t.Errorf("%d moves listed, %d journaled; want 2 listed and the bad one left", len(moves), e.journaled())
	}
	if got := e.stocks(); !slices.Equal(got, []int64{8, 0, 5}) {
		t.Errorf("stocks %v, want the decided move's 2 units back: [8 0 5]", got)
	}
}

// TestSettleTouchesOnlyItsVoucher: the journals hold the moves of every
// voucher whose buckets share the shards; Moves and Settle of one voucher
// leave another's move alone (it may still be in its mover's hands).
func TestSettleTouchesOnlyItsVoucher(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10, 0, 5)
	ctx := context.Background()
	if _, err := e.mover(Config{AfterStep: stopAfter("take")}).Move(ctx, e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	other := e.v + 1
	rec := strconv.FormatInt(other, 10) + ":1:3:3:" + strconv.FormatInt(time.Now().UnixMilli(), 10)
	if err := e.rdb.HSet(ctx, e.journal(0), "other-voucher", rec).Err(); err != nil {
		t.Fatal(err)
	}
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	if moves, err := m.Moves(ctx, e.v, e.nb); err != nil || len(moves) != 1 || moves[0].ID == "other-voucher" {
		t.Errorf("Moves = %+v, %v; want voucher %d's one move", moves, err, e.v)
	}
	settled, _, err := m.Settle(ctx, e.v, e.nb)
	if err != nil || len(settled) != 1 {
		t.Fatalf("Settle = %+v, %v; want voucher %d's one move settled", settled, err, e.v)
	}
	if got, err := e.rdb.HGet(ctx, e.journal(0), "other-voucher").Result(); err != nil || got != rec {
		t.Errorf("voucher %d's move: %q, %v; want it left journaled", other, got, err)
	}
	if n, _ := e.rdb.Exists(ctx, markKey(e.keys, e.keys.BucketShard(other, 1, 3), "other-voucher")).Result(); n != 0 {
		t.Errorf("voucher %d's move was resolved by Settle of voucher %d", other, e.v)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 5}) {
		t.Errorf("stocks %v, want [10 0 5]", got)
	}
}
