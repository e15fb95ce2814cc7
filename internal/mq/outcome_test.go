package mq

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/lua"
)

// watch is an Observer that remembers what the consumer reported.
type watch struct {
	mu       sync.Mutex
	errors   map[string]int
	acked    int
	retried  int
	reclaims int
}

func newWatch() *watch { return &watch{errors: map[string]int{}} }

func (w *watch) Outcomes(acked, retried, _ int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.acked += acked
	w.retried += retried
}

func (w *watch) Reclaimed(n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.reclaims += n
}

func (w *watch) RedisError(op string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errors[op]++
}

func (w *watch) read() (errors map[string]int, acked, retried int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	errors = make(map[string]int, len(w.errors))
	for k, v := range w.errors {
		errors[k] = v
	}
	return errors, w.acked, w.retried
}

func addMany(tb testing.TB, rdb *redis.Client, stream string, n int) {
	tb.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": fmt.Sprint(i)}})
		if (i+1)%1000 == 0 || i == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// claimedSince reports whether the pending entry id was last delivered or
// claimed after t.
func claimedSince(ctx context.Context, rdb *redis.Client, stream, id string, t time.Time) bool {
	p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: id, End: id, Count: 1}).Result()
	return err == nil && len(p) == 1 && time.Since(t) > p[0].Idle+5*time.Millisecond
}

// TestConsumerLargeBatch: a batch of 10,000 entries, more ids than one
// Redis command takes from a Lua script's stack (about 8,000), is kept
// fresh while it is handled, and acknowledged and deleted whole.
func TestConsumerLargeBatch(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream, key := names(t)
	const n = 10_000
	addMany(t, rdb, stream, n)
	w := newWatch()
	var sizes []int
	var mu sync.Mutex
	h := HandlerFunc(func(ctx context.Context, batch []Message) ([]Outcome, error) {
		mu.Lock()
		sizes = append(sizes, len(batch))
		mu.Unlock()
		// Hold the batch until the keep-alive has claimed all of it again
		// (one command for every id of the batch), with a deadline.
		began := time.Now()
		for !claimedSince(ctx, rdb, stream, batch[0].ID, began) || !claimedSince(ctx, rdb, stream, batch[len(batch)-1].ID, began) {
			if time.Since(began) > 10*time.Second {
				t.Error("the batch was not kept fresh within 10s")
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		return make([]Outcome, len(batch)), nil
	})
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "c", Batch: n, Block: 20 * time.Millisecond,
		ReclaimIdle: 150 * time.Millisecond, ReclaimEvery: time.Hour, Observer: w,
	}, h, quiet))
	// The outcomes are reported just after the acknowledgement: wait for
	// both.
	testenv.WaitFor(t, 20*time.Second, "stream and pending list drained, outcomes reported", func() bool {
		errs, acked, _ := w.read()
		if errs["ack"] > 0 {
			t.Fatalf("acknowledging the batch failed %d times", errs["ack"])
		}
		return acked >= n && drained(rdb, stream, key)()
	})
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 1 || sizes[0] != n {
		t.Fatalf("batches handled %v, want one of %d", sizes, n)
	}
	if errs, acked, _ := w.read(); acked != n || len(errs) != 0 {
		t.Fatalf("acked %d, errors %v; want %d and none", acked, errs, n)
	}
}

// TestConsumerRetryWrongTypedQueue: while the delay queue's key holds the
// wrong type, a Retry outcome fails without acknowledging the entry: it
// stays pending, handed over again and again, and goes through the delay
// queue once the key is right. It is never in neither place.
func TestConsumerRetryWrongTypedQueue(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	addMessages(t, rdb, stream, 1)
	if err := rdb.Set(ctx, key, "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var handledAgain atomic.Bool
	h := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		calls.Add(1)
		out := make([]Outcome, len(batch))
		for i, m := range batch {
			if m.Attempt == 0 {
				out[i] = Retry
			} else {
				handledAgain.Store(true)
			}
		}
		return out, nil
	})
	w := newWatch()
	q := NewDelayQueue(rdb, key, stream)
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "c", Block: 20 * time.Millisecond, Delay: q, Observer: w,
		MaxBackoff: 20 * time.Millisecond, RetryBackoff: func(int) time.Duration { return time.Millisecond },
	}, h, quiet))
	pendingCount := func() int64 {
		p, err := rdb.XPending(ctx, stream, "g").Result()
		if err != nil {
			t.Fatal(err)
		}
		return p.Count
	}
	// Three hand-overs: the second and third each ran after a failed one.
	testenv.WaitFor(t, 10*time.Second, "the batch handed over three times, or its entry gone after two", func() bool {
		n := calls.Load()
		return n >= 3 || n == 2 && pendingCount() == 0
	})
	if n := pendingCount(); n != 1 {
		t.Fatalf("after failed retries %d entries pending, want 1 (the entry is in neither the pending list nor the delay queue)", n)
	}
	if errs, _, retried := w.read(); errs["delay"] == 0 || retried != 0 {
		t.Fatalf("delay errors %d, retried %d; want errors and no retry", errs["delay"], retried)
	}
	// The key is made right: the entry goes through the delay queue.
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = NewPoller(q, PollerConfig{Every: 5 * time.Millisecond}, quiet).Run(pctx) }()
	testenv.WaitFor(t, 10*time.Second, "the entry handled after the delay queue", handledAgain.Load)
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
}

// TestConsumerRetryNotPending: a Retry outcome for an entry no longer
// pending with this consumer (acknowledged meanwhile by another) schedules
// nothing and fails the batch, loudly: it is not counted as retried. The
// rest of the batch is carried out, the entry is not handed over again,
// and the consumer goes on.
func TestConsumerRetryNotPending(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	addMessages(t, rdb, stream, 3)
	var mu sync.Mutex
	handled := map[string]int{}
	h := HandlerFunc(func(ctx context.Context, batch []Message) ([]Outcome, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([]Outcome, len(batch))
		for i, m := range batch {
			handled[m.Values["n"].(string)]++
			if m.Values["n"] == "1" {
				// Another consumer took it over and finished it.
				if err := rdb.XAck(ctx, stream, "g", m.ID).Err(); err != nil {
					return nil, err
				}
				out[i] = Retry
			}
		}
		return out, nil
	})
	w := newWatch()
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "c", Block: 20 * time.Millisecond, Delay: NewDelayQueue(rdb, key, stream),
		Observer: w, MaxBackoff: 20 * time.Millisecond, RetryBackoff: func(int) time.Duration { return time.Millisecond },
	}, h, quiet))
	testenv.WaitFor(t, 10*time.Second, "the other entries acknowledged", func() bool {
		_, acked, _ := w.read()
		return acked == 2
	})
	addMessages(t, rdb, stream, 1) // the consumer goes on
	testenv.WaitFor(t, 10*time.Second, "the next entry acknowledged", func() bool {
		_, acked, _ := w.read()
		return acked == 3
	})
	errs, acked, retried := w.read()
	// Another consumer owning the entry is no Redis failure: nothing is
	// counted as one (SeckillRedisErrors pages on that count).
	if errs["delay"] != 0 || retried != 0 || acked != 3 {
		t.Fatalf("delay errors %d, retried %d, acked %d; want 0, 0, 3", errs["delay"], retried, acked)
	}
	mu.Lock()
	defer mu.Unlock()
	if handled["1"] != 1 || handled["2"] != 1 {
		t.Fatalf("handled %v: the entry no longer ours or a carried-out one was handed over again", handled)
	}
	if z, err := rdb.ZCard(ctx, key).Result(); err != nil || z != 0 {
		t.Fatalf("delay queue holds %d, %v; want nothing scheduled", z, err)
	}
}

// TestScriptsFailClosed: retry.lua and forward.lua check the keys they
// write before their first write, on Redis and on the embedded Redis
// (miniredis) alike: a wrong-typed key fails the call with nothing written.
func TestScriptsFailClosed(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	embedded := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = embedded.Close() })
	for name, rdb := range map[string]*redis.Client{"redis": testenv.Redis(t), "miniredis": embedded} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			stream, key := names(t)
			if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
				t.Fatal(err)
			}
			addMessages(t, rdb, stream, 2)
			read, err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}, Count: 2}).Result()
			if err != nil {
				t.Fatal(err)
			}
			id, other := read[0].Messages[0].ID, read[0].Messages[1].ID
			retry := func(keys []string, consumer string) (int, error) {
				return lua.Retry().Run(ctx, rdb, keys, "g", id, 5, Payload(map[string]string{"n": "0"}), consumer).Int()
			}
			pending := func() int64 {
				p, err := rdb.XPending(ctx, stream, "g").Result()
				if err != nil {
					t.Fatal(err)
				}
				return p.Count
			}

			// A wrong-typed delay queue, or a stream key that is no
			// stream: an error, the entry still pending.
			if err := rdb.Set(ctx, key, "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := retry([]string{stream, key}, "c"); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("retry into a string key: %v, want WRONGTYPE", err)
			}
			if _, err := retry([]string{key, key + "2"}, "c"); err == nil {
				t.Fatal("retry on a stream key that is a string: no error")
			}
			if pending() != 2 {
				t.Fatalf("%d pending after failed retries, want 2", pending())
			}
			if err := rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			// A stream that is gone (Redis lost its data): NOGROUP, which
			// the consumer answers by creating the group again, and nothing
			// scheduled.
			if _, err := retry([]string{stream + ":gone", key}, "c"); !IsNoGroup(err) {
				t.Fatalf("retry on a missing stream: %v, want NOGROUP (code first)", err)
			}
			if n, err := rdb.Exists(ctx, key).Result(); err != nil || n != 0 {
				t.Fatalf("retry on a missing stream scheduled something: %d, %v", n, err)
			}
			// Another consumer's entry is not this one's to move.
			if n, err := retry([]string{stream, key}, "other"); err != nil || n != 0 {
				t.Fatalf("retry of another consumer's entry: %d, %v; want 0", n, err)
			}
			if n, err := retry([]string{stream, key}, "c"); err != nil || n != 1 {
				t.Fatalf("retry: %d, %v; want 1", n, err)
			}
			if n, err := retry([]string{stream, key}, "c"); err != nil || n != 0 {
				t.Fatalf("retry again: %d, %v; want 0", n, err)
			}
			if pending() != 1 {
				t.Fatalf("%d pending, want 1", pending())
			}
			// ack.lua acknowledges and deletes.
			if n, err := lua.Ack().Run(ctx, rdb, []string{stream}, "g", other).Int(); err != nil || n != 1 {
				t.Fatalf("ack: %d, %v", n, err)
			}

			// forward.lua into a stream key of the wrong type: an error,
			// the member still queued.
			q := NewDelayQueue(rdb, key, key+"wrong")
			if err := rdb.Set(ctx, key+"wrong", "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := q.Forward(ctx, time.UnixMilli(10), 10); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("forward into a string key: %v, want WRONGTYPE", err)
			}
			if z, _ := rdb.ZCard(ctx, key).Result(); z != 1 {
				t.Fatalf("%d members queued after a failed forward, want 1", z)
			}
			// A member with more fields than one XADD takes from a script
			// moves as one raw field.
			fields := make(map[string]string, 5000)
			for i := range 5000 {
				fields[fmt.Sprint(i)] = "v"
			}
			if err := q.Schedule(ctx, Payload(fields), time.UnixMilli(1)); err != nil {
				t.Fatal(err)
			}
			q = NewDelayQueue(rdb, key, stream)
			if n, err := q.Forward(ctx, time.UnixMilli(10), 10); err != nil || n != 2 {
				t.Fatalf("forward: %d, %v; want 2", n, err)
			}
			entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
			if err != nil || len(entries) != 2 || entries[0].Values["raw"] == nil || entries[1].Values["n"] != "0" {
				t.Fatalf("stream after forward: %d entries, %v", len(entries), err)
			}
		})
	}
}
