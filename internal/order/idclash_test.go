package order

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestWriterIDCollision: a message whose order id already belongs to
// another buyer's order (ids minted twice) is not taken as written: it
// becomes a dead letter, its buyer's reservation is given back, and the
// other order stays as it was. Both ways of finding it: before the insert,
// and through the insert's duplicate key when the other order was
// committed meanwhile.
func TestWriterIDCollision(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	// Redis reserved units for buyers 1, 2 and 3; 1's order is written
	// with id 1401, then 2's and 3's messages come with the same id and
	// with 1402 (which buyer 4's order takes meanwhile).
	stateEnv(t, e, v, 7, map[int64]int64{1: 1401, 2: 1401, 3: 1402})
	handle(t, e.w, []mq.Message{msg(1, 1401, 1, v)})

	if out := handle(t, e.w, []mq.Message{msg(2, 1401, 2, v)}); out[0] != mq.Ack {
		t.Fatalf("outcome %v, want Ack (dead letter)", out[0])
	}

	late, tx := stalled(t, e, msg(3, 1402, 3, v))
	handle(t, e.w, []mq.Message{msg(4, 1402, 4, v)}) // another buyer's order, same id
	if err := e.w.recordEach(tx, []*item{late}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if err := e.w.giveBack(ctx, []*item{late}); err != nil {
		t.Fatal(err)
	}

	for _, user := range []int64{2, 3} {
		d := deadLetterOf(t, e, user, v)
		if d.Reason != ReasonIDCollision || d.OrderID != nil {
			t.Errorf("user %d: dead letter %+v; want id_collision, recorded without the order id", user, d)
		}
	}
	// A redelivery of a collision changes nothing.
	if out := handle(t, e.w, []mq.Message{msg(2, 1401, 2, v)}); out[0] != mq.Ack {
		t.Fatalf("redelivery: outcome %v, want Ack", out[0])
	}
	var owners []orderOwner
	if err := e.db.Raw("SELECT id, user_id, voucher_id FROM orders WHERE voucher_id = ? ORDER BY id", v).Scan(&owners).Error; err != nil {
		t.Fatal(err)
	}
	if want := []orderOwner{{1401, 1, v}, {1402, 4, v}}; !slices.Equal(owners, want) {
		t.Fatalf("orders %v, want %v", owners, want)
	}
	if s, o, d := e.counts(t, v); s != 8 || o != 2 || d != 2 {
		t.Fatalf("stock %d orders %d dead %d; want 8 2 2", s, o, d)
	}
	stock, buyers := redisStock(t, e, v)
	// The id is taken: such a dead letter is not sent again (its buyer
	// may buy again under a new id).
	d := deadLetterOf(t, e, 2, v)
	if _, err := NewDeadLetters(e.db, voucher.NewReserver(e.rdb, e.keys)).Replay(ctx, d.ID); !errors.Is(err, ErrNotReplayable) {
		t.Fatalf("replay of an id collision: %v, want ErrNotReplayable", err)
	}
	// Buyer 4's order was settled into Redis by the writer; 2 and 3 got
	// their units back. Redis agrees with MySQL: 8 left.
	if stock != 8 || len(buyers) != 2 || buyers["1"] != "1401" || buyers["4"] != "1402" {
		t.Fatalf("redis stock %d buyers %v; want 8 and buyers 1 and 4", stock, buyers)
	}
}

// oneIDTwoBuyers is an order id minted twice: Redis reserved voucher v1
// (whose MySQL stock is gone) for buyer 1 and voucher v2 (stock 10) for
// buyer 2, both under order id id.
func oneIDTwoBuyers(t *testing.T, e writerEnv, id int64) (v1, v2 int64) {
	t.Helper()
	v1, v2 = e.voucher(t, 1), e.voucher(t, 10)
	if err := e.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v1).Error; err != nil {
		t.Fatal(err)
	}
	stateEnv(t, e, v1, 0, map[int64]int64{1: id})
	stateEnv(t, e, v2, 9, map[int64]int64{2: id})
	return v1, v2
}

// TestWriterIDOfAnotherDeadLetter: an order id that only another buyer's
// dead letter holds is free among orders: the message becomes an order,
// and the other buyer's dead letter stays as it was.
func TestWriterIDOfAnotherDeadLetter(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v1, v2 := oneIDTwoBuyers(t, e, 1501)
	handle(t, e.w, []mq.Message{msg(1, 1501, 1, v1)}) // out of stock in MySQL: a dead letter
	for range 2 {                                     // the second time is a redelivery
		if out := handle(t, e.w, []mq.Message{msg(2, 1501, 2, v2)}); out[0] != mq.Ack {
			t.Fatalf("outcome %v, want Ack", out[0])
		}
	}
	if s, o, d := e.counts(t, v2); s != 9 || o != 1 || d != 0 {
		t.Fatalf("voucher 2: stock %d orders %d dead %d; want 9 1 0", s, o, d)
	}
	if d := deadLetterOf(t, e, 1, v1); d.Reason != ReasonOutOfStock || d.OrderID == nil || *d.OrderID != 1501 {
		t.Fatalf("buyer 1's dead letter changed: %+v", d)
	}
	if stock, buyers := redisStock(t, e, v2); stock != 9 || buyers["2"] != "1501" {
		t.Fatalf("voucher 2 in redis: stock %d buyers %v; want 9 and buyer 2", stock, buyers)
	}
}

// TestWriterIDClashInOneBatch: two buyers' messages with one order id in
// one batch: the first is decided (here a dead letter: no MySQL stock),
// the second waits for a later batch, which writes it as an order. Each
// ends as exactly one thing, each recorded for its own buyer.
func TestWriterIDClashInOneBatch(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v1, v2 := oneIDTwoBuyers(t, e, 1601)
	out := handle(t, e.w, []mq.Message{msg(1, 1601, 1, v1), msg(2, 1601, 2, v2)})
	if out[0] != mq.Ack || out[1] != mq.Retry {
		t.Fatalf("outcomes %v, want [Ack Retry]", out)
	}
	if out := handle(t, e.w, []mq.Message{msg(3, 1601, 2, v2)}); out[0] != mq.Ack {
		t.Fatalf("later batch: outcome %v, want Ack", out[0])
	}
	if d := deadLetterOf(t, e, 1, v1); d.Reason != ReasonOutOfStock {
		t.Fatalf("buyer 1: dead letter %+v, want out_of_stock", d)
	}
	var owners []orderOwner
	if err := e.db.Raw("SELECT id, user_id, voucher_id FROM orders WHERE id = 1601").Scan(&owners).Error; err != nil {
		t.Fatal(err)
	}
	if want := []orderOwner{{1601, 2, v2}}; !slices.Equal(owners, want) {
		t.Fatalf("orders %v, want %v", owners, want)
	}
}

// TestWriterIDClashAcrossWorkers: two workers each dead-letter one of two
// buyers' messages that share an order id, the second after the first
// committed under its nose: two dead letters, each with its own buyer;
// the unique key on order_id leaves the id to the first, and the second
// is kept by its message.
func TestWriterIDClashAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v1, v2 := oneIDTwoBuyers(t, e, 1701)
	if err := e.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v2).Error; err != nil {
		t.Fatal(err)
	}
	late, tx := stalled(t, e, msg(1, 1701, 1, v1))            // buyer 1's worker has read, and stalls
	handle(t, e.w, []mq.Message{msg(2, 1701, 2, v2)})         // buyer 2: out of stock, committed
	if err := e.w.recordEach(tx, []*item{late}); err != nil { // buyer 1: out of stock too
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, v int64
		holdsID bool
	}{{1, v1, false}, {2, v2, true}} {
		d := deadLetterOf(t, e, c.user, c.v)
		if d.Reason != ReasonOutOfStock || (d.OrderID != nil) != c.holdsID {
			t.Errorf("buyer %d: dead letter %+v, want out_of_stock, holding the order id: %v", c.user, d, c.holdsID)
		}
	}
}

// TestWriterIDClashBeforeDeliveryLimit: a message over its delivery
// limit whose order id another message of the batch has for another
// buyer also waits for a later batch, and then keeps its own reason.
func TestWriterIDClashBeforeDeliveryLimit(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v1, v2 := oneIDTwoBuyers(t, e, 1801)
	over := msg(2, 1801, 2, v2)
	over.Deliveries = 99
	if out := handle(t, e.w, []mq.Message{msg(1, 1801, 1, v1), over}); out[0] != mq.Ack || out[1] != mq.Retry {
		t.Fatalf("outcomes %v, want [Ack Retry]", out)
	}
	over.ID = "1-3" // back from the delay queue (still over the limit here)
	handle(t, e.w, []mq.Message{over})
	if d := deadLetterOf(t, e, 2, v2); d.Reason != ReasonDeliveryLimit {
		t.Fatalf("buyer 2: dead letter %+v, want delivery_limit", d)
	}
}

// TestWriterMessageLetteredOnce: a message kept by its message (another
// buyer's letter holds its order id) is dead-lettered by the worker that
// reclaimed it while its first worker, stalled, was about to do the same:
// the unique key on (stream, message_id) refuses the second letter, and
// the stalled worker keeps the first one's reason, counted once.
func TestWriterMessageLetteredOnce(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	obs := &deadCounter{dead: map[string]int{}}
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Observer: obs}, slog.New(slog.DiscardHandler))
	v1, v2 := oneIDTwoBuyers(t, e, 2101)
	handle(t, w, []mq.Message{msg(1, 2101, 1, v1)}) // out of stock: buyer 1's letter holds the id
	if err := e.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v2).Error; err != nil {
		t.Fatal(err)
	}
	m := msg(2, 2101, 2, v2)
	late := letteredWhileStalled(t, e, w, m) // out of stock, to be kept by its message
	var letters int64
	if err := e.db.Raw("SELECT COUNT(*) FROM dead_letters WHERE stream = ? AND message_id = ?", m.Stream, m.ID).Scan(&letters).Error; err != nil {
		t.Fatal(err)
	}
	if letters != 1 {
		t.Fatalf("%d dead letters of the message, want 1", letters)
	}
	if d := deadLetterOf(t, e, 2, v2); d.Reason != ReasonDeliveryLimit || d.OrderID != nil {
		t.Errorf("dead letter %+v, want delivery_limit kept by its message", d)
	}
	if late.v.reason != ReasonDeliveryLimit {
		t.Errorf("the stalled worker's item has reason %q, want the letter's delivery_limit", late.v.reason)
	}
	if obs.dead[ReasonOutOfStock] != 1 || obs.dead[ReasonDeliveryLimit] != 1 || len(obs.dead) != 2 {
		t.Errorf("dead letters counted %v, want buyer 1's out_of_stock and one delivery_limit", obs.dead)
	}
}
