package voucher_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/bucket"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// hotVoucher puts a voucher of 3 buckets and total units on sale under a
// fresh prefix, with its buckets' state loaded when load, and marks every
// shard ready.
func hotVoucher(t *testing.T, total int, load bool) (*redis.Client, voucher.Keys, *voucher.Store, *voucher.State, voucher.Voucher) {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 3)
	store := voucher.NewStore(voucher.MigratedMySQL(t))
	state := voucher.NewState(rdb, keys)
	v := voucher.Voucher{Title: "hot", TotalStock: total, Buckets: 3, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := store.Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	if load {
		if _, err := state.Load(ctx, v, nil); err != nil {
			t.Fatal(err)
		}
	}
	for s := range 3 {
		if err := state.MarkReady(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return rdb, keys, store, state, v
}

// nobody holds an order: the database side of a voucher just put on sale.
type nobody struct{}

func (nobody) Reservations(context.Context, int64) (map[int64]int64, map[int64]bool, error) {
	return map[int64]int64{}, nil, nil
}

// twoBucketsLost is a voucher of 30 units in 3 buckets whose bucket 0
// lent 6 units to bucket 1 (alloc 4, 16, 10) before buckets 1 and 2 lost
// everything, with the shard of each bucket and two instances' Warmers
// rebuilding through one Mover whose voucher leases live lease (0: the
// Mover's default).
func twoBucketsLost(t *testing.T, lease time.Duration) (*redis.Client, voucher.Keys, voucher.Voucher, func(int) int, *voucher.Warmer, *voucher.Warmer) {
	t.Helper()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	m := bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond, StaleAfter: time.Second, LeaseTTL: lease},
		slog.New(slog.DiscardHandler))
	// The move with the default apply window: one of a millisecond is
	// for the rebuilds' wait, and a loaded machine takes longer than that
	// between a take and its apply.
	setup := bucket.NewMover(rdb, keys, bucket.Config{}, slog.New(slog.DiscardHandler))
	if n, err := setup.Move(ctx, v.ID, 0, 1, 6, 3); err != nil || n != 6 {
		t.Fatalf("move: %d, %v", n, err)
	}
	for _, b := range []int{1, 2} {
		rdb.Del(ctx, keys.StateAt(shard(b), v.ID), keys.BuyersAt(shard(b), v.ID), keys.Ready(shard(b)))
	}
	warmer := func() *voucher.Warmer {
		w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
		w.Quiesce(m)
		return w
	}
	return rdb, keys, v, shard, warmer(), warmer()
}

// TestTwoBucketsRebuiltAtOnce: two buckets of one voucher lose their data
// together and two instances rebuild them at the same time. The second
// rebuild runs while the first has written its bucket but not yet
// reopened its shard: it must not count that bucket by its buyers alone
// (it would hand the same units out twice). It waits for the voucher's
// lease instead, and once the first shard is open the second bucket gets
// exactly what is left: the buckets' alloc adds up to the stock.
func TestTwoBucketsRebuiltAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, v, shard, a, b := twoBucketsLost(t, 0)
	var (
		inside error
		ran    bool
	)
	a.AfterBucket(func(int64, int) {
		// Instance b's round, while a's first bucket is written and its
		// shard not yet open.
		if !ran {
			ran = true
			_, inside = b.Warm(ctx)
		}
	})
	if _, err := a.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if inside == nil {
		t.Fatal("a rebuild ran while another bucket of the voucher was being rebuilt")
	}
	if _, err := b.Warm(ctx); err != nil {
		t.Fatalf("the second rebuild, once the first shard is open: %v", err)
	}
	for bk := range 3 {
		if n, _ := rdb.Exists(ctx, keys.Ready(shard(bk))).Result(); n != 1 {
			t.Fatalf("bucket %d not reopened", bk)
		}
	}
	sum := allocSum(t, rdb, keys, v, 3)
	if sum != 30 {
		t.Fatalf("alloc adds up to %d over the buckets, want 30", sum)
	}
	if !errors.Is(inside, bucket.ErrLeaseHeld) {
		t.Errorf("the rebuild inside failed with %v, want the voucher's lease held", inside)
	}
}

// TestStalledBucketRebuildTakenOver: as above, but the first rebuild
// stalls past its voucher's lease after writing its bucket (a paused
// process, a slow database): the second instance's rebuild takes the
// lease over, counts the first bucket by its buyers alone and reopens its
// own. When the first one wakes, its shard must not reopen with what it
// counted before (the buckets would hold 4 + 26 + 26 units of 30): its
// fence on the bucket was taken over. The next round rebuilds it with
// what is left, and the allocs add up to the stock.
func TestStalledBucketRebuildTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Leases long enough that no watchdog renews or gives up during the
	// test: the stall is the voucher's lease expiring (deleted below).
	rdb, keys, v, shard, a, b := twoBucketsLost(t, time.Minute)
	var (
		first  = -1
		inside error
	)
	a.AfterBucket(func(_ int64, bk int) {
		if first >= 0 {
			return
		}
		first = bk
		if a.Running() <= 0 {
			t.Error("a rebuild under way, but Running says none")
		}
		// a stalls: its voucher lease expires, and b's round runs.
		if err := rdb.Del(ctx, keys.Lease(v.ID, 3)).Err(); err != nil {
			t.Error(err)
		}
		_, inside = b.Warm(ctx)
	})
	if _, err := a.Warm(ctx); err != nil {
		t.Fatalf("the round of the stalled rebuild: %v", err)
	}
	if inside != nil {
		t.Fatalf("the rebuild that took over: %v", inside)
	}
	if d := a.Running(); d != 0 {
		t.Errorf("no rebuild under way, but Running says %s", d)
	}
	alloc := func() (sum int64, open int) {
		for bk := range 3 {
			if n, _ := rdb.Exists(ctx, keys.Ready(shard(bk))).Result(); n == 0 {
				continue
			}
			a, err := rdb.HGet(ctx, keys.StateAt(shard(bk), v.ID), voucher.FieldAlloc).Int64()
			if err != nil {
				t.Fatal(err)
			}
			sum, open = sum+a, open+1
		}
		return sum, open
	}
	if sum, open := alloc(); sum != 30 || open != 2 {
		t.Fatalf("after the stalled rebuild of bucket %d woke: %d units over %d open buckets, want 30 over 2 (bucket 0's 4 and the newer rebuild's 26)", first, sum, open)
	}
	if _, err := a.Warm(ctx); err != nil {
		t.Fatalf("the next round: %v", err)
	}
	if sum, open := alloc(); sum != 30 || open != 3 {
		t.Fatalf("%d units over %d open buckets, want 30 over 3", sum, open)
	}
}

// TestStalledFirstLoadTakenOver: the first load of a voucher's buckets
// (under the Mover's Hold) writes bucket 0, then stalls past its lease;
// another instance loads bucket 1 from what bucket 0 holds, counting
// bucket 2 (no state yet) by its buyers. The stalled load's write of
// bucket 2 is refused (its fence was taken over): with it the buckets
// would hold 100 + 200 + 100 units of 300. A first load that finds some
// buckets with state writes nothing; the next round loads the rest from
// the others, and the allocs add up to the stock.
func TestStalledFirstLoadTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 300, false)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	m := bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond, StaleAfter: time.Second, LeaseTTL: time.Minute},
		slog.New(slog.DiscardHandler))
	state.HoldWith(m)
	x, err := m.Hold(ctx, v.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Release(ctx)
	if ok, err := state.LoadAt(x.Ctx, shard(0), v, 100, voucher.BucketFields(v, 100), &x.Guards[0]); err != nil || !ok {
		t.Fatalf("first load of bucket 0: %v, %v", ok, err)
	}
	// x stalls: its lease expires; another instance loads bucket 1.
	if err := rdb.Del(ctx, keys.Lease(v.ID, 3)).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := m.Quiesce(ctx, v.ID, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if q.Alloc[0] != 100 || len(q.NotReady) != 1 {
		t.Fatalf("quiet %v %v, want bucket 0's 100 and bucket 2 not ready", q.Alloc, q.NotReady)
	}
	// x wakes and writes bucket 2 with its share.
	if ok, err := state.LoadAt(x.Ctx, shard(2), v, 100, voucher.BucketFields(v, 100), &x.Guards[2]); !errors.Is(err, voucher.ErrGuardLost) || ok {
		t.Fatalf("the stalled load's write of bucket 2 = %v, %v; want refused", ok, err)
	}
	if ok, err := state.LoadAt(q.Ctx, shard(1), v, 200, voucher.BucketFields(v, 200), &q.Guard); err != nil || !ok {
		t.Fatalf("load of bucket 1: %v, %v", ok, err)
	}
	q.Release(ctx)
	if wrote, err := state.LoadBuckets(ctx, v, nil); err == nil || wrote {
		t.Errorf("a first load with buckets 0 and 1 loaded = %v, %v; want refused, nothing written", wrote, err)
	}
	w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(m)
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if sum := allocSum(t, rdb, keys, v, 3); sum != 300 {
		t.Fatalf("alloc adds up to %d over the buckets, want 300", sum)
	}
}

// TestReconcileCountsMovesUnderWay: a move applied by its receiver and not
// yet closed by its donor puts its units in the receiver's alloc and the
// donor's out at once; reconcile counts them once and finds nothing to
// report, while a unit really made (an alloc raised by hand) is reported.
func TestReconcileCountsMovesUnderWay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	cut := bucket.NewMover(rdb, keys, bucket.Config{StaleAfter: time.Hour, AfterStep: func(s string) bool { return s == "apply" }},
		slog.New(slog.DiscardHandler))
	if _, err := cut.Move(ctx, v.ID, 0, 1, 4, 3); !errors.Is(err, bucket.ErrStopped) {
		t.Fatalf("move cut after its apply: %v", err)
	}
	w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(cut)
	if diffs, err := w.Reconcile(ctx); err != nil || len(diffs) != 0 {
		t.Fatalf("reconcile during a move applied and not closed = %+v, %v; want nothing", diffs, err)
	}
	shard1 := keys.BucketShard(v.ID, 1, 3)
	if err := rdb.HIncrBy(ctx, keys.StateAt(shard1, v.ID), voucher.FieldAlloc, 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HIncrBy(ctx, keys.StateAt(shard1, v.ID), "stock", 1).Err(); err != nil {
		t.Fatal(err)
	}
	diffs, err := w.Reconcile(ctx)
	if err != nil || len(diffs) != 1 || diffs[0].What != "alloc" {
		t.Fatalf("reconcile with a unit made = %+v, %v; want one alloc difference", diffs, err)
	}
}

// TestOverAllocatedBucketClosesOnlyItself: a shard is lost while the
// other buckets of a voucher already hold more than its stock (units made
// twice): its bucket of that voucher is rebuilt with no units, its buyers
// kept, and the shard reopens with its other voucher, instead of staying
// closed for every voucher in it at every round.
func TestOverAllocatedBucketClosesOnlyItself(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	lost := keys.BucketShard(v.ID, 1, 3)
	var other voucher.Voucher
	for other.ID == 0 || keys.Shard(other.ID) != lost {
		other = voucher.Voucher{Title: "plain", TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
		if err := store.Create(ctx, &other); err != nil {
			t.Fatal(err)
		}
	}
	// Bucket 0 holds 25 units of 30, bucket 2 its 10: 35 already.
	if err := rdb.HSet(ctx, keys.StateAt(keys.BucketShard(v.ID, 0, 3), v.ID), voucher.FieldAlloc, 25).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, keys.StateAt(lost, v.ID), keys.BuyersAt(lost, v.ID), keys.Ready(lost)).Err(); err != nil {
		t.Fatal(err)
	}
	w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond}, slog.New(slog.DiscardHandler)))
	if _, err := w.Warm(ctx); err != nil {
		t.Fatalf("warm: %v", err)
	}
	if n, _ := rdb.Exists(ctx, keys.Ready(lost)).Result(); n != 1 {
		t.Fatal("the lost shard did not reopen")
	}
	if n, _ := rdb.Exists(ctx, keys.StateAt(lost, other.ID)).Result(); n != 1 {
		t.Errorf("voucher %d, of one bucket in the lost shard, has no state", other.ID)
	}
	got, err := rdb.HMGet(ctx, keys.StateAt(lost, v.ID), "stock", voucher.FieldAlloc).Result()
	if err != nil || got[0] != "0" || got[1] != "0" {
		t.Errorf("the over-allocated voucher's rebuilt bucket: stock, alloc = %v (%v), want 0, 0", got, err)
	}
	// The bucket alone loses its state in a shard that stays open: it is
	// loaded with no units the same way.
	if err := rdb.Del(ctx, keys.StateAt(lost, v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Warm(ctx); err != nil {
		t.Fatalf("warm: %v", err)
	}
	got, err = rdb.HMGet(ctx, keys.StateAt(lost, v.ID), "stock", voucher.FieldAlloc).Result()
	if err != nil || got[0] != "0" || got[1] != "0" {
		t.Errorf("the over-allocated voucher's loaded bucket: stock, alloc = %v (%v), want 0, 0", got, err)
	}
}

// holders is a database side where buyers hold orders (user -> order).
type holders map[int64]int64

func (h holders) Reservations(context.Context, int64) (map[int64]int64, map[int64]bool, error) {
	return maps.Clone(h), nil, nil
}

// TestLostBucketsCountEachOthersBuyers: two buckets lost together, with
// buyers in each: the first rebuilt counts the other, not ready yet, by
// its buyers, so each gets at least the units its buyers hold and the
// allocs add up to the stock (without that count the second would get
// none for its 3 buyers: 3 units sold twice).
func TestLostBucketsCountEachOthersBuyers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	want := map[int]int{1: 2, 2: 3} // buyers by home bucket
	db := holders{}
	for u := int64(1); len(db) < 5; u++ {
		if h := voucher.Home(u, 3); want[h] > 0 {
			want[h]--
			db[u] = 1000 + u
		}
	}
	for _, b := range []int{1, 2} {
		rdb.Del(ctx, keys.StateAt(shard(b), v.ID), keys.BuyersAt(shard(b), v.ID), keys.Ready(shard(b)))
	}
	w := voucher.NewWarmer(store, state, db, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond}, slog.New(slog.DiscardHandler)))
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	allocsCover(t, rdb, keys, v, db)
}

// TestLostBucketsCountEachOthersInFlightBuyers: as above, with the buyers'
// orders not yet in the database, only in their home shards' pending
// index (accepted, in a worker's hands): the first bucket rebuilt counts
// the other, not ready yet, by its in-flight buyers too (without them the
// second would get no unit for its 3 buyers: 3 units sold twice).
func TestLostBucketsCountEachOthersInFlightBuyers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	for _, b := range []int{1, 2} {
		rdb.Del(ctx, keys.StateAt(shard(b), v.ID), keys.BuyersAt(shard(b), v.ID), keys.Ready(shard(b)))
	}
	want := map[int]int{1: 2, 2: 3} // buyers by home bucket
	flying := holders{}
	for u := int64(1); len(flying) < 5; u++ {
		h := voucher.Home(u, 3)
		if want[h] == 0 {
			continue
		}
		want[h]--
		flying[u] = 1000 + u
		order := strconv.FormatInt(1000+u, 10)
		if err := rdb.HSet(ctx, keys.Pending(shard(h)), order, fmt.Sprintf("%d:%d", u, v.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond}, slog.New(slog.DiscardHandler)))
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	allocsCover(t, rdb, keys, v, flying)
}

// TestStalledBucketLoadTakenOver: a bucket that lost its state in a shard
// that stayed open is loaded under the voucher's hold; the load stalls
// past its lease after counting the other buckets, and another rebuild
// takes the voucher over. The stalled load's write is refused (its fence
// was taken over): with it the bucket would be live with a share counted
// before the takeover. The next round loads it, and the allocs add up.
func TestStalledBucketLoadTakenOver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	if err := rdb.Del(ctx, keys.StateAt(shard(1), v.ID), keys.BuyersAt(shard(1), v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	// Leases long enough that no watchdog renews or gives up during the
	// test: the stall is the voucher's lease expiring (deleted below).
	m := bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond, StaleAfter: time.Second, LeaseTTL: time.Minute},
		slog.New(slog.DiscardHandler))
	w := voucher.NewWarmer(store, state, nobody{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(m)
	var (
		newer    voucher.Quiet
		newerErr error
		stalled  bool
	)
	w.AfterPage(func() {
		// Only while the load holds the voucher (it counted the others
		// and reads the in-flight orders before writing).
		if n, _ := rdb.Exists(ctx, keys.Lease(v.ID, 3)).Result(); stalled || n == 0 {
			return
		}
		stalled = true
		if err := rdb.Del(ctx, keys.Lease(v.ID, 3)).Err(); err != nil {
			t.Error(err)
		}
		newer, newerErr = m.Quiesce(ctx, v.ID, 3, 2)
	})
	_, _ = w.Warm(ctx) // the stalled load fails
	if !stalled || newerErr != nil {
		t.Fatalf("the load did not stall (%v), or the rebuild that took over failed: %v", stalled, newerErr)
	}
	if n, _ := rdb.Exists(ctx, keys.StateAt(shard(1), v.ID)).Result(); n != 0 {
		a, _ := rdb.HGet(ctx, keys.StateAt(shard(1), v.ID), voucher.FieldAlloc).Result()
		t.Errorf("the stalled load wrote bucket 1 (alloc %s) after its fence was taken over", a)
	}
	newer.Release(ctx)
	w.AfterPage(nil)
	if _, err := w.Warm(ctx); err != nil {
		t.Fatalf("the next round: %v", err)
	}
	if sum := allocSum(t, rdb, keys, v, 3); sum != 30 {
		t.Fatalf("alloc adds up to %d over the buckets, want 30", sum)
	}
}

// TestStalledFirstLoadRefusedUnderNewerFence: as above, but the rebuild
// that took the voucher over rebuilds bucket 2 itself, so bucket 2's
// fence holds the newer token (not none): the stalled first load's write
// of bucket 2 is refused all the same; the guard is its own token, not
// any fence.
func TestStalledFirstLoadRefusedUnderNewerFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, _, state, v := hotVoucher(t, 300, false)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	m := bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond, StaleAfter: time.Second, LeaseTTL: time.Minute},
		slog.New(slog.DiscardHandler))
	state.HoldWith(m)
	x, err := m.Hold(ctx, v.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Release(ctx)
	// x stalls: its lease expires; another instance rebuilds bucket 2.
	if err := rdb.Del(ctx, keys.Lease(v.ID, 3)).Err(); err != nil {
		t.Fatal(err)
	}
	q, err := m.Quiesce(ctx, v.ID, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release(ctx)
	if ok, err := state.LoadAt(x.Ctx, shard(2), v, 100, voucher.BucketFields(v, 100), &x.Guards[2]); !errors.Is(err, voucher.ErrGuardLost) || ok {
		t.Fatalf("the stalled load's write of bucket 2, under the newer rebuild's fence = %v, %v; want refused", ok, err)
	}
	if n, _ := rdb.Exists(ctx, keys.StateAt(shard(2), v.ID)).Result(); n != 0 {
		t.Error("bucket 2 written by the stalled load")
	}
}

// TestLostBucketsCountOnlyTheOthersBuyers: as above, with buyers in the
// bucket that stayed ready as well (10 of them, its whole alloc): a lost
// bucket's rebuild counts the holders of the other lost bucket alone, the
// ready bucket's being in its alloc already. Counting them again would
// leave the first bucket rebuilt less than its own 6 buyers hold (written
// with no units: 6 units sold twice).
func TestLostBucketsCountOnlyTheOthersBuyers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, store, state, v := hotVoucher(t, 30, true)
	shard := func(b int) int { return keys.BucketShard(v.ID, b, 3) }
	want := map[int]int{0: 10, 1: 6, 2: 6} // buyers by home bucket
	db := holders{}
	for u := int64(1); len(db) < 22; u++ {
		if h := voucher.Home(u, 3); want[h] > 0 {
			want[h]--
			db[u] = 1000 + u
		}
	}
	for _, b := range []int{1, 2} {
		rdb.Del(ctx, keys.StateAt(shard(b), v.ID), keys.BuyersAt(shard(b), v.ID), keys.Ready(shard(b)))
	}
	w := voucher.NewWarmer(store, state, db, keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: time.Millisecond}, slog.New(slog.DiscardHandler)))
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	allocsCover(t, rdb, keys, v, db)
}

// allocsCover checks v's buckets after their rebuild: each one's alloc
// covers the units its home buyers hold, and the allocs add up to the
// stock.
func allocsCover(t *testing.T, rdb *redis.Client, keys voucher.Keys, v voucher.Voucher, buyers map[int64]int64) {
	t.Helper()
	ctx := context.Background()
	nb := v.BucketCount()
	homes := voucher.SplitBuyers(buyers, nb)
	var sum int64
	for b := range nb {
		alloc, err := rdb.HGet(ctx, keys.StateAt(keys.BucketShard(v.ID, b, nb), v.ID), voucher.FieldAlloc).Int64()
		if err != nil {
			t.Fatalf("bucket %d: %v", b, err)
		}
		if alloc < int64(len(homes[b])) {
			t.Errorf("bucket %d: alloc %d for %d buyers", b, alloc, len(homes[b]))
		}
		sum += alloc
	}
	if sum != int64(v.TotalStock) {
		t.Errorf("allocs add up to %d, want %d", sum, v.TotalStock)
	}
}

// allocSum adds up the alloc of voucher v's nb buckets.
func allocSum(t *testing.T, rdb *redis.Client, keys voucher.Keys, v voucher.Voucher, nb int) int64 {
	t.Helper()
	return fieldSum(t, rdb, keys, v, nb, voucher.FieldAlloc)
}

// fieldSum adds up a field (stock, alloc) of voucher v's nb buckets.
func fieldSum(t *testing.T, rdb *redis.Client, keys voucher.Keys, v voucher.Voucher, nb int, field string) int64 {
	t.Helper()
	var sum int64
	for b := range nb {
		a, err := rdb.HGet(context.Background(), keys.StateAt(keys.BucketShard(v.ID, b, nb), v.ID), field).Int64()
		if err != nil {
			t.Fatalf("bucket %d: %v", b, err)
		}
		sum += a
	}
	return sum
}

// TestLoadBucketsAfterMoves: every bucket of a voucher of 30 units lost
// its state after bucket 0's buyers had bought 16 units (more than its
// share of 10, borrowed from the others) and bucket 1's 2: loaded all at
// once, the buckets' stocks and buyers add up to the 30 units, and their
// allocs too. By shares alone, bucket 1 and 2 would have sold 8 and 10
// more: 36 units.
func TestLoadBucketsAfterMoves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, _, state, v := hotVoucher(t, 30, false)
	buyers := map[int64]int64{}
	var held [3]int
	for u := int64(1); held[0] < 16 || held[1] < 2; u++ {
		h := voucher.Home(u, 3)
		if (h == 0 && held[0] < 16) || (h == 1 && held[1] < 2) {
			buyers[u] = 1000 + u
			held[h]++
		}
	}
	if _, err := state.LoadBuckets(ctx, v, buyers); err != nil {
		t.Fatal(err)
	}
	stocks := fieldSum(t, rdb, keys, v, 3, "stock")
	if stocks+int64(len(buyers)) != 30 {
		t.Errorf("stocks %d and %d buyers: %d units, want 30", stocks, len(buyers), stocks+int64(len(buyers)))
	}
	if sum := allocSum(t, rdb, keys, v, 3); sum != 30 {
		t.Errorf("alloc adds up to %d, want 30", sum)
	}
}

// TestLoadBucketsDrainsMovesLeft: every bucket of a voucher lost its state
// (each left out of its shard's rebuild) while a move from bucket 0 to 2
// was still journaled, its mover gone. Loaded all at once, the buckets
// first have that move settled (refused: bucket 2 had no state; forgotten
// by bucket 0, which had none either), so the recovery loop finds nothing
// that could give its units back on top of bucket 0's share: the stocks
// add up to the stock. Before, the load skipped the journals and the
// recovery loop then gave the 6 units back to bucket 0: 36 for 30.
func TestLoadBucketsDrainsMovesLeft(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb, keys, _, state, v := hotVoucher(t, 30, true)
	m := bucket.NewMover(rdb, keys, bucket.Config{ApplyWindow: 10 * time.Millisecond, StaleAfter: time.Millisecond}, slog.New(slog.DiscardHandler))
	crash := bucket.NewMover(rdb, keys, bucket.Config{AfterStep: func(s string) bool { return s == "take" }}, slog.New(slog.DiscardHandler))
	if _, err := crash.Move(ctx, v.ID, 0, 2, 6, 3); !errors.Is(err, bucket.ErrStopped) {
		t.Fatalf("move stopped after its take: %v", err)
	}
	for b := range 3 {
		s := keys.BucketShard(v.ID, b, 3)
		if err := rdb.Del(ctx, keys.StateAt(s, v.ID), keys.BuyersAt(s, v.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	state.HoldWith(m)
	if _, err := state.LoadBuckets(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	if err := bucket.NewRecoverer(m).Once(ctx); err != nil {
		t.Fatal(err)
	}
	stocks := fieldSum(t, rdb, keys, v, 3, "stock")
	if stocks != 30 {
		t.Errorf("the buckets hold %d units after the recovery loop, want 30", stocks)
	}
}
