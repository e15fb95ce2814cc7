package voucher

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// pauseFlights pauses srv and sends coalesceFlights purchases through res
// (users 1.., orders 100..), each alone; it returns once every flight is
// out, stuck on the paused server, with the channel their errors arrive on.
func pauseFlights(t testing.TB, srv *testenv.RedisServer, res *Reserver, extra int) chan error {
	t.Helper()
	ctx := context.Background()
	if err := res.script.Load(ctx, srv.Client(t)).Err(); err != nil { // no NOSCRIPT to send twice
		t.Fatal(err)
	}
	srv.Pause(t)
	done := make(chan error, coalesceFlights+extra)
	for i := range int64(coalesceFlights) {
		go func() { _, err := res.Reserve(ctx, 7, 1+i, 100+i); done <- err }()
	}
	testenv.WaitFor(t, 10*time.Second, "every flight out", func() bool { f, _ := res.co.load(); return f == coalesceFlights })
	return done
}

// collect waits for n errors from done, each nil, within a deadline: a
// purchase left in the queue with no flight to take it would wait for ever.
func collect(t testing.TB, done chan error, n int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for i := range n {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("%d of %d purchases answered; the others never were", i, n)
		}
	}
}

// TestCoalesceBatchBounded: purchases queued while every flight is out go
// in pipelines of at most maxBatch: 13 queued with Coalesce(4) fly in four
// pipelines (4, 4, 4 and a last one alone) as the flights come back, and
// every one of them is answered.
func TestCoalesceBatchBounded(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	const maxBatch, queued = 4, 13
	res := NewReserver(rdb, keys, Coalesce(maxBatch))
	done := pauseFlights(t, srv, res, queued)
	for i := range int64(queued) {
		go func() { _, err := res.Reserve(context.Background(), 7, 50+i, 500+i); done <- err }()
	}
	testenv.WaitFor(t, 10*time.Second, "the purchases queued", func() bool { _, q := res.co.load(); return q == queued })
	srv.Resume(t)
	collect(t, done, coalesceFlights+queued)
	st := res.CoalesceStats()
	if want := int64(coalesceFlights + (queued+maxBatch-1)/maxBatch); st.Purchases != coalesceFlights+queued || st.Flushes != want {
		t.Fatalf("%d purchases in %d pipelines; want %d in %d (%d alone, then at most %d a pipeline)",
			st.Purchases, st.Flushes, coalesceFlights+queued, want, coalesceFlights, maxBatch)
	}
}

// leavesAtFlush is a purchase's context that is live when the purchase
// starts (its first look at Err) and ends when its flush is about to be
// written (the next look): a buyer who leaves once a flight took the
// purchase, before it is sent.
type leavesAtFlush struct {
	context.Context
	cancel context.CancelFunc
	looks  atomic.Int32
}

func newLeavesAtFlush() *leavesAtFlush {
	ctx, cancel := context.WithCancel(context.Background())
	return &leavesAtFlush{Context: ctx, cancel: cancel}
}

func (c *leavesAtFlush) Err() error {
	if c.looks.Add(1) >= 2 {
		c.cancel()
	}
	return c.Context.Err()
}

// TestCoalesceBuyerLeavesBeforeTheFlush: a purchase whose buyer left after
// a flight took it, before its flush was written, is not sent and returns
// the context's error; the purchases it led in the same pipeline are sent
// and answered as if it had never been there (the flush does not run on
// the leaver's context).
func TestCoalesceBuyerLeavesBeforeTheFlush(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	onSale(t, rdb, keys, 7, 100)
	res := NewReserver(rdb, keys)
	ctx := context.Background()
	done := pauseFlights(t, srv, res, 1)
	left := make(chan error, 1)
	go func() { _, err := res.Reserve(newLeavesAtFlush(), 7, 60, 600); left <- err }()
	testenv.WaitFor(t, 10*time.Second, "the leaver queued", func() bool { _, q := res.co.load(); return q == 1 })
	go func() { _, err := res.Reserve(ctx, 7, 61, 601); done <- err }()
	testenv.WaitFor(t, 10*time.Second, "a buyer queued behind it", func() bool { _, q := res.co.load(); return q == 2 })
	srv.Resume(t)
	collect(t, done, coalesceFlights+1)
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the buyer who left: %v, want context.Canceled", err)
	}
	if _, err := rdb.HGet(ctx, keys.Buyers(7), "60").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the purchase of the buyer who left reached Redis: %v", err)
	}
	if o, err := rdb.HGet(ctx, keys.Buyers(7), "61").Result(); err != nil || o != "601" {
		t.Fatalf("the buyer behind it holds %q (%v), want order 601", o, err)
	}
	if st := res.CoalesceStats(); st.Purchases != coalesceFlights+1 {
		t.Fatalf("%d purchases sent, want %d", st.Purchases, coalesceFlights+1)
	}
	// Alone: a purchase whose buyer leaves before its flush is not sent.
	if _, err := res.Reserve(newLeavesAtFlush(), 7, 62, 602); !errors.Is(err, context.Canceled) {
		t.Fatalf("a lone purchase whose buyer left: %v, want context.Canceled", err)
	}
	if _, err := rdb.HGet(ctx, keys.Buyers(7), "62").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the lone purchase of the buyer who left reached Redis: %v", err)
	}
}
