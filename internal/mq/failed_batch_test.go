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

	// The failing consumer: every batch fails; each call records the ids
	// it was handed and what the pending list held at that moment.
	type call struct {
		ids     []string
		pending []redis.XPendingExt
	}
	var mu sync.Mutex
	var calls []call
	failing := HandlerFunc(func(ctx context.Context, batch []Message) ([]Outcome, error) {
		c := call{}
		for _, m := range batch {
			c.ids = append(c.ids, m.ID)
		}
		c.pending, _ = rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 100}).Result()
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
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
	testenv.WaitFor(t, 10*time.Second, "the failing batch handed over three times", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) >= 3
	})
	stopA()
	<-aDone

	mu.Lock()
	for i, c := range calls {
		if !slices.Equal(c.ids, want) {
			t.Errorf("call %d handed %v, want the whole failed batch %v", i, c.ids, want)
		}
		if len(c.pending) != n {
			t.Errorf("call %d: %d entries pending, want %d", i, len(c.pending), n)
		}
		for _, p := range c.pending {
			if p.Consumer != "a" {
				t.Errorf("call %d: entry %s pending with %q, want a", i, p.ID, p.Consumer)
			}
		}
	}
	mu.Unlock()
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
