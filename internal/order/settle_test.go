package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestWriterSettlesRedis: an order written after a rebuild of Redis missed
// it (it was in a worker's hands) is recorded in Redis by the writer: the
// buyer is held and the unit taken. While the shard is not ready, the
// writer does not ack and tries again later.
func TestWriterSettlesRedis(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	// The rebuilt state knows nothing of order 1201.
	stateEnv(t, e, v, 10, nil)
	handle(t, e.w, []mq.Message{msg(1, 1201, 7, v)})
	stock, buyers := redisStock(t, e, v)
	if stock != 9 || buyers["7"] != "1201" {
		t.Fatalf("after settle: redis stock %d buyers %v; want 9 and buyer 7 -> 1201", stock, buyers)
	}
	// Delivered again: nothing changes.
	handle(t, e.w, []mq.Message{msg(1, 1201, 7, v)})
	if stock, _ := redisStock(t, e, v); stock != 9 {
		t.Fatalf("a redelivery settled twice: stock %d", stock)
	}
	// A shard being rebuilt: the batch is written but not acked.
	if err := e.rdb.Del(ctx, e.keys.Ready(0)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.w.Handle(ctx, []mq.Message{msg(2, 1202, 8, v)}); !errors.Is(err, errNotReady) {
		t.Fatalf("handle during a rebuild: %v, want errNotReady", err)
	}
	if err := voucher.NewState(e.rdb, e.keys).MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	handle(t, e.w, []mq.Message{msg(2, 1202, 8, v)})
	if stock, buyers := redisStock(t, e, v); stock != 8 || buyers["8"] != "1202" {
		t.Fatalf("after the rebuild: redis stock %d buyers %v", stock, buyers)
	}
	if s, o, d := e.counts(t, v); s != 8 || o != 2 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 8 2 0", s, o, d)
	}
}

// stalled is a worker that began its batch's transaction and found m not
// yet written, then stalled: its item and open transaction.
func stalled(t *testing.T, e writerEnv, m mq.Message) (*item, *gorm.DB) {
	t.Helper()
	it := &item{msg: m}
	o, err := voucher.Decode(m.Values)
	if err != nil {
		t.Fatal(err)
	}
	it.ord = o
	tx := e.db.WithContext(context.Background()).Begin(e.w.txOptions())
	t.Cleanup(func() { tx.Rollback() })
	if err := e.w.decideFromMySQL(tx, []*item{it}); err != nil || it.v.effects().record == recordNothing {
		t.Fatalf("decide from mysql: %v, %v; want it to be recorded", it.v, err)
	}
	return it, tx
}

// TestWriterSeesConcurrentCommit: a worker that took over a message while
// its first worker was only stalled must see that worker's commit, not an
// older snapshot: the order ends as one order, never also a dead letter.
func TestWriterSeesConcurrentCommit(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 10)
	late, tx := stalled(t, e, msg(1, 1301, 9, v))
	// The other worker writes and commits the same order meanwhile.
	handle(t, e.w, []mq.Message{msg(1, 1301, 9, v)})
	// The stalled worker goes on the careful way: it must find the order.
	if err := e.w.insertOrLetter(tx, late, "m0"); err != nil {
		t.Fatal(err)
	}
	if late.v.reason != "" {
		t.Fatalf("the stalled worker dead-lettered a written order: %s", late.v.reason)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 9 1 0", s, o, d)
	}
}

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
	if err := e.w.insertOrLetter(tx, late, "m0"); err != nil {
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

// deadLetterOf returns the one dead letter of a buyer's message for a
// voucher.
func deadLetterOf(t *testing.T, e writerEnv, user, v int64) DeadLetter {
	t.Helper()
	var rows []DeadLetter
	if err := e.db.Where("user_id = ? AND voucher_id = ?", user, v).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Fatalf("user %d voucher %d: %d dead letters, want 1", user, v, len(rows))
	}
	return rows[0]
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
// committed under its nose: two dead letters, each with its own buyer.
func TestWriterIDClashAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v1, v2 := oneIDTwoBuyers(t, e, 1701)
	if err := e.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v2).Error; err != nil {
		t.Fatal(err)
	}
	late, tx := stalled(t, e, msg(1, 1701, 1, v1))             // buyer 1's worker has read, and stalls
	handle(t, e.w, []mq.Message{msg(2, 1701, 2, v2)})          // buyer 2: out of stock, committed
	if err := e.w.insertOrLetter(tx, late, "m0"); err != nil { // buyer 1: out of stock too
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ user, v int64 }{{1, v1}, {2, v2}} {
		if d := deadLetterOf(t, e, c.user, c.v); d.Reason != ReasonOutOfStock {
			t.Errorf("buyer %d: dead letter %+v, want out_of_stock", c.user, d)
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

// deadCounter counts the dead letters a writer reports as new.
type deadCounter struct {
	nopObserver
	mu   sync.Mutex
	dead map[string]int
}

func (o *deadCounter) DeadLettered(reason string) { o.mu.Lock(); o.dead[reason]++; o.mu.Unlock() }

// TestWriterDeadLetterRecordedMeanwhile: a stalled worker's message was
// dead-lettered by the worker that reclaimed it (over its delivery
// limit); the stalled one, finding no stock, keeps that letter and its
// reason and does not count it again.
func TestWriterDeadLetterRecordedMeanwhile(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	obs := &deadCounter{dead: map[string]int{}}
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Observer: obs}, slog.New(slog.DiscardHandler))
	v := e.voucher(t, 1)
	if err := e.db.Exec("UPDATE vouchers SET stock = 0 WHERE id = ?", v).Error; err != nil {
		t.Fatal(err)
	}
	stateEnv(t, e, v, 0, map[int64]int64{9: 2001})
	m := msg(1, 2001, 9, v)
	late, tx := stalled(t, e, m)
	over := m
	over.Deliveries = 99
	handle(t, w, []mq.Message{over}) // the reclaimer: delivery_limit, committed
	if err := w.insertOrLetter(tx, late, "m0"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	w.observeCommitted([]*item{late})
	if late.v.reason != ReasonDeliveryLimit {
		t.Errorf("the stalled worker's item has reason %q, want the letter's delivery_limit", late.v.reason)
	}
	if d := deadLetterOf(t, e, 9, v); d.Reason != ReasonDeliveryLimit {
		t.Errorf("dead letter %+v, want delivery_limit kept", d)
	}
	if obs.dead[ReasonDeliveryLimit] != 1 || len(obs.dead) != 1 {
		t.Errorf("dead letters counted %v, want one delivery_limit", obs.dead)
	}
}

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

// TestWriterRetriedTransactionDecidesAfresh: a transaction tried again
// (after a deadlock) starts from the reasons Handle gave, not from those
// the failed attempt found (no stock then need not mean no stock now).
func TestWriterRetriedTransactionDecidesAfresh(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 10)
	it, tx := stalled(t, e, msg(1, 2401, 3, v))
	it.v, it.idTaken = verdict{lettered, ReasonOutOfStock}, true // what a failed attempt left
	if err := e.w.decideFromMySQL(tx, []*item{it}); err != nil {
		t.Fatalf("decide from mysql: %v", err)
	}
	if it.v != (verdict{fate: inserted}) || it.idTaken {
		t.Fatalf("after deciding: verdict %v idTaken %v, want inserted and the id free", it.v, it.idTaken)
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

// TestWriterStalledWorkerFindsItsOrderWritten: a stalled worker finds no
// stock because the worker that took its message over wrote this very
// order with the last unit: the order is done, not also a dead letter.
func TestWriterStalledWorkerFindsItsOrderWritten(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 1)
	stateEnv(t, e, v, 0, map[int64]int64{9: 3001})
	m := msg(1, 3001, 9, v)
	late, tx := stalled(t, e, m)
	handle(t, e.w, []mq.Message{m}) // the other worker: the order, with the last unit
	if err := e.w.insertOrLetter(tx, late, "m0"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if late.v != (verdict{fate: written}) {
		t.Fatalf("stalled worker's item: verdict %v, want written and not counted", late.v)
	}
	if s, o, d := e.counts(t, v); s != 0 || o != 1 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 0 1 0", s, o, d)
	}
}

// TestWriterOrderAndLetterRace: two workers hold one message (one stalled,
// one that took it over). Whichever records second finds what the first
// committed: a letter found after the order insert wins over the order,
// an order found after the letter insert wins over the letter. Either way
// the message ends as exactly one thing.
func TestWriterOrderAndLetterRace(t *testing.T) {
	t.Parallel()
	t.Run("letter first", func(t *testing.T) {
		t.Parallel()
		e := newWriterEnv(t)
		v := e.voucher(t, 10)
		stateEnv(t, e, v, 9, map[int64]int64{4: 5001})
		m := msg(1, 5001, 4, v)
		late, tx := stalled(t, e, m)
		over := m
		over.Deliveries = 99
		handle(t, e.w, []mq.Message{over}) // the other worker: a letter, committed
		if err := tx.SavePoint("fast").Error; err != nil {
			t.Fatal(err)
		}
		if ok, err := e.w.insertAll(tx, []*item{late}); err != nil || ok {
			t.Fatalf("fast path: %v, %v; want a fall back to the careful way", ok, err)
		}
		if err := tx.RollbackTo("fast").Error; err != nil {
			t.Fatal(err)
		}
		if err := e.w.insertOrLetter(tx, late, "m0"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit().Error; err != nil {
			t.Fatal(err)
		}
		if late.v != (verdict{letterFound, ReasonDeliveryLimit}) {
			t.Fatalf("stalled item: verdict %v; want the letter's, not counted", late.v)
		}
		if s, o, d := e.counts(t, v); s != 10 || o != 0 || d != 1 {
			t.Fatalf("stock %d orders %d dead %d; want 10 0 1", s, o, d)
		}
	})
	t.Run("order first", func(t *testing.T) {
		t.Parallel()
		e := newWriterEnv(t)
		v := e.voucher(t, 10)
		stateEnv(t, e, v, 9, map[int64]int64{4: 5002})
		m := msg(1, 5002, 4, v)
		late, tx := stalled(t, e, m)
		late.v = verdict{lettered, ReasonDeliveryLimit} // as Handle gives a message over its limit
		handle(t, e.w, []mq.Message{m})                 // the other worker: the order, committed
		if err := e.w.deadLetter(tx, late); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit().Error; err != nil {
			t.Fatal(err)
		}
		if late.v != (verdict{fate: written}) {
			t.Fatalf("stalled item: verdict %v; want written, not counted", late.v)
		}
		if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 0 {
			t.Fatalf("stock %d orders %d dead %d; want 9 1 0", s, o, d)
		}
	})
}

// TestSettleTakesOverRepurchase: after Redis restarted empty and was
// rebuilt while a worker held buyer 7's order 2001, the buyer bought again
// (order 2002 accepted). The database keeps one of the two as the order,
// the other becomes a duplicate_buyer dead letter, and Redis ends agreeing
// with it: one unit taken, the buyer entry naming the written order,
// nothing pending. Whichever is written first, alone or in one batch.
func TestSettleTakesOverRepurchase(t *testing.T) {
	t.Parallel()
	const held, again = 2001, 2002
	for _, tc := range []struct {
		name    string
		batches [][]int64 // order ids, as handed to the writer
		written int64     // the one that ends as the order
		// rebuilt: the shard is rebuilt again after the repurchase, from
		// the database and the pending index.
		rebuilt bool
	}{
		{"held order first", [][]int64{{held}, {again}}, held, false},
		{"repurchase first", [][]int64{{again}, {held}}, again, false},
		{"one batch, held order first", [][]int64{{held, again}}, held, false},
		{"one batch, repurchase first", [][]int64{{again, held}}, again, false},
		{"rebuilt, then held order first", [][]int64{{held}, {again}}, held, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newWriterEnv(t)
			ctx := context.Background()
			v := e.voucher(t, 10)
			stateEnv(t, e, v, 10, nil) // rebuilt: knows nothing of order 2001
			if _, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, again); err != nil {
				t.Fatal(err)
			}
			if tc.rebuilt {
				if err := e.rdb.Del(ctx, e.keys.Ready(0)).Err(); err != nil {
					t.Fatal(err)
				}
				warmer := voucher.NewWarmer(voucher.NewStore(e.db), voucher.NewState(e.rdb, e.keys), NewStore(e.db), e.keys, time.Hour, slog.New(slog.DiscardHandler))
				if _, err := warmer.Warm(ctx); err != nil {
					t.Fatal(err)
				}
				if stock, buyers := redisStock(t, e, v); stock != 9 || buyers["7"] != strconv.Itoa(again) {
					t.Fatalf("rebuilt: redis stock %d buyers %v; want 9 and buyer 7 -> %d", stock, buyers, again)
				}
			}
			n := 0
			for _, ids := range tc.batches {
				var batch []mq.Message
				for _, id := range ids {
					n++
					batch = append(batch, msg(n, id, 7, v))
				}
				for _, o := range handle(t, e.w, batch) {
					if o != mq.Ack {
						t.Fatalf("outcome %v, want Ack", o)
					}
				}
			}
			if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 1 {
				t.Fatalf("stock %d orders %d dead %d; want 9 1 1", s, o, d)
			}
			if _, err := NewStore(e.db).Get(ctx, tc.written); err != nil {
				t.Fatalf("order %d: %v", tc.written, err)
			}
			stock, buyers := redisStock(t, e, v)
			if stock != 9 || len(buyers) != 1 || buyers["7"] != strconv.FormatInt(tc.written, 10) {
				t.Fatalf("redis stock %d buyers %v; want 9 and buyer 7 -> %d", stock, buyers, tc.written)
			}
			if n, err := e.rdb.HLen(ctx, e.keys.Pending(0)).Result(); err != nil || n != 0 {
				t.Fatalf("%d orders still pending (%v), want 0", n, err)
			}
			_, err := voucher.NewReserver(e.rdb, e.keys).Reserve(ctx, v, 7, 2003)
			if p := (*voucher.PurchasedError)(nil); !errors.As(err, &p) || p.OrderID != tc.written {
				t.Fatalf("buyer 7 buys a third time: %v, want already purchased (order %d)", err, tc.written)
			}
		})
	}
}
