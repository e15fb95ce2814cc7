package order

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

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

// letteredWhileStalled stalls a worker on m (decided, not yet recorded),
// lets w reclaim m past its delivery limit and dead-letter it (committed),
// then lets the stalled worker record and commit its item through w, and
// returns that item.
func letteredWhileStalled(t *testing.T, e writerEnv, w *Writer, m mq.Message) *item {
	t.Helper()
	late, tx := stalled(t, e, m)
	over := m
	over.Deliveries = 99
	handle(t, w, []mq.Message{over}) // the reclaimer: delivery_limit, committed
	if err := w.recordEach(tx, []*item{late}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit().Error; err != nil {
		t.Fatal(err)
	}
	w.observeCommitted([]*item{late})
	return late
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
	if err := e.w.recordEach(tx, []*item{late}); err != nil {
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
	late := letteredWhileStalled(t, e, w, msg(1, 2001, 9, v))
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
	if err := e.w.recordEach(tx, []*item{late}); err != nil {
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
		if ok, err := e.w.insertAll(tx, []*item{late}, counts{}); err != nil || ok {
			t.Fatalf("fast path: %v, %v; want a fall back to the careful way", ok, err)
		}
		if err := tx.RollbackTo("fast").Error; err != nil {
			t.Fatal(err)
		}
		if err := e.w.recordEach(tx, []*item{late}); err != nil {
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
		late.read, late.v = readDeliveryLimit, verdict{lettered, ReasonDeliveryLimit} // as Handle gives a message over its limit
		handle(t, e.w, []mq.Message{m})                                               // the other worker: the order, committed
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
