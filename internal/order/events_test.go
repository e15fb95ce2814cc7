package order

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// listening is an instance's Refusals, subscribed to the events of e's
// Redis and remembering for an hour: only an event makes it forget.
func listening(t *testing.T, e writerEnv) *voucher.Refusals {
	t.Helper()
	ref := voucher.NewRefusals(e.rdb, e.keys, voucher.RefusalsConfig{TTL: time.Hour}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = ref.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 5*time.Second, "events subscription", func() bool { return ref.Subscriptions() > 0 })
	return ref
}

// TestDeadLetterAnnouncedToRefusals: an instance that remembers a voucher
// as sold out (for an hour: only the event can make it forget) and a buyer
// as holding an order learns from the writer's give-back of that order's
// dead letter that both changed: the buyer buys again through it.
func TestDeadLetterAnnouncedToRefusals(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 1)
	stateEnv(t, e, v, 1, nil)
	log := slog.New(slog.DiscardHandler)
	ref := listening(t, e)

	res := voucher.NewReserver(e.rdb, e.keys)
	buy := func(user, order int64) error {
		m := ref.Mark()
		r, err := res.Reserve(ctx, v, user, order)
		ref.Learn(m, v, user, r, err)
		return err
	}
	if err := buy(7, 9001); err != nil {
		t.Fatal(err)
	}
	_ = buy(8, 9002) // sold out, remembered
	if ref.Lookup(v, 7) == nil || ref.Lookup(v, 8) == nil {
		t.Fatal("refusals not remembered")
	}
	dead := msg(1, 9001, 7, v)
	dead.Deliveries = 99 // delivery_limit: the unit given back
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Events: voucher.NewEvents(e.rdb, e.keys, log)}, log)
	handle(t, w, []mq.Message{dead})
	testenv.WaitFor(t, 2*time.Second, "the give-back heard", func() bool {
		return ref.Lookup(v, 7) == nil && ref.Lookup(v, 8) == nil
	})
	if err := buy(7, 9003); err != nil {
		t.Fatalf("buyer of the dead letter buys again: %v", err)
	}
}

// TestWrittenAnnouncedToRefusals: an instance that never heard of a
// buyer's order (its announcement lost) refuses that buyer sold_out from
// memory; once the writer writes the order, the instance asks Redis about
// the buyer again and answers already_purchased with the order.
func TestWrittenAnnouncedToRefusals(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 1)
	stateEnv(t, e, v, 1, nil)
	log := slog.New(slog.DiscardHandler)
	ref := listening(t, e)

	res := voucher.NewReserver(e.rdb, e.keys)
	buy := func(user, order int64) error {
		m := ref.Mark()
		r, err := res.Reserve(ctx, v, user, order)
		ref.Learn(m, v, user, r, err)
		return err
	}
	// Bought elsewhere, never announced here.
	if _, err := res.Reserve(ctx, v, 7, 9001); err != nil {
		t.Fatal(err)
	}
	if err := buy(8, 9002); !errors.Is(err, voucher.ErrSoldOut) {
		t.Fatalf("buyer 8: %v, want sold out", err)
	}
	if err := ref.Lookup(v, 7); !errors.Is(err, voucher.ErrSoldOut) {
		t.Fatalf("unknown buyer 7: %v, want sold out from memory", err)
	}
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Events: voucher.NewEvents(e.rdb, e.keys, log)}, log)
	handle(t, w, []mq.Message{msg(1, 9001, 7, v)})
	testenv.WaitFor(t, 2*time.Second, "the written order heard", func() bool { return ref.Lookup(v, 7) == nil })
	if !errors.Is(ref.Lookup(v, 8), voucher.ErrSoldOut) {
		t.Fatal("the voucher's sold out forgotten for other buyers")
	}
	var held *voucher.PurchasedError
	if err := buy(7, 9003); !errors.As(err, &held) || held.OrderID != 9001 {
		t.Fatalf("buyer 7 asks again: %v, want already purchased 9001", err)
	}
	if err := ref.Lookup(v, 7); !errors.As(err, &held) || held.OrderID != 9001 {
		t.Fatalf("buyer 7 from memory: %v, want already purchased 9001", err)
	}
}

// TestGiveBackAnnouncedWhenAnotherFails: two dead letters in one batch,
// one of whose give-backs fails (its buyers key was overwritten with
// another type). That message is left pending, to be tried again, and the
// give-back Redis did make is acked and announced at once: the instances
// need not wait for the retry.
func TestGiveBackAnnouncedWhenAnotherFails(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	ok, broken := e.voucher(t, 1), e.voucher(t, 1)
	stateEnv(t, e, ok, 1, nil)
	stateEnv(t, e, broken, 1, nil)
	log := slog.New(slog.DiscardHandler)
	ref := listening(t, e)

	res := voucher.NewReserver(e.rdb, e.keys)
	for _, p := range []struct{ v, user, order int64 }{{ok, 7, 9101}, {broken, 8, 9102}} {
		m := ref.Mark()
		r, err := res.Reserve(ctx, p.v, p.user, p.order)
		ref.Learn(m, p.v, p.user, r, err)
		if err != nil {
			t.Fatal(err)
		}
	}
	if ref.Lookup(ok, 7) == nil {
		t.Fatal("the buyer's order not remembered")
	}
	if err := e.rdb.Set(ctx, e.keys.Buyers(broken), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	first, second := msg(1, 9101, 7, ok), msg(2, 9102, 8, broken)
	first.Deliveries, second.Deliveries = 99, 99 // delivery_limit: both given back
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Events: voucher.NewEvents(e.rdb, e.keys, log)}, log)
	out, err := w.Handle(ctx, []mq.Message{first, second})
	if err != nil || len(out) != 2 || out[0] != mq.Ack || out[1] != mq.LeavePending {
		t.Fatalf("a batch with a failed give-back: outcomes %v, %v; want the good one acked, the bad one left pending", out, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the give-back Redis made heard", func() bool { return ref.Lookup(ok, 7) == nil })
}
