package voucher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/testenv"
)

// TestHomeFrozen holds Home's values: changing them moves buyers of live
// sales to other buckets, where they could buy a second time.
func TestHomeFrozen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		user     int64
		of3, of8 int
	}{{1, 2, 1}, {2, 1, 6}, {3, 0, 5}, {42, 1, 5}, {1000, 1, 0}, {123456789, 2, 1}} {
		if got3, got8 := Home(c.user, 3), Home(c.user, 8); got3 != c.of3 || got8 != c.of8 {
			t.Errorf("Home(%d) = %d of 3, %d of 8; want %d, %d", c.user, got3, got8, c.of3, c.of8)
		}
	}
	if Home(7, 1) != 0 || Home(7, 0) != 0 {
		t.Error("one bucket is bucket 0")
	}
	// Consecutive user ids spread evenly: within 5% of a third each.
	counts := make([]int, 3)
	for u := int64(1); u <= 30000; u++ {
		counts[Home(u, 3)]++
	}
	for b, n := range counts {
		if n < 9500 || n > 10500 {
			t.Errorf("bucket %d is home to %d of 30000 users", b, n)
		}
	}
}

// TestBucketZeroIsTodaysKeys: a voucher of one bucket, and bucket 0 of any,
// keeps the keys vouchers had before buckets.
func TestBucketZeroIsTodaysKeys(t *testing.T) {
	t.Parallel()
	for _, k := range []Keys{NewKeys("p", 4), NewClusterKeys("p", 6)} {
		for _, v := range []int64{1, 5, 1234567} {
			for _, nb := range []int{0, 1, 3} {
				s := k.BucketShard(v, 0, nb)
				if s != k.Shard(v) || k.StateAt(s, v) != k.State(v) || k.BuyersAt(s, v) != k.Buyers(v) {
					t.Errorf("voucher %d bucket 0 of %d: shard %d, %q", v, nb, s, k.StateAt(s, v))
				}
			}
		}
	}
}

// TestBucketsOnDistinctMasters: with the cluster tags on the slot layout
// redis-cli creates, the buckets of a voucher sit on different masters
// whenever there are no more buckets than masters and the shard count is a
// multiple of the master count.
func TestBucketsOnDistinctMasters(t *testing.T) {
	t.Parallel()
	for _, m := range []int{3, 4} {
		starts := redisCliRanges(m)
		for _, n := range []int{m, 2 * m, 4 * m} {
			k := NewClusterKeys("seckill", n)
			for nb := 2; nb <= m; nb++ {
				if m%nb != 0 && n/nb*nb != n {
					continue // a stride that does not divide the shards
				}
				for v := int64(1); v <= 50; v++ {
					seen := map[int]bool{}
					for b := range nb {
						slot := redisconn.Slot(k.Tag(k.BucketShard(v, b, nb)))
						i, found := slices.BinarySearch(starts, slot)
						if !found {
							i--
						}
						if seen[i] {
							t.Fatalf("%d masters, %d shards, voucher %d: two of %d buckets on master %d", m, n, v, nb, i)
						}
						seen[i] = true
					}
				}
			}
		}
	}
}

// bucketEnv is one Redis with 3 shards, all ready, and a voucher of 3
// buckets on sale.
type bucketEnv struct {
	rdb   *redis.Client
	keys  Keys
	state *State
	v     Voucher
}

func newBucketEnv(t testing.TB, total int) bucketEnv {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 3)
	e := bucketEnv{rdb: rdb, keys: keys, state: NewState(rdb, keys),
		v: Voucher{ID: 7, TotalStock: total, Stock: total, Buckets: 3, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}}
	if _, err := e.state.Load(ctx, e.v, nil); err != nil {
		t.Fatal(err)
	}
	for s := range 3 {
		if err := e.state.MarkReady(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// bucket reads one bucket's stock, alloc and buyers.
func (e bucketEnv) bucket(t testing.TB, b int) (stock, alloc int64, buyers map[string]string) {
	t.Helper()
	ctx := context.Background()
	s := e.keys.BucketShard(e.v.ID, b, 3)
	f, err := e.rdb.HMGet(ctx, e.keys.StateAt(s, e.v.ID), "stock", FieldAlloc).Result()
	if err != nil {
		t.Fatal(err)
	}
	stock, _ = strconv.ParseInt(fmt.Sprint(f[0]), 10, 64)
	alloc, _ = strconv.ParseInt(fmt.Sprint(f[1]), 10, 64)
	buyers, err = e.rdb.HGetAll(ctx, e.keys.BuyersAt(s, e.v.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return stock, alloc, buyers
}

// TestLoadSplitsTheStock: the first load gives each bucket its share, in a
// hash that says how many buckets there are and of what total.
func TestLoadSplitsTheStock(t *testing.T) {
	t.Parallel()
	e := newBucketEnv(t, 10)
	for b, want := range []int64{4, 3, 3} {
		stock, alloc, _ := e.bucket(t, b)
		if stock != want || alloc != want {
			t.Errorf("bucket %d: stock %d alloc %d, want %d", b, stock, alloc, want)
		}
		f, _ := e.rdb.HMGet(context.Background(), e.keys.StateAt(e.keys.BucketShard(7, b, 3), 7), FieldBuckets, FieldTotal, FieldOut).Result()
		if fmt.Sprint(f) != "[3 10 0]" {
			t.Errorf("bucket %d: nb, total, out = %v", b, f)
		}
	}
	got, err := e.state.StocksOf(context.Background(), []Voucher{e.v})
	if err != nil || got[7] != 10 {
		t.Fatalf("one stock figure: %v, %v; want 10", got, err)
	}
}

// userIn returns the first user id from start whose home is bucket b of 3.
func userIn(b int, start int64) int64 {
	for u := start; ; u++ {
		if Home(u, 3) == b {
			return u
		}
	}
}

// TestPurchaseGoesHome: an instance that has never seen the voucher sends
// the buyer to bucket 0; the script answers with the bucket count before
// writing anything, and the purchase lands in the buyer's home bucket,
// its message naming the bucket.
func TestPurchaseGoesHome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newBucketEnv(t, 9)
	for _, co := range []int{0, 128} {
		res := NewReserver(e.rdb, e.keys, Coalesce(co))
		u := userIn(2, 100+int64(co))
		if _, err := res.Reserve(ctx, 7, u, 500+int64(co)); err != nil {
			t.Fatalf("coalesce %d: %v", co, err)
		}
		_, _, buyers := e.bucket(t, 2)
		if buyers[strconv.FormatInt(u, 10)] != strconv.FormatInt(500+int64(co), 10) {
			t.Fatalf("coalesce %d: bucket 2 buyers %v", co, buyers)
		}
		if s0, _, b0 := e.bucket(t, 0); s0 != 3 || len(b0) != 0 {
			t.Fatalf("coalesce %d: bucket 0 touched: stock %d buyers %v", co, s0, b0)
		}
		msgs, err := e.rdb.XRange(ctx, e.keys.Stream(e.keys.BucketShard(7, 2, 3)), "-", "+").Result()
		if err != nil || len(msgs) == 0 {
			t.Fatal(msgs, err)
		}
		m, err := Decode(msgs[len(msgs)-1].Values)
		if err != nil || m.Bucket != 2 || m.Buckets != 3 || m.UserID != u {
			t.Fatalf("message %+v, %v", m, err)
		}
	}
	if s2, _, _ := e.bucket(t, 2); s2 != 1 {
		t.Fatalf("bucket 2 stock %d after two sales, want 1", s2)
	}
}

// TestStaleBucketCountWritesNothing: a purchase sent with the wrong bucket
// count (an instance that thinks the voucher has one bucket) is answered 9
// and writes nothing, whatever the stock.
func TestStaleBucketCountWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newBucketEnv(t, 9)
	s := e.keys.Shard(7)
	keys := []string{e.keys.Ready(s), e.keys.State(7), e.keys.Buyers(7), e.keys.Stream(s), e.keys.Pending(s)}
	for _, args := range [][]any{{7, 11, 900}, {7, 11, 901, 0, 2}} {
		res, err := NewReserver(e.rdb, e.keys).script.Run(ctx, e.rdb, keys, args...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		var lay *LayoutError
		if _, err := decodePurchase(res); !errors.As(err, &lay) || lay.Buckets != 3 {
			t.Fatalf("args %v: %v, want a layout error naming 3 buckets", args, err)
		}
	}
	if stock, _, buyers := e.bucket(t, 0); stock != 3 || len(buyers) != 0 {
		t.Fatalf("bucket 0 written: stock %d buyers %v", stock, buyers)
	}
	if n, _ := e.rdb.XLen(ctx, e.keys.Stream(s)).Result(); n != 0 {
		t.Fatalf("%d messages", n)
	}
}

// TestOneBuyerOnEveryInstance: one buyer pressing 300 times at once on
// three instances (two coalescing, one not, none knowing the voucher's
// buckets) gets one order.
func TestOneBuyerOnEveryInstance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newBucketEnv(t, 30)
	instances := []*Reserver{NewReserver(e.rdb, e.keys), NewReserver(e.rdb, e.keys), NewReserver(e.rdb, e.keys, Coalesce(0))}
	// The first instance has sold the voucher before and knows its
	// buckets; the others have not.
	if _, err := instances[0].Reserve(ctx, 7, 1, 9999); err != nil {
		t.Fatal(err)
	}
	buyer := userIn(1, 4242)
	const presses = 300
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		mu    sync.Mutex
		won   []int64
		other []error
	)
	for i := range presses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := instances[i%3].Reserve(ctx, 7, buyer, int64(10000+i))
			mu.Lock()
			defer mu.Unlock()
			var held *PurchasedError
			switch {
			case err == nil:
				won = append(won, r.OrderID)
			case !errors.As(err, &held):
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(won) != 1 || len(other) != 0 {
		t.Fatalf("%d accepted %v, other answers %v; want one", len(won), won, other)
	}
	var total int64
	for b := range 3 {
		s, _, _ := e.bucket(t, b)
		total += s
	}
	if total != 28 {
		t.Fatalf("stock left %d, want 28", total)
	}
}

// lender is the Borrower of these tests: it moves units between two
// bucket hashes of one Redis in one script (the bucket package's journaled
// transfer between masters is tested there); answer, when set, is what
// it says instead.
type lender struct {
	e      bucketEnv
	answer error
	calls  int
}

var lendScript = redis.NewScript(`
local s = tonumber(redis.call('HGET', KEYS[1], 'stock'))
if s <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HINCRBY', KEYS[1], 'alloc', -1)
redis.call('HINCRBY', KEYS[2], 'stock', 1)
redis.call('HINCRBY', KEYS[2], 'alloc', 1)
return 1`)

func (l *lender) Borrow(ctx context.Context, v int64, to, nb int) error {
	l.calls++
	if l.answer != nil {
		return l.answer
	}
	k := l.e.keys
	for from := range nb {
		if from == to {
			continue
		}
		// Single server: every bucket hash is on it, so one script may
		// name two of them.
		moved, err := lendScript.Run(ctx, l.e.rdb, []string{k.StateAt(k.BucketShard(v, from, nb), v), k.StateAt(k.BucketShard(v, to, nb), v)}).Int()
		if err != nil || moved == 1 {
			return err
		}
	}
	return ErrSoldOut
}

// TestEmptyHomeBorrows: a buyer whose home bucket is empty is not refused
// while other buckets hold units: the Borrower moves some and the purchase
// runs again. The refusal is the Borrower's: sold out only when it says so.
func TestEmptyHomeBorrows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newBucketEnv(t, 3) // one unit per bucket
	l := &lender{e: e}
	res := NewReserver(e.rdb, e.keys, Lend(l))
	var won int
	for i := range int64(3) {
		if _, err := res.Reserve(ctx, 7, userIn(0, 1000*(i+1)), 700+i); err != nil {
			t.Fatalf("buyer %d of bucket 0: %v", i, err)
		}
		won++
	}
	if l.calls != 2 {
		t.Fatalf("%d borrows, want 2 (the home bucket held one unit)", l.calls)
	}
	if _, err := res.Reserve(ctx, 7, userIn(0, 9000), 799); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("fourth buyer: %v, want sold out", err)
	}
	for _, want := range []error{ErrInTransit, ErrNotReady} {
		l.answer = want
		if _, err := res.Reserve(ctx, 7, userIn(1, 9100), 800); !errors.Is(err, want) {
			t.Fatalf("borrower says %v: purchase %v", want, err)
		}
	}
	var alloc int64
	for b := range 3 {
		_, a, _ := e.bucket(t, b)
		alloc += a
	}
	if alloc != 3 {
		t.Fatalf("alloc sums to %d, want 3", alloc)
	}
}

// stillQuiet is the Quiescer of these tests: nothing is moving (no
// transfer in this package's tests), so it reads the other buckets'
// alloc and readiness. Its guard is a field it sets in the lost bucket's
// shard, as the bucket package's fence is.
type stillQuiet struct {
	e        bucketEnv
	released int
}

func (q *stillQuiet) Quiesce(ctx context.Context, v int64, nb, lost int) (Quiet, error) {
	g := Guard{Key: q.e.keys.Tag(q.e.keys.BucketShard(v, lost, nb)) + ":test-guard", Field: strconv.FormatInt(v, 10), Value: "held"}
	if err := q.e.rdb.HSet(ctx, g.Key, g.Field, g.Value).Err(); err != nil {
		return Quiet{}, err
	}
	out := Quiet{Alloc: map[int]int64{}, Ctx: ctx, Guard: g, Release: func(context.Context) { q.released++ }}
	for b := range nb {
		if b == lost {
			continue
		}
		s := q.e.keys.BucketShard(v, b, nb)
		if n, _ := q.e.rdb.Exists(ctx, q.e.keys.Ready(s)).Result(); n == 0 {
			out.NotReady = append(out.NotReady, b)
			continue
		}
		a, err := q.e.rdb.HGet(ctx, q.e.keys.StateAt(s, v), FieldAlloc).Int64()
		if err != nil {
			return Quiet{}, err
		}
		out.Alloc[b] = a
	}
	return out, nil
}

// TestRebuildOneBucket: a bucket whose master lost its data is rebuilt
// from the other buckets' alloc and the database's holders of that bucket,
// while the other buckets keep selling; the units it lent or borrowed
// before stay where they went.
func TestRebuildOneBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g := migratedMySQL(t)
	store := NewStore(g)
	e := newBucketEnv(t, 30)
	e.v.ID = 0
	if err := store.Create(ctx, &e.v); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Load(ctx, e.v, nil); err != nil {
		t.Fatal(err)
	}
	v := e.v
	nb := 3
	shard := func(b int) int { return e.keys.BucketShard(v.ID, b, nb) }
	// Bucket 2 lent 4 units to bucket 0 before: alloc 14, 10, 6.
	if err := e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(2), v.ID), "stock", -4).Err(); err != nil {
		t.Fatal(err)
	}
	e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(2), v.ID), FieldAlloc, -4)
	e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(0), v.ID), "stock", 4)
	e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(0), v.ID), FieldAlloc, 4)
	// The database holds three orders of bucket 1's buyers; then bucket
	// 1's shard loses everything.
	holders := map[int64]int64{userIn(1, 10): 1, userIn(1, 20): 2, userIn(1, 30): 3}
	for _, k := range []string{e.keys.StateAt(shard(1), v.ID), e.keys.BuyersAt(shard(1), v.ID), e.keys.Ready(shard(1))} {
		e.rdb.Del(ctx, k)
	}
	q := &stillQuiet{e: e}
	w := NewWarmer(store, e.state, ledger{buyers: holders}, e.keys, time.Hour, slog.New(slog.DiscardHandler))
	w.Quiesce(q)
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	stock, alloc, buyers := e.bucket(t, 1)
	if alloc != 10 || stock != 7 || len(buyers) != 3 {
		t.Fatalf("bucket 1 rebuilt: stock %d alloc %d buyers %v; want alloc 30-14-6 = 10, stock 10-3", stock, alloc, buyers)
	}
	if s0, a0, _ := e.bucket(t, 0); s0 != 14 || a0 != 14 {
		t.Fatalf("bucket 0 touched by the rebuild: stock %d alloc %d", s0, a0)
	}
	if q.released != 1 {
		t.Fatalf("quiet released %d times", q.released)
	}
	if n, _ := e.rdb.Exists(ctx, e.keys.Ready(shard(1))).Result(); n != 1 {
		t.Fatal("the rebuilt shard is not ready")
	}
	diffs, err := w.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 0 {
		t.Errorf("reconcile after the rebuild: %+v", diffs)
	}
	// Reconcile sees a bucket that drifted, and alloc that does not add up.
	e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(2), v.ID), FieldAlloc, 1)
	diffs, err = w.Reconcile(ctx)
	if err != nil || len(diffs) != 1 || diffs[0].Bucket != 2 || diffs[0].What != "stock" {
		t.Fatalf("reconcile after drift: %+v, %v", diffs, err)
	}
	e.rdb.HIncrBy(ctx, e.keys.StateAt(shard(2), v.ID), "stock", 1)
	diffs, err = w.Reconcile(ctx)
	if err != nil || len(diffs) != 1 || diffs[0].Bucket != -1 || diffs[0].What != "alloc" {
		t.Fatalf("reconcile after alloc drift: %+v, %v", diffs, err)
	}
	// Without a Quiescer the bucket is not rebuilt: its shard stays
	// closed, never sold from a guess.
	e.rdb.Del(ctx, e.keys.StateAt(shard(1), v.ID), e.keys.Ready(shard(1)))
	w2 := NewWarmer(store, e.state, ledger{buyers: holders}, e.keys, time.Hour, slog.New(slog.DiscardHandler))
	if _, err := w2.Warm(ctx); !errors.Is(err, errNoQuiescer) {
		t.Fatalf("warm without a quiescer: %v", err)
	}
	if n, _ := e.rdb.Exists(ctx, e.keys.Ready(shard(1))).Result(); n != 0 {
		t.Fatal("the shard reopened without its bucket")
	}
}
