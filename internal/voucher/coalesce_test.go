package voucher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/lua"
)

// load reads how many flights are out and how many purchases queue.
func (co *coalescer) load() (flights, queued int) {
	co.mu.Lock()
	defer co.mu.Unlock()
	return co.flights, len(co.queue)
}

// onSale loads a voucher open for an hour and marks its shard ready.
func onSale(t testing.TB, rdb redis.UniversalClient, keys Keys, id int64, stock int) {
	t.Helper()
	ctx := context.Background()
	st := NewState(rdb, keys)
	now := time.Now()
	if _, err := st.Load(ctx, Voucher{ID: id, Stock: stock, TotalStock: stock, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkReady(ctx, keys.Shard(id)); err != nil {
		t.Fatal(err)
	}
}

// stampede releases one goroutine per buyer at once; buyer i buys
// voucher ids[i%len(ids)] as user users(i) with order id base+i. It returns
// every buyer's error and, per voucher, the users who were accepted.
func stampede(t testing.TB, res *Reserver, n int, ids []int64, user func(i int) int64, base int64) ([]error, map[int64][]int64) {
	t.Helper()
	errs := make([]error, n)
	won := make([]bool, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := res.Reserve(context.Background(), ids[i%len(ids)], user(i), base+int64(i))
			errs[i] = err
			won[i] = err == nil && !r.Replayed && r.OrderID == base+int64(i)
			if err == nil && !won[i] {
				errs[i] = fmt.Errorf("accepted as %+v", r)
			}
		})
	}
	close(start)
	wg.Wait()
	winners := map[int64][]int64{}
	for i, w := range won {
		if w {
			id := ids[i%len(ids)]
			winners[id] = append(winners[id], user(i))
		}
	}
	return errs, winners
}

// TestCoalescedStampede releases 500 buyers at once on 100 units, a
// hundred of them pressing twice: exactly 100 win, nobody twice, everyone
// else hears sold_out or already_purchased, and the 500 scripts reach
// Redis in far fewer pipelines than purchases.
func TestCoalescedStampede(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	res := NewReserver(rdb, keys)
	const buyers = 500
	errs, winners := stampede(t, res, buyers, []int64{7}, func(i int) int64 { return int64(1 + i%400) }, 10_000)
	seen := map[int64]bool{}
	for _, u := range winners[7] {
		if seen[u] {
			t.Fatalf("user %d won twice", u)
		}
		seen[u] = true
	}
	if len(winners[7]) != 100 {
		t.Fatalf("%d won, want 100", len(winners[7]))
	}
	var held *PurchasedError
	for i, err := range errs {
		if err != nil && !errors.Is(err, ErrSoldOut) && !errors.As(err, &held) {
			t.Fatalf("buyer %d: %v", i, err)
		}
	}
	if n, err := rdb.HLen(context.Background(), keys.Buyers(7)).Result(); err != nil || n != 100 {
		t.Fatalf("%d buyers recorded (%v), want 100", n, err)
	}
	st := res.CoalesceStats()
	t.Logf("%d purchases in %d pipelines", st.Purchases, st.Flushes)
	// Purchases counts the scripts sent: a NOSCRIPT answer sends one again.
	if st.Purchases < buyers || st.Flushes > buyers/4 {
		t.Fatalf("%d purchases in %d pipelines; want %d in at most %d", st.Purchases, st.Flushes, buyers, buyers/4)
	}
}

// TestCoalesceLonePurchaseGoesAlone: a purchase that finds the Reserver
// idle is sent at once, in a pipeline of its own; nothing waits for
// company.
func TestCoalesceLonePurchaseGoesAlone(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	// The script cached first: on a fresh Redis the first purchase would
	// be sent twice (NOSCRIPT, then again), which is not what is counted.
	if err := lua.Purchase().Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	res := NewReserver(rdb, keys)
	for i := range int64(20) {
		if _, err := res.Reserve(context.Background(), 7, 1+i, 100+i); err != nil {
			t.Fatal(err)
		}
		if st := res.CoalesceStats(); st.Flushes != i+1 || st.Purchases != i+1 {
			t.Fatalf("after %d lone purchases: %+v, want one pipeline each", i+1, st)
		}
	}
}

// TestCoalesceOff: Coalesce(0) and WaitReplicas leave one round trip per
// purchase.
func TestCoalesceOff(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	for name, r := range map[string]*Reserver{
		"off":           NewReserver(rdb, keys, Coalesce(0)),
		"wait replicas": NewReserver(rdb, keys, Coalesce(64), WaitReplicas(1, time.Second)),
	} {
		if r.co != nil {
			t.Fatalf("%s: coalescing is on", name)
		}
	}
	res := NewReserver(rdb, keys, Coalesce(0))
	if _, err := res.Reserve(context.Background(), 7, 1, 1); err != nil || res.CoalesceStats() != (CoalesceStats{}) {
		t.Fatalf("off: %v, %+v", err, res.CoalesceStats())
	}
}

// TestCoalesceCancelWhileQueued: with every flight stuck on a paused
// Redis, a purchase queues; its context ends: it returns the context's
// error at once, and is never sent.
func TestCoalesceCancelWhileQueued(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 10)
	res := NewReserver(rdb, keys)
	ctx := context.Background()
	if err := res.script.Load(ctx, rdb).Err(); err != nil { // no NOSCRIPT to send twice
		t.Fatal(err)
	}

	srv.Pause(t)
	flying := make(chan error, coalesceFlights)
	for i := range int64(coalesceFlights) {
		go func() { _, err := res.Reserve(ctx, 7, 1+i, 100+i); flying <- err }()
	}
	testenv.WaitFor(t, 10*time.Second, "every flight out", func() bool { f, _ := res.co.load(); return f == coalesceFlights })
	qctx, cancel := context.WithCancel(ctx)
	queued := make(chan error, 1)
	go func() { _, err := res.Reserve(qctx, 7, 50, 500); queued <- err }()
	testenv.WaitFor(t, 10*time.Second, "a purchase queued", func() bool { _, q := res.co.load(); return q == 1 })
	cancel()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued purchase: %v, want context.Canceled", err)
	}
	if _, q := res.co.load(); q != 0 {
		t.Fatalf("%d purchases still queued", q)
	}
	srv.Resume(t)
	for range coalesceFlights {
		if err := <-flying; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rdb.HGet(ctx, keys.Buyers(7), "50").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the cancelled purchase reached Redis: %v", err)
	}
	if st := res.CoalesceStats(); st.Purchases != coalesceFlights {
		t.Fatalf("%d purchases sent, want %d", st.Purchases, coalesceFlights)
	}
	// A purchase whose context ended before it was called is not sent either.
	if _, err := res.Reserve(qctx, 7, 51, 501); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled purchase: %v", err)
	}
}

// TestCoalesceFailedFlush: while Redis is paused every flush times out and
// each purchase it carried gets an error of its own; after Resume the next
// purchases are taken.
func TestCoalesceFailedFlush(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	res := NewReserver(rdb, keys)

	srv.Pause(t)
	const n = 10
	errs, _ := stampede(t, res, n, []int64{7}, func(i int) int64 { return int64(1 + i) }, 100)
	for i, err := range errs {
		var nerr interface{ Timeout() bool }
		if !errors.As(err, &nerr) || !nerr.Timeout() {
			t.Fatalf("buyer %d while Redis is paused: %v, want a timeout", i, err)
		}
	}
	if st := res.CoalesceStats(); st.Purchases != n || st.Flushes >= n {
		t.Fatalf("%+v: want %d purchases in fewer pipelines", st, n)
	}
	srv.Resume(t)
	errs, winners := stampede(t, res, n, []int64{7}, func(i int) int64 { return int64(100 + i) }, 1000)
	if len(winners[7]) != n {
		t.Fatalf("after Resume %d of %d taken: %v", len(winners[7]), n, errs)
	}
}

// TestCoalesceNoScript: after SCRIPT FLUSH every pipelined script answers
// NOSCRIPT; the script is loaded and those purchases are sent once more.
func TestCoalesceNoScript(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	keys := NewKeys(testenv.Prefix(t), 2)
	onSale(t, rdb, keys, 6, 100)
	onSale(t, rdb, keys, 7, 100)
	res := NewReserver(rdb, keys)
	ids := []int64{6, 7}
	for round := range int64(3) {
		if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		errs, winners := stampede(t, res, 60, ids, func(i int) int64 { return round*100 + int64(i) }, round*1000)
		if len(winners[6])+len(winners[7]) != 60 {
			t.Fatalf("round %d: %d of 60 taken: %v", round, len(winners[6])+len(winners[7]), errs)
		}
	}
	for _, id := range ids {
		if n, _ := rdb.HGet(context.Background(), keys.State(id), "stock").Int(); n != 10 {
			t.Fatalf("voucher %d: stock %d, want 10", id, n)
		}
	}
}

// TestCoalesceCluster: on a three-master cluster a pipeline carries
// purchases of shards on every master; the client splits it by node and
// follows MOVED after a slot moved and ASK while it moves.
func TestCoalesceCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	rdb := c.Client(t)
	keys := KeysFor(testenv.Prefix(t), 3, true)
	ids := []int64{3, 4, 5} // one per shard
	masters := map[*testenv.ClusterNode]bool{}
	for _, id := range ids {
		onSale(t, rdb, keys, id, 1000)
		masters[c.MasterOf(t, keys.State(id))] = true
	}
	if len(masters) != 3 {
		t.Fatalf("the shards live on %d masters, want 3", len(masters))
	}
	res := NewReserver(rdb, keys)
	taken := map[int64]int{}
	round := int64(0)
	buy := func(stage string) {
		t.Helper()
		round++
		const n = 150
		errs, winners := stampede(t, res, n, ids, func(i int) int64 { return round*1000 + int64(i) }, round*1000)
		sum := 0
		for id, w := range winners {
			taken[id] += len(w)
			sum += len(w)
		}
		if sum != n {
			t.Fatalf("%s: %d of %d taken: %v", stage, sum, n, errs)
		}
	}
	buy("settled")
	if st := res.CoalesceStats(); st.Flushes >= st.Purchases {
		t.Fatalf("%+v: nothing coalesced", st)
	}

	id := ids[0]
	slot := c.KeySlot(t, keys.State(id))
	from := c.MasterOf(t, keys.State(id))
	to := otherMaster(t, c, from)
	c.MigrateSlot(t, slot, to)
	buy("moved") // the client's map still names the old master: MOVED
	m := c.BeginMigrate(t, slot, from)
	for m.MoveKeys(t, 100) > 0 {
	}
	buy("moving") // the keys are on the importing node: ASK
	m.Finish(t)
	buy("moved back")

	for _, id := range ids {
		stock, err := rdb.HGet(context.Background(), keys.State(id), "stock").Int()
		if err != nil || stock != 1000-taken[id] {
			t.Fatalf("voucher %d: stock %d (%v), want %d", id, stock, err, 1000-taken[id])
		}
		if n, _ := rdb.HLen(context.Background(), keys.Buyers(id)).Result(); int(n) != taken[id] {
			t.Fatalf("voucher %d: %d buyers, want %d", id, n, taken[id])
		}
	}
	t.Logf("%+v", res.CoalesceStats())
}
