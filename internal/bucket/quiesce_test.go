package bucket

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// fenceOf is bucket b's fence_until (0 when absent).
func (e *env) fenceOf(b int) int64 {
	e.tb.Helper()
	n, err := e.rdb.HGet(context.Background(), e.state(b), "fence_until").Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		e.tb.Fatal(err)
	}
	return n
}

// TestQuiesceReturnsMoveToLost: a move journaled towards the bucket being
// rebuilt and never applied is refused and its units go back to the
// donor; the other buckets are fenced until Release; the allocs read
// add up with the lost bucket's share to the total.
func TestQuiesceReturnsMoveToLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	crash := e.mover(Config{AfterStep: stopAfter("take")})
	if _, err := crash.Move(ctx, e.v, 0, 2, 3, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	m := e.mover(Config{ApplyWindow: 20 * time.Millisecond})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{0: 5, 1: 5}; !maps.Equal(q.Alloc, want) || len(q.NotReady) != 0 {
		t.Errorf("Quiet %v %v, want %v", q.Alloc, q.NotReady, want)
	}
	if e.fenceOf(0) == 0 || e.fenceOf(1) == 0 || e.fenceOf(2) != 0 {
		t.Errorf("fences %d %d %d, want buckets 0 and 1 fenced", e.fenceOf(0), e.fenceOf(1), e.fenceOf(2))
	}
	if _, err := m.Move(ctx, e.v, 0, 2, 1, e.nb); !errors.Is(err, ErrFenced) {
		t.Errorf("Move out of a fenced bucket = %v, want ErrFenced", err)
	}
	if _, err := m.Quiesce(ctx, e.v, e.nb, 2); !errors.Is(err, ErrLeaseHeld) {
		t.Errorf("second Quiesce = %v, want ErrLeaseHeld", err)
	}
	q.Release(ctx)
	if e.fenceOf(0) != 0 || e.fenceOf(1) != 0 {
		t.Errorf("fences %d %d after Release", e.fenceOf(0), e.fenceOf(1))
	}
	if n, _ := e.rdb.Exists(ctx, leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("lease held after Release")
	}
	e.settled()
	if moved, err := m.Move(ctx, e.v, 0, 2, 1, e.nb); err != nil || moved != 1 {
		t.Errorf("Move after Release = %d, %v", moved, err)
	}
	q2, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatalf("Quiesce after Release: %v", err)
	}
	q2.Release(ctx)
}

// TestQuiesceClosesAppliedMove: a move applied and not closed is closed
// as applied; the allocs read include it; a bucket not ready is listed.
func TestQuiesceClosesAppliedMove(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	crash := e.mover(Config{AfterStep: stopAfter("apply")})
	if _, err := crash.Move(ctx, e.v, 0, 1, 3, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	m := e.mover(Config{ApplyWindow: 20 * time.Millisecond})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{0: 2, 1: 8}; !maps.Equal(q.Alloc, want) || len(q.NotReady) != 0 {
		t.Errorf("Quiet %v %v, want %v", q.Alloc, q.NotReady, want)
	}
	q.Release(ctx)
	e.settled()

	if err := e.rdb.Del(ctx, e.keys.Ready(e.shard(1))).Err(); err != nil {
		t.Fatal(err)
	}
	q, err = m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release(ctx)
	if want := map[int]int64{0: 2}; !maps.Equal(q.Alloc, want) || !slices.Equal(q.NotReady, []int{1}) {
		t.Errorf("Quiet %v %v, want %v and bucket 1 not ready", q.Alloc, q.NotReady, want)
	}
}

// TestQuiesceWaitsApplyWindow: Quiesce returns no sooner than
// ApplyWindow, and a cancelled context ends the wait with nothing held.
func TestQuiesceWaitsApplyWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	m := e.mover(Config{ApplyWindow: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := m.Quiesce(ctx, e.v, e.nb, 2); done <- err }()
	testenv.WaitFor(t, 5*time.Second, "buckets fenced", func() bool { return e.fenceOf(0) != 0 && e.fenceOf(1) != 0 })
	select {
	case err := <-done:
		t.Fatalf("Quiesce returned before its window: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Quiesce = %v, want canceled", err)
	}
	if e.fenceOf(0) != 0 || e.fenceOf(1) != 0 {
		t.Error("fences left after a failed Quiesce")
	}
	if n, _ := e.rdb.Exists(context.Background(), leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("lease left after a failed Quiesce")
	}
}

// TestReleaseKeepsOthersLease: a Release whose lease expired and was
// taken by another instance leaves that lease alone (fences are lifted
// all the same: the other instance sets its own).
func TestReleaseKeepsOthersLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	m := e.mover(Config{ApplyWindow: time.Millisecond})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	lease := leaseKey(e.keys, e.v, e.nb)
	if err := e.rdb.Set(ctx, lease, "another", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	q.Release(ctx)
	if got, err := e.rdb.Get(ctx, lease).Result(); got != "another" {
		t.Errorf("lease = %q, %v; want another's kept", got, err)
	}
}
