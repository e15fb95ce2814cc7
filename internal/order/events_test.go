package order

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

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
	ref := voucher.NewRefusals(e.rdb, e.keys, voucher.RefusalsConfig{TTL: time.Hour}, log)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = ref.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testenv.WaitFor(t, 5*time.Second, "events subscription", func() bool { return ref.Subscriptions() > 0 })

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
