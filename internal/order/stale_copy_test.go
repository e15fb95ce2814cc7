package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestWriterReplayedKeptByMessageRedelivered: a letter kept by its
// message is replayed while its message is still pending (a worker died
// after the commit, before the give-back and the ack): the replay sends
// nothing and says so, the letter stays live, and the redelivered message
// ends as that letter again.
func TestWriterReplayedKeptByMessageRedelivered(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v1, v2 := oneIDTwoBuyers(t, e, 2301)
	handle(t, e.w, []mq.Message{msg(1, 2301, 1, v1)}) // buyer 1's letter holds the id
	over := msg(2, 2301, 2, v2)
	over.Deliveries = 99
	handle(t, e.w, []mq.Message{over}) // buyer 2's, kept by its message
	// As if the worker had died after the commit, before the give-back.
	if err := e.rdb.HSet(ctx, e.keys.Buyers(v2), "2", 2301).Err(); err != nil {
		t.Fatal(err)
	}
	d := deadLetterOf(t, e, 2, v2)
	if _, err := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys)).Replay(ctx, d.ID); !errors.Is(err, ErrInFlight) {
		t.Fatalf("replay: %v, want ErrInFlight", err)
	}
	if d := deadLetterOf(t, e, 2, v2); d.ReplayedAt != nil {
		t.Fatalf("dead letter %+v marked replayed though nothing was sent", d)
	}
	over.Deliveries = 100
	handle(t, e.w, []mq.Message{over}) // the pending message, reclaimed
	if d := deadLetterOf(t, e, 2, v2); d.ReplayedAt != nil || d.Reason != ReasonDeliveryLimit {
		t.Fatalf("dead letter %+v, want delivery_limit and live", d)
	}
}

// TestWriterSameOrderTwiceInBatch: two messages of one order in a batch
// (a replay beside a stale copy): the second waits for a later batch.
func TestWriterSameOrderTwiceInBatch(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 10)
	stateEnv(t, e, v, 9, map[int64]int64{5: 2201})
	stale := msg(1, 2201, 5, v)
	stale.Deliveries = 99
	out := handle(t, e.w, []mq.Message{stale, msg(2, 2201, 5, v)})
	if out[0] != mq.Ack || out[1] != mq.Retry {
		t.Fatalf("outcomes %v, want [Ack Retry]", out)
	}
}

// TestWriterStaleCopyOfReplayedLetter: a message whose letter was
// replayed comes again (still pending when its worker stopped after the
// give-back), beside or before the replay's message: it changes nothing,
// and the replay's message decides; the order ends as one order, its
// letter stays replayed. Both with the letter under its order id and kept
// by its message.
func TestWriterStaleCopyOfReplayedLetter(t *testing.T) {
	t.Parallel()
	for _, keyless := range []bool{false, true} {
		t.Run(fmt.Sprintf("kept_by_message=%v", keyless), func(t *testing.T) {
			t.Parallel()
			e := newWriterEnv(t)
			ctx := context.Background()
			id := int64(3101)
			v1, v := oneIDTwoBuyers(t, e, id)
			if keyless {
				handle(t, e.w, []mq.Message{msg(1, id, 1, v1)}) // buyer 1's letter holds the id
			}
			first := msg(2, id, 2, v)
			first.Deliveries = 99
			handle(t, e.w, []mq.Message{first}) // a letter, reservation given back
			d := deadLetterOf(t, e, 2, v)
			if (d.OrderID == nil) != keyless {
				t.Fatalf("dead letter %+v: kept by message %v, want %v", d, d.OrderID == nil, keyless)
			}
			if _, err := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys)).Replay(ctx, d.ID); err != nil {
				t.Fatalf("replay: %v", err)
			}
			first.Deliveries = 100 // the stale copy, reclaimed, still over its limit
			if out := handle(t, e.w, []mq.Message{first}); out[0] != mq.Ack {
				t.Fatalf("stale copy alone: outcome %v, want Ack", out[0])
			}
			// It gave nothing back: the replay's reservation stands.
			if stock, buyers := redisStock(t, e, v); stock != 9 || buyers["2"] != strconv.FormatInt(id, 10) {
				t.Fatalf("after the stale copy: redis stock %d buyers %v, want 9 and buyer 2", stock, buyers)
			}
			replay := msg(3, id, 2, v)
			if out := handle(t, e.w, []mq.Message{first, replay}); out[0] != mq.Ack || out[1] != mq.Retry {
				t.Fatalf("outcomes %v, want [Ack Retry]", out)
			}
			handle(t, e.w, []mq.Message{replay}) // back from the delay queue
			if s, o, _ := e.counts(t, v); s != 9 || o != 1 {
				t.Fatalf("stock %d orders %d, want 9 1", s, o)
			}
			if d := deadLetterOf(t, e, 2, v); d.ReplayedAt == nil {
				t.Fatalf("the order's letter is live again: %+v", d)
			}
			if stock, buyers := redisStock(t, e, v); stock != 9 || buyers["2"] != strconv.FormatInt(id, 10) {
				t.Fatalf("redis stock %d buyers %v, want 9 and buyer 2", stock, buyers)
			}
		})
	}
}
