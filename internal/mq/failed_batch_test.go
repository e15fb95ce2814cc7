package mq

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// TestFailedBatchStaysPending: a batch whose handler returned an error is
// done with nothing: its entries stay in the stream and pending with their
// consumer, which hands the same entries over again; when that consumer
// stops, still failing, they stay pending and another consumer reclaims
// them, counting the earlier delivery, and finishes them.
func TestFailedBatchStaysPending(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	const n = 5
	addMessages(t, rdb, stream, n)
	all, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil || len(all) != n {
		t.Fatalf("stream %v, %v", all, err)
	}
	want := make([]string, n)
	for i, e := range all {
		want[i] = e.ID
	}

	// The failing consumer: every batch fails.
	var calls handedOver
	failing := HandlerFunc(func(ctx context.Context, batch []Message) ([]Outcome, error) {
		calls.record(ctx, rdb, stream, batch)
		return nil, errors.New("database down")
	})
	actx, stopA := context.WithCancel(ctx)
	aDone := make(chan struct{})
	a := NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "a", Block: 20 * time.Millisecond,
		MaxBackoff: 20 * time.Millisecond, ReclaimIdle: time.Hour, Grace: time.Second,
	}, failing, quiet)
	go func() { defer close(aDone); _ = a.Run(actx) }()
	t.Cleanup(func() { stopA(); <-aDone })
	testenv.WaitFor(t, 10*time.Second, "the failing batch handed over three times", func() bool { return calls.count() >= 3 })
	stopA()
	<-aDone
	calls.check(t, want, "a")
	// Stopped while failing: nothing acknowledged, nothing deleted.
	p, err := rdb.XPending(ctx, stream, "g").Result()
	if err != nil || p.Count != n || p.Consumers["a"] != n {
		t.Fatalf("after the failing consumer stopped: pending %+v, %v; want %d with a", p, err, n)
	}
	if l, err := rdb.XLen(ctx, stream).Result(); err != nil || l != n {
		t.Fatalf("stream length %d, %v; want %d", l, err, n)
	}

	// Another consumer reclaims them, with the earlier deliveries counted.
	var bmu sync.Mutex
	deliveries := map[string]int64{}
	ok := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		bmu.Lock()
		defer bmu.Unlock()
		for _, m := range batch {
			deliveries[m.ID] = m.Deliveries
		}
		return make([]Outcome, len(batch)), nil
	})
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "b", Block: 20 * time.Millisecond,
		ReclaimIdle: 50 * time.Millisecond, ReclaimEvery: 20 * time.Millisecond,
	}, ok, quiet))
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
	bmu.Lock()
	defer bmu.Unlock()
	if len(deliveries) != n {
		t.Fatalf("the other consumer handled %d entries, want %d", len(deliveries), n)
	}
	for id, d := range deliveries {
		if d < 2 {
			t.Errorf("entry %s reclaimed with %d deliveries, want at least 2", id, d)
		}
	}
}

// handedOver records each batch a handler was handed: its ids, and what
// the group's pending list held at that moment.
type handedOver struct {
	mu    sync.Mutex
	calls []handed
}

type handed struct {
	ids     []string
	pending []redis.XPendingExt
}

func (h *handedOver) record(ctx context.Context, rdb *redis.Client, stream string, batch []Message) {
	c := handed{}
	for _, m := range batch {
		c.ids = append(c.ids, m.ID)
	}
	c.pending, _ = rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, c)
}

func (h *handedOver) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.calls)
}

// check fails unless every batch handed over was the whole of want, all
// of it pending with consumer at the time.
func (h *handedOver) check(t testing.TB, want []string, consumer string) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range h.calls {
		if !slices.Equal(c.ids, want) {
			t.Errorf("call %d handed %v, want the whole failed batch %v", i, c.ids, want)
		}
		if len(c.pending) != len(want) {
			t.Errorf("call %d: %d entries pending, want %d", i, len(c.pending), len(want))
		}
		for _, p := range c.pending {
			if p.Consumer != consumer {
				t.Errorf("call %d: entry %s pending with %q, want %s", i, p.ID, p.Consumer, consumer)
			}
		}
	}
}
