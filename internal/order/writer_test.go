package order

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type writerEnv struct {
	db   *gorm.DB
	rdb  *redis.Client
	keys voucher.Keys
	w    *Writer
}

func newWriterEnv(t testing.TB) writerEnv {
	t.Helper()
	g, err := db.OpenMySQL(testenv.MySQLDSN(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	if _, err := schema.Apply(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	// The shard is ready, as after the service's warm-up: the writer
	// settles Redis only in a ready shard.
	if err := voucher.NewState(rdb, keys).MarkReady(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	return writerEnv{db: g, rdb: rdb, keys: keys, w: NewWriter(g, rdb, keys, WriterConfig{}, slog.New(slog.DiscardHandler))}
}

func (e writerEnv) voucher(t testing.TB, stock int) int64 {
	t.Helper()
	v := voucher.Voucher{Title: "t", TotalStock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(e.db).Create(context.Background(), &v); err != nil {
		t.Fatal(err)
	}
	return v.ID
}

func msg(id int, orderID, userID, voucherID int64) mq.Message {
	m := voucher.Message{OrderID: orderID, UserID: userID, VoucherID: voucherID, AcceptedAt: time.Now()}
	return mq.Message{Stream: "s", ID: "1-" + strconv.Itoa(id), Values: m.Encode()}
}

func (e writerEnv) counts(t *testing.T, voucherID int64) (stock, orders, dead int) {
	t.Helper()
	ctx := context.Background()
	if err := e.db.WithContext(ctx).Raw("SELECT stock FROM vouchers WHERE id = ?", voucherID).Scan(&stock).Error; err != nil {
		t.Fatal(err)
	}
	if err := e.db.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", voucherID).Scan(&orders).Error; err != nil {
		t.Fatal(err)
	}
	if err := e.db.WithContext(ctx).Raw("SELECT COUNT(*) FROM dead_letters WHERE voucher_id = ?", voucherID).Scan(&dead).Error; err != nil {
		t.Fatal(err)
	}
	return stock, orders, dead
}

func handle(t *testing.T, w *Writer, batch []mq.Message) []mq.Outcome {
	t.Helper()
	out, err := w.Handle(context.Background(), batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(batch) {
		t.Fatalf("%d outcomes for %d messages", len(out), len(batch))
	}
	return out
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

func TestWriterBatchAndReplay(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 10)
	batch := []mq.Message{msg(1, 501, 1, v), msg(2, 502, 2, v), msg(3, 503, 3, v)}
	for _, o := range handle(t, e.w, batch) {
		if o != mq.Ack {
			t.Fatalf("outcome %v, want Ack", o)
		}
	}
	if s, o, d := e.counts(t, v); s != 7 || o != 3 || d != 0 {
		t.Fatalf("after write: stock %d orders %d dead %d", s, o, d)
	}
	// A crash between commit and ack delivers the same batch again, with
	// a new message in it.
	replay := append(batch, msg(4, 504, 4, v))
	for _, o := range handle(t, e.w, replay) {
		if o != mq.Ack {
			t.Fatalf("replay outcome %v, want Ack", o)
		}
	}
	if s, o, d := e.counts(t, v); s != 6 || o != 4 || d != 0 {
		t.Fatalf("after replay: stock %d orders %d dead %d; want 6 4 0", s, o, d)
	}
}

func TestWriterPoisonMessageDeadLettered(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 5)
	poison := mq.Message{Stream: "s", ID: "1-9", Values: map[string]any{"v": "1", "order": "x"}}
	batch := []mq.Message{msg(1, 601, 1, v), poison, msg(2, 602, 2, v)}
	for range 2 { // the second time is a redelivery: nothing changes
		for _, o := range handle(t, e.w, batch) {
			if o != mq.Ack {
				t.Fatalf("outcome %v, want Ack", o)
			}
		}
		if s, o, _ := e.counts(t, v); s != 3 || o != 2 {
			t.Fatalf("stock %d orders %d; want 3 2", s, o)
		}
		var dead []DeadLetter
		if err := e.db.Where("message_id = ?", "1-9").Find(&dead).Error; err != nil || len(dead) != 1 || dead[0].Reason != ReasonUndecodable {
			t.Fatalf("dead letters %+v, %v", dead, err)
		}
	}
}

func TestWriterGuardsDeadLetter(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 2)
	// Three orders for a stock of two, a second order of buyer 1, and an
	// order for a voucher that does not exist: the guards turn the
	// fast path down and every message ends as an order or a dead letter.
	batch := []mq.Message{
		msg(1, 701, 1, v), msg(2, 702, 1, v), msg(3, 703, 2, v), msg(4, 704, 3, v), msg(5, 705, 4, v+1000),
	}
	for _, o := range handle(t, e.w, batch) {
		if o != mq.Ack {
			t.Fatalf("outcome %v, want Ack", o)
		}
	}
	if s, o, d := e.counts(t, v); s != 0 || o != 2 || d != 2 {
		t.Fatalf("stock %d orders %d dead %d; want 0 2 2", s, o, d)
	}
	st := NewStore(e.db)
	for id, reason := range map[int64]string{702: ReasonDuplicateBuyer, 704: ReasonOutOfStock, 705: ReasonUnknownVoucher} {
		d, err := st.DeadLetterOf(context.Background(), id)
		if err != nil || d.Reason != reason {
			t.Errorf("order %d: dead letter %+v, %v; want reason %s", id, d, err, reason)
		}
	}
	// Replaying the batch changes nothing: dead letters count as done.
	for i, o := range handle(t, e.w, batch) {
		if o != mq.Ack {
			t.Errorf("replay: message %d outcome %v, want Ack", i, o)
		}
	}
	if s, o, d := e.counts(t, v); s != 0 || o != 2 || d != 2 {
		t.Fatalf("after replay: stock %d orders %d dead %d", s, o, d)
	}
}

// TestConsumerRedeliversCommittedBatch runs the real consumer over a batch
// that was committed but never acknowledged (a crash before the ack): it
// is read again from the pending list, changes nothing, and is acked.
func TestConsumerRedeliversCommittedBatch(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	stream := e.keys.Stream(0)
	if err := mq.EnsureGroup(ctx, e.rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		m := voucher.Message{OrderID: int64(801 + i), UserID: int64(1 + i), VoucherID: v, AcceptedAt: time.Now()}
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: m.Encode()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The consumer that crashes: reads, commits, never acks.
	got, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c1", Streams: []string{stream, ">"}, Count: 10}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var batch []mq.Message
	for _, x := range got[0].Messages {
		batch = append(batch, mq.Message{Stream: stream, ID: x.ID, Values: x.Values})
	}
	handle(t, e.w, batch)

	// The same consumer name comes back: it reads its pending list first.
	cctx, cancel := context.WithCancel(ctx)
	c := mq.NewConsumer(e.rdb, mq.ConsumerConfig{Stream: stream, Group: "g", Consumer: "c1", Block: 50 * time.Millisecond},
		e.w, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	testenv.WaitFor(t, 10*time.Second, "the redelivered batch acked (nothing pending)", func() bool {
		p, err := e.rdb.XPending(ctx, stream, "g").Result()
		return err == nil && p.Count == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s, o, d := e.counts(t, v); s != 6 || o != 4 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 6 4 0", s, o, d)
	}
	if n, _ := e.rdb.XLen(ctx, stream).Result(); n != 0 {
		t.Fatalf("%d entries left in the stream; acked entries are deleted", n)
	}
}

// TestWriterStampede: 40 batches written at once, 400 messages for a stock
// of 50, a quarter of them second orders of a buyer who already has one:
// the database's guards decide. Exactly 50 orders, no buyer twice, stock
// 0, and every message ends as exactly one order or one dead letter.
func TestWriterStampede(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	const stock, batches, per = 50, 40, 10
	v := e.voucher(t, stock)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for b := range batches {
		batch := make([]mq.Message, per)
		for i := range batch {
			n := b*per + i
			user := int64(n%300 + 1) // messages 300-399 are second orders of users 1-100
			batch[i] = msg(n, int64(60_000+n), user, v)
		}
		wg.Go(func() {
			<-start
			// As the consumer does: a batch that failed (a deadlock
			// retried too often) is handled again.
			for range 10 {
				if out, err := e.w.Handle(context.Background(), batch); err == nil {
					for i, o := range out {
						if o != mq.Ack {
							t.Errorf("message %s: outcome %v, want Ack", batch[i].ID, o)
						}
					}
					return
				}
			}
			t.Errorf("batch %d never went through", b)
		})
	}
	close(start)
	wg.Wait()
	s, o, d := e.counts(t, v)
	if s != 0 || o != stock || o+d != batches*per {
		t.Fatalf("stock %d orders %d dead letters %d; want 0, %d, and %d in all", s, o, d, stock, batches*per)
	}
	var twice, both int64
	if err := e.db.Raw("SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE voucher_id = ? GROUP BY user_id HAVING COUNT(*) > 1) t", v).Scan(&twice).Error; err != nil {
		t.Fatal(err)
	}
	if err := e.db.Raw("SELECT COUNT(*) FROM orders o JOIN dead_letters d ON d.order_id = o.id WHERE o.voucher_id = ?", v).Scan(&both).Error; err != nil {
		t.Fatal(err)
	}
	if twice != 0 || both != 0 {
		t.Fatalf("%d buyers with two orders, %d orders also dead-lettered", twice, both)
	}
}
