package mq

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestBackoffDoublesAndResets: waits start at 50ms, double up to the
// ceiling, and start again from the bottom after a success. A done context
// ends each wait at once.
func TestBackoffDoublesAndResets(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := backoff{max: 300 * time.Millisecond, log: quiet}
	fail := errors.New("redis down")
	var got []time.Duration
	for range 5 {
		if b.wait(ctx, fail) {
			t.Fatal("wait on a done context reported the wait passed")
		}
		got = append(got, b.last)
	}
	want := []time.Duration{50, 100, 200, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
	if !b.failing {
		t.Fatal("not failing after failures")
	}
	b.reset()
	if b.failing || b.last != 0 {
		t.Fatalf("after reset: failing %v, last %v", b.failing, b.last)
	}
	b.wait(ctx, fail)
	if b.last != 50*time.Millisecond {
		t.Fatalf("first wait after a reset %v, want 50ms", b.last)
	}
}

// TestConsumerRecreatesLostGroup: when the stream and its group vanish
// (Redis lost its data), the consumer's reads fail with NOGROUP, wrapped;
// the consumer creates the group again and handles what is added after.
func TestConsumerRecreatesLostGroup(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)
	var handled atomic.Int64
	h := HandlerFunc(func(_ context.Context, batch []Message) ([]Outcome, error) {
		handled.Add(int64(len(batch)))
		return make([]Outcome, len(batch)), nil
	})
	w := newWatch()
	runConsumer(t, NewConsumer(rdb, ConsumerConfig{
		Stream: stream, Group: "g", Consumer: "c", Block: 20 * time.Millisecond,
		MaxBackoff: 50 * time.Millisecond, Observer: w,
	}, h, quiet))
	addMessages(t, rdb, stream, 2)
	testenv.WaitFor(t, 10*time.Second, "the first two messages handled", func() bool { return handled.Load() == 2 })
	if err := rdb.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "a read failed for the missing group", func() bool {
		errs, _, _ := w.read()
		return errs["read"] > 0
	})
	testenv.WaitFor(t, 10*time.Second, "the group created again", func() bool {
		groups, err := rdb.XInfoGroups(ctx, stream).Result()
		return err == nil && len(groups) == 1 && groups[0].Name == "g"
	})
	addMessages(t, rdb, stream, 3)
	testenv.WaitFor(t, 10*time.Second, "the messages added after handled", func() bool { return handled.Load() == 5 })
	testenv.WaitFor(t, 10*time.Second, "stream, pending list and delay queue drained", drained(rdb, stream, key))
}
