package bucket

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lease"
	"seckill/internal/testenv"
)

// fenceOf is bucket b's fence: "<nb>:<token>" of its holder, "" when none.
func (e *env) fenceOf(b int) string {
	e.tb.Helper()
	s, err := e.rdb.HGet(context.Background(), fencesKey(e.keys, e.shard(b)), strconv.FormatInt(e.v, 10)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		e.tb.Fatal(err)
	}
	return s
}

// unfenced fails the test for each bucket still fenced, when (a phrase
// such as "after recovery") says at what point.
func (e *env) unfenced(when string) {
	e.tb.Helper()
	for b := range e.nb {
		if f := e.fenceOf(b); f != "" {
			e.tb.Errorf("bucket %d fence %q %s", b, f, when)
		}
	}
}

// TestQuiesceReturnsMoveToLost: a move journaled towards the bucket being
// rebuilt and never applied is refused and its units go back to the
// donor; the allocs read add up with the lost bucket's share to the
// total; once they are read, the other buckets move again and only the
// lost bucket's fence (the rebuild's guard) holds, until Release.
func TestQuiesceReturnsMoveToLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	crash := e.mover(Config{AfterStep: stopAfter("take")})
	if _, err := crash.Move(ctx, e.v, 0, 2, 3, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	m := e.mover(Config{ApplyWindow: 500 * time.Millisecond})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{0: 5, 1: 5}; !maps.Equal(q.Alloc, want) || len(q.NotReady) != 0 {
		t.Errorf("Quiet %v %v, want %v", q.Alloc, q.NotReady, want)
	}
	if e.fenceOf(0) != "" || e.fenceOf(1) != "" || e.fenceOf(2) != q.Guard.Value || q.Guard.Value == "" {
		t.Errorf("fences %q %q %q, want bucket 2's alone, the guard %q", e.fenceOf(0), e.fenceOf(1), e.fenceOf(2), q.Guard.Value)
	}
	if _, err := m.Move(ctx, e.v, 2, 0, 1, e.nb); !errors.Is(err, ErrFenced) {
		t.Errorf("Move out of the fenced bucket = %v, want ErrFenced", err)
	}
	if moved, err := m.Move(ctx, e.v, 0, 1, 1, e.nb); err != nil || moved != 1 {
		t.Errorf("Move between the counted buckets = %d, %v; want 1", moved, err)
	}
	if _, err := m.Quiesce(ctx, e.v, e.nb, 2); !errors.Is(err, ErrLeaseHeld) {
		t.Errorf("second Quiesce = %v, want ErrLeaseHeld", err)
	}
	if q.Ctx.Err() != nil {
		t.Errorf("the quiet's context ended while held: %v", context.Cause(q.Ctx))
	}
	q.Release(ctx)
	if e.fenceOf(2) != "" {
		t.Errorf("fence %q after Release", e.fenceOf(2))
	}
	if q.Ctx.Err() == nil {
		t.Error("the quiet's context goes on after Release")
	}
	if n, _ := e.rdb.Exists(ctx, leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("lease held after Release")
	}
	e.settled()
	if moved, err := m.Move(ctx, e.v, 2, 0, 1, e.nb); err != nil || moved != 1 {
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
	m := e.mover(Config{ApplyWindow: 500 * time.Millisecond})
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
	testenv.WaitFor(t, 5*time.Second, "buckets fenced", func() bool {
		return e.fenceOf(0) != "" && e.fenceOf(1) != "" && e.fenceOf(2) != ""
	})
	select {
	case err := <-done:
		t.Fatalf("Quiesce returned before its window: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Quiesce = %v, want canceled", err)
	}
	if e.fenceOf(0) != "" || e.fenceOf(1) != "" || e.fenceOf(2) != "" {
		t.Error("fences left after a failed Quiesce")
	}
	if n, _ := e.rdb.Exists(context.Background(), leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("lease left after a failed Quiesce")
	}
}

// TestQuiescePauseReported: a Quiesce reports, once, how long it kept the
// other buckets fenced: no less than its apply window, and their fences
// are down when it does; a Quiesce that fails reports nothing.
func TestQuiescePauseReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	const window = 300 * time.Millisecond
	var pauses []time.Duration
	var fencedAtReport []string
	m := e.mover(Config{ApplyWindow: window, Paused: func(d time.Duration) {
		pauses = append(pauses, d)
		fencedAtReport = []string{e.fenceOf(0), e.fenceOf(1)}
	}})
	ctx := context.Background()
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	q.Release(ctx)
	if len(pauses) != 1 || pauses[0] < window {
		t.Fatalf("pauses reported %v, want one of at least %s", pauses, window)
	}
	if fencedAtReport[0] != "" || fencedAtReport[1] != "" {
		t.Fatalf("reported while the other buckets were still fenced: %q", fencedAtReport)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Quiesce(cancelled, e.v, e.nb, 2); err == nil {
		t.Fatal("Quiesce with a cancelled context succeeded")
	}
	if len(pauses) != 1 {
		t.Fatalf("a failed Quiesce reported a pause: %v", pauses)
	}
}

// TestStalledQuiesceTakenOver: a rebuild that stalls past its lease is
// taken over by the next one, which fences every bucket with its own
// token; the stalled one's Release then lifts nothing of the newer one's
// (moves stay refused while the newer one counts) and leaves its lease
// alone; the stalled one's guard no longer holds, so its shard could not
// reopen with what it counted.
func TestStalledQuiesceTakenOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	// Leases long enough that no watchdog tick runs during the test: the
	// stall is simulated by the lease's key expiring (deleted).
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	a, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	lease := leaseKey(e.keys, e.v, e.nb)
	if err := e.rdb.Del(ctx, lease).Err(); err != nil {
		t.Fatal(err)
	}
	// The newer rebuild (of another bucket) holds in its apply window.
	slow := e.mover(Config{ApplyWindow: time.Hour, LeaseTTL: time.Minute})
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := slow.Quiesce(bctx, e.v, e.nb, 1); done <- err }()
	testenv.WaitFor(t, 5*time.Second, "the newer rebuild's fences", func() bool {
		for b := range e.nb {
			if f := e.fenceOf(b); f == "" || f == a.Guard.Value {
				return false
			}
		}
		return true
	})
	newer := e.fenceOf(0)
	a.Release(ctx)
	for b := range e.nb {
		if f := e.fenceOf(b); f != newer {
			t.Errorf("bucket %d fence %q after the stalled rebuild's Release, want the newer one's %q", b, f, newer)
		}
	}
	if _, err := m.Move(ctx, e.v, 0, 2, 1, e.nb); !errors.Is(err, ErrFenced) {
		t.Errorf("Move while the newer rebuild counts = %v, want ErrFenced", err)
	}
	if n, _ := e.rdb.Exists(ctx, lease).Result(); n != 1 {
		t.Error("the stalled rebuild's Release dropped the newer one's lease")
	}
	if f := e.fenceOf(2); f == a.Guard.Value {
		t.Errorf("the stalled rebuild's guard %q still holds bucket 2's fence", f)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("newer Quiesce = %v, want canceled", err)
	}
	e.unfenced("after both ended")
	e.settled()
}

// TestQuiesceLeaseRenewed: a Quiet held for several times its lease's
// time to live keeps the lease (the watchdog renews it) and its context;
// the lease taken from under it ends the context with lease.ErrLost.
func TestQuiesceLeaseRenewed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: lease.Min})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release(ctx)
	key := leaseKey(e.keys, e.v, e.nb)
	began := time.Now()
	testenv.WaitFor(t, 20*time.Second, "three times the lease's life", func() bool {
		if n, _ := e.rdb.Exists(ctx, key).Result(); n != 1 || q.Ctx.Err() != nil {
			t.Fatalf("lease lost after %s while held: %v", time.Since(began), context.Cause(q.Ctx))
		}
		return time.Since(began) > 3*lease.Min
	})
	if err := e.rdb.Set(ctx, key, "another", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the quiet's context ended", func() bool { return q.Ctx.Err() != nil })
	if cause := context.Cause(q.Ctx); !errors.Is(cause, lease.ErrLost) {
		t.Errorf("cause %v, want lease.ErrLost", cause)
	}
}

// TestRecovererClearsLeftFences: fences whose rebuild died (its lease
// gone, never released) are lifted by the recovery loop, and moves out of
// those buckets work again; fences whose lease is held are left.
func TestRecovererClearsLeftFences(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	m := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	q, err := m.Quiesce(ctx, e.v, e.nb, 2)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRecoverer(m)
	if err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if e.fenceOf(2) != q.Guard.Value {
		t.Fatalf("a held rebuild's fence %q was touched", e.fenceOf(2))
	}
	// The rebuild dies: its lease expires, nothing is released.
	if err := e.rdb.Del(ctx, leaseKey(e.keys, e.v, e.nb)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	e.unfenced("after recovery")
	if n, _ := e.rdb.Exists(ctx, leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("the recovery loop kept the voucher's lease")
	}
	if moved, err := e.mover(Config{}).Move(ctx, e.v, 2, 0, 1, e.nb); err != nil || moved != 1 {
		t.Errorf("Move out of the cleared bucket = %d, %v", moved, err)
	}
	e.settled()
}

// TestQuiesceTakenOverWhileCounting: a rebuild whose fences another
// rebuild takes over during its apply window (its lease lapsed while it
// waited) finds them gone when it lifts them after reading the allocs,
// and fails instead of returning what it counted.
func TestQuiesceTakenOverWhileCounting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	// No watchdog tick during the test: the lapse is the lease deleted.
	slow := e.mover(Config{ApplyWindow: 2 * time.Second, LeaseTTL: time.Minute})
	done := make(chan error, 1)
	go func() {
		q, err := slow.Quiesce(ctx, e.v, e.nb, 2)
		if err == nil {
			q.Release(ctx)
		}
		done <- err
	}()
	testenv.WaitFor(t, 5*time.Second, "the slow rebuild's fences", func() bool { return e.fenceOf(0) != "" && e.fenceOf(2) != "" })
	if err := e.rdb.Del(ctx, leaseKey(e.keys, e.v, e.nb)).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := e.mover(Config{ApplyWindow: time.Millisecond, LeaseTTL: time.Minute}).Quiesce(ctx, e.v, e.nb, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release(ctx)
	select {
	case err := <-done:
		if !errors.Is(err, ErrFenceLost) {
			t.Fatalf("the rebuild taken over while counting = %v, want ErrFenceLost", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow rebuild did not end")
	}
	if f := e.fenceOf(1); f != q.Guard.Value {
		t.Errorf("the newer rebuild's guard %q, want %q kept", f, q.Guard.Value)
	}
}

// TestQuiesceNeedsConfirmedFences: a fence no replica confirms could be
// lost to a failover before the count it protects, and moves would run
// under the count: with WAIT 1 on a master without a replica, Quiesce
// fails with ErrNotReplicated and holds nothing (no fence, no lease).
func TestQuiesceNeedsConfirmedFences(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5, 5, 5)
	ctx := context.Background()
	m := e.mover(Config{WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond, ApplyWindow: time.Millisecond, LeaseTTL: time.Minute})
	if q, err := m.Quiesce(ctx, e.v, e.nb, 2); !errors.Is(err, ErrNotReplicated) {
		if err == nil {
			q.Release(ctx)
		}
		t.Fatalf("Quiesce with fences no replica confirms = %v, want ErrNotReplicated", err)
	}
	e.unfenced("after a Quiesce whose fences were not confirmed")
	if n, _ := e.rdb.Exists(ctx, leaseKey(e.keys, e.v, e.nb)).Result(); n != 0 {
		t.Error("lease left after a failed Quiesce")
	}
}
