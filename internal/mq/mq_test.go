package mq

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

func names(tb testing.TB) (stream, delayed string) {
	p := testenv.Prefix(tb)
	return p + ":{0}:stream", p + ":{0}:delayed"
}

func TestDelayQueueForwardsOnlyDue(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	now := time.UnixMilli(1_900_000_000_000)
	for i, due := range []time.Time{now.Add(-time.Second), now, now.Add(time.Millisecond)} {
		if err := q.Schedule(ctx, Payload(map[string]string{"n": fmt.Sprint(i)}), due); err != nil {
			t.Fatal(err)
		}
	}
	st, err := q.Stats(ctx, now)
	if err != nil || st.Size != 3 || st.OldestOverdue != time.Second {
		t.Fatalf("stats %+v, %v", st, err)
	}
	n, err := q.Forward(ctx, now, 10)
	if err != nil || n != 2 {
		t.Fatalf("moved %d, %v; want 2", n, err)
	}
	entries, _ := rdb.XRange(ctx, stream, "-", "+").Result()
	if len(entries) != 2 || entries[0].Values["n"] != "0" || entries[1].Values["n"] != "1" {
		t.Fatalf("stream %v", entries)
	}
	if left, _ := rdb.ZCard(ctx, key).Result(); left != 1 {
		t.Fatalf("%d left in the queue, want 1", left)
	}
	// A member that is not a field list still moves, as one raw field.
	if err := rdb.ZAdd(ctx, key, redis.Z{Score: 1, Member: "not json"}).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := q.Forward(ctx, now, 10); err != nil || n != 1 {
		t.Fatalf("moved %d, %v", n, err)
	}
}

// TestDelayQueueManyPollers releases many pollers at once on one queue:
// every member moves exactly once.
func TestDelayQueueManyPollers(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	const members, pollers = 1000, 500
	now := time.Now()
	pipe := rdb.Pipeline()
	for i := range members {
		pipe.ZAdd(ctx, key, redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: Payload(map[string]string{"n": fmt.Sprint(i)})})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var moved atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range pollers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				n, err := q.Forward(ctx, now, 7)
				if err != nil {
					t.Error(err)
					return
				}
				moved.Add(int64(n))
				if n == 0 {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	entries, _ := rdb.XRange(ctx, stream, "-", "+").Result()
	seen := map[any]bool{}
	for _, e := range entries {
		if seen[e.Values["n"]] {
			t.Fatalf("member %v moved twice", e.Values["n"])
		}
		seen[e.Values["n"]] = true
	}
	if moved.Load() != members || len(entries) != members {
		t.Fatalf("moved %d, stream has %d; want %d", moved.Load(), len(entries), members)
	}
}

func addMessages(tb testing.TB, rdb *redis.Client, stream string, n int) {
	tb.Helper()
	for i := range n {
		if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": fmt.Sprint(i)}}).Err(); err != nil {
			tb.Fatal(err)
		}
	}
}

func runConsumer(tb testing.TB, c *Consumer) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
}

func drained(rdb *redis.Client, stream, key string) func() bool {
	return func() bool {
		ctx := context.Background()
		p, err := rdb.XPending(ctx, stream, "g").Result()
		l, lerr := rdb.XLen(ctx, stream).Result()
		z, zerr := rdb.ZCard(ctx, key).Result()
		return err == nil && lerr == nil && zerr == nil && p.Count == 0 && l == 0 && z == 0
	}
}

// TestPollerIdle: an idle poller looks at its queue when the first member
// is due, not every Every: a member scheduled elsewhere (no nudge) due in
// 300ms is moved after at most three looks (polling every 5ms would take
// about 60), and one scheduled on this instance is moved at once although
// the poller would otherwise sleep a minute.
func TestPollerIdle(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	var looks atomic.Int64 // the poller reads its clock once per look
	now := func() time.Time { looks.Add(1); return time.Now() }
	elsewhere := time.Now().Add(300 * time.Millisecond)
	if err := rdb.ZAdd(ctx, key, redis.Z{Score: float64(elsewhere.UnixMilli()), Member: Payload(map[string]string{"n": "0"})}).Err(); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_ = NewPoller(q, PollerConfig{Every: 5 * time.Millisecond, Idle: time.Minute, Now: now}, quiet).Run(pctx)
	}()
	moved := func(n int64) func() bool {
		return func() bool { l, err := rdb.XLen(ctx, stream).Result(); return err == nil && l == n }
	}
	testenv.WaitFor(t, 10*time.Second, "the member scheduled elsewhere moved", moved(1))
	if n := looks.Load(); n > 3 {
		t.Fatalf("%d looks at the queue to move one member due in 300ms; want at most 3", n)
	}
	if err := q.Schedule(ctx, Payload(map[string]string{"n": "1"}), time.Now()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the member scheduled here moved", moved(2))
	// The nudge reads the clock once too.
	if n := looks.Load(); n > 7 {
		t.Fatalf("%d readings of the clock in all; want at most 7", n)
	}
}

// TestConsumerRetryThroughDelayQueue: a Retry outcome sends the message
// through the delay queue and back with its attempt count raised.
func TestConsumerRetryThroughDelayQueue(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	// The poller sleeps a minute while idle, and is idle (it found the
	// queue empty) before the first message comes: only the consumer's
	// nudge brings each retry back in time.
	var looks atomic.Int64
	now := func() time.Time { looks.Add(1); return time.Now() }
	p := NewPoller(q, PollerConfig{Every: 5 * time.Millisecond, Idle: time.Minute, Now: now}, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	testenv.WaitFor(t, 10*time.Second, "the poller found the queue empty", func() bool { return looks.Load() > 0 })
	addMessages(t, rdb, stream, 5)
	var mu sync.Mutex
	attempts := map[string][]int{}
	h := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		out := make([]Outcome, len(batch))
		mu.Lock()
		defer mu.Unlock()
		for i, m := range batch {
			n := m.Values["n"].(string)
			attempts[n] = append(attempts[n], m.Attempt)
			if m.Attempt < 2 {
				out[i] = Retry
			}
		}
		return out, nil
	})
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "c", Block: 20 * time.Millisecond, Delay: q,
		RetryBackoff: func(int) time.Duration { return time.Millisecond },
	}, h, quiet))
	testenv.WaitFor(t, 10*time.Second, "every message handled at attempts 0, 1 and 2", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range 5 {
			if len(attempts[fmt.Sprint(i)]) < 3 {
				return false
			}
		}
		return true
	})
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
	mu.Lock()
	defer mu.Unlock()
	for n, a := range attempts {
		if fmt.Sprint(a) != "[0 1 2]" {
			t.Errorf("message %s went through attempts %v, want [0 1 2]", n, a)
		}
	}
}

// TestConsumerReclaimsFromDeadConsumer: entries a consumer read and never
// acknowledged are claimed by another after the idle time, with their
// delivery count.
func TestConsumerReclaimsFromDeadConsumer(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	addMessages(t, rdb, stream, 3)
	if _, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{stream, ">"}, Count: 10}).Result(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	deliveries := map[string]int64{}
	h := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range batch {
			deliveries[m.ID] = m.Deliveries
		}
		return make([]Outcome, len(batch)), nil
	})
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "alive", Block: 20 * time.Millisecond,
		ReclaimIdle: 100 * time.Millisecond, ReclaimEvery: 20 * time.Millisecond,
	}, h, quiet))
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
	mu.Lock()
	defer mu.Unlock()
	if len(deliveries) != 3 {
		t.Fatalf("handled %d entries, want 3", len(deliveries))
	}
	for id, d := range deliveries {
		if d != 2 {
			t.Errorf("entry %s: deliveries %d, want 2", id, d)
		}
	}
}

// TestConsumerKeepsLiveBatch: a batch that takes several idle times is not
// reclaimed by another consumer while its own consumer is alive.
func TestConsumerKeepsLiveBatch(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream, key := names(t)
	addMessages(t, rdb, stream, 4)
	const idle = 150 * time.Millisecond
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	var slowCalls, otherCalls atomic.Int64
	slow := HandlerFunc(func(ctx context.Context, batch []Message) ([]Outcome, error) {
		slowCalls.Add(1)
		<-release
		return make([]Outcome, len(batch)), nil
	})
	other := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		otherCalls.Add(int64(len(batch)))
		return make([]Outcome, len(batch)), nil
	})
	cfg := ConsumerConfig{Stream: stream, Group: "g", Block: 20 * time.Millisecond, ReclaimIdle: idle, ReclaimEvery: 20 * time.Millisecond}
	cfg.Consumer = "slow"
	runConsumer(t, NewConsumer(rdb, cfg, slow, quiet))
	t.Cleanup(free) // runs before the consumer's cleanup: it must not block
	testenv.WaitFor(t, 5*time.Second, "the slow consumer took its batch", func() bool { return slowCalls.Load() == 1 })
	cfg.Consumer = "other"
	runConsumer(t, NewConsumer(rdb, cfg, other, quiet))
	// Let the other consumer scan for idle entries for five idle times;
	// its scans are what this test watches, so waiting here is the test.
	deadline := time.Now().Add(5 * idle)
	for time.Now().Before(deadline) {
		if otherCalls.Load() != 0 {
			t.Fatalf("the other consumer took %d entries of a live batch", otherCalls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	free()
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
	if otherCalls.Load() != 0 {
		t.Fatalf("the other consumer took %d entries", otherCalls.Load())
	}
}

// TestPollerLooksAgainAfterMoving: a look that moved fewer members than a
// batch learns nothing of the next due time (the script reports it only
// when nothing was due), so the poller looks again after Every, not Idle:
// a second member scheduled elsewhere (no nudge), due soon after the first,
// moves in time although the poller would otherwise sleep a minute.
func TestPollerLooksAgainAfterMoving(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	now := time.Now()
	for i, due := range []time.Time{now.Add(200 * time.Millisecond), now.Add(400 * time.Millisecond)} {
		if err := rdb.ZAdd(ctx, key, redis.Z{Score: float64(due.UnixMilli()), Member: Payload(map[string]string{"n": fmt.Sprint(i)})}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Batch above one: the look that moves the first member returns after
	// one call, with the second member's due time unknown.
	runPoller(t, NewPoller(q, PollerConfig{Every: 5 * time.Millisecond, Idle: time.Minute, Batch: 10}, quiet))
	testenv.WaitFor(t, 10*time.Second, "both members moved", func() bool {
		l, err := rdb.XLen(ctx, stream).Result()
		return err == nil && l == 2
	})
}

// TestPollerRetriesFailedLookSoon: a look whose call to Redis failed knows
// nothing of the queue, so the poller looks again after Every, not Idle;
// once the queue is readable again, a due member moves without a nudge.
func TestPollerRetriesFailedLookSoon(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	q := NewDelayQueue(rdb, key, stream)
	if err := rdb.Set(ctx, key, "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var looks atomic.Int64 // the poller reads its clock once per call to Redis
	now := func() time.Time { looks.Add(1); return time.Now() }
	runPoller(t, NewPoller(q, PollerConfig{Every: 5 * time.Millisecond, Idle: time.Minute, Now: now}, quiet))
	testenv.WaitFor(t, 5*time.Second, "three failed looks", func() bool { return looks.Load() >= 3 })
	if l, err := rdb.XLen(ctx, stream).Result(); err != nil || l != 0 {
		t.Fatalf("stream length %d, %v after failed looks; want 0", l, err)
	}
	pipe := rdb.TxPipeline()
	pipe.Del(ctx, key)
	pipe.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().UnixMilli()), Member: Payload(map[string]string{"n": "0"})})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the member moved once the queue was readable", func() bool {
		l, err := rdb.XLen(ctx, stream).Result()
		return err == nil && l == 1
	})
}

// runPoller runs p until the test ends.
func runPoller(tb testing.TB, p *Poller) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
}
