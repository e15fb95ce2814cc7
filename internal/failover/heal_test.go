package failover

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/idgen"
	"seckill/internal/mq"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

// rig is one test's sale: a database and a Redis of its own (key prefix),
// a voucher on sale in both, and the worker's writer.
type rig struct {
	db   *gorm.DB
	rdb  redis.UniversalClient
	keys voucher.Keys
	v    voucher.Voucher
	life *order.Lifecycle
	w    *order.Writer
	obs  *counted
	next int64
}

// counted hears how many orders the writer wrote, and healed.
type counted struct {
	written, healed atomic.Int64
}

func (c *counted) Batch(int, time.Duration) {}
func (c *counted) Written(n int)            { c.written.Add(int64(n)) }
func (c *counted) Healed(n int)             { c.healed.Add(int64(n)) }
func (c *counted) DeadLettered(string)      {}
func (c *counted) LockConflicts(int)        {}
func (c *counted) RedisError(string)        {}
func (c *counted) MySQLError(string)        {}

func newRig(t *testing.T, dialect string, price int64, stock int) *rig {
	t.Helper()
	ctx := context.Background()
	g := testenv.DB(t, dialect)
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	r := &rig{db: g, rdb: testenv.Redis(t), keys: voucher.NewKeys(testenv.Prefix(t), 1), obs: &counted{}}
	// Ids as the service makes them: an id names when it was accepted.
	r.next = time.Since(idgen.Epoch).Milliseconds() << 22
	r.life = order.NewLifecycle(g, r.rdb, r.keys, order.LifecycleConfig{}, quiet)
	r.w = order.NewWriter(g, r.rdb, r.keys, order.WriterConfig{PayWindow: time.Hour, Observer: r.obs, Expiries: order.NewExpiries(r.rdb, r.keys)}, quiet)
	r.v = voucher.Voucher{Title: "t", FaceValue: 5000, Price: price, TotalStock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &r.v); err != nil {
		t.Fatal(err)
	}
	st := voucher.NewState(r.rdb, r.keys)
	if _, err := st.Load(ctx, r.v, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	return r
}

// buy makes user's purchase in Redis, as the API does, and returns its
// order id; it is on the stream, not written.
func (r *rig) buy(t *testing.T, user int64) int64 {
	t.Helper()
	r.next++
	if _, err := voucher.NewReserver(r.rdb, r.keys).Reserve(context.Background(), r.v.ID, user, r.next); err != nil {
		t.Fatalf("user %d buys: %v", user, err)
	}
	return r.next
}

// drain hands every message on the stream to the writer and deletes it,
// as the worker acknowledges it.
func (r *rig) drain(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	stream := r.keys.Stream(0)
	es, err := r.rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) == 0 {
		return
	}
	batch := make([]mq.Message, len(es))
	for i, e := range es {
		batch[i] = mq.Message{Stream: stream, ID: e.ID, Values: e.Values, Deliveries: 1}
	}
	outcomes, err := r.w.Handle(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outcomes {
		if o != mq.Ack {
			t.Fatalf("message %s: outcome %v", batch[i].ID, o)
		}
		if err := r.rdb.XDel(ctx, stream, batch[i].ID).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// lose takes orders out of the database as a failover to a replica that
// never received them does: the rows gone, their units back in the stock,
// the counters as they were before.
func (r *rig) lose(t *testing.T, ids ...int64) {
	t.Helper()
	res := r.db.Exec("DELETE FROM orders WHERE id IN ?", ids)
	if res.Error != nil || res.RowsAffected != int64(len(ids)) {
		t.Fatalf("lose %v: %v (%d rows)", ids, res.Error, res.RowsAffected)
	}
	if err := r.db.Exec("UPDATE vouchers SET stock = stock + ? WHERE id = ?", len(ids), r.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	r.recount(t)
}

// unend puts an ended order back as it was before its end, awaiting
// payment (a failover lost the end).
func (r *rig) unend(t *testing.T, id int64) {
	t.Helper()
	res := r.db.Exec("UPDATE orders SET status = 'awaiting_payment', live = 1, cancelled_at = NULL, cancel_reason = NULL, unit_back_at = NULL WHERE id = ? AND live IS NULL", id)
	if res.Error != nil || res.RowsAffected != 1 {
		t.Fatalf("unend %d: %v (%d rows)", id, res.Error, res.RowsAffected)
	}
	if err := r.db.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ?", r.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	r.recount(t)
}

func (r *rig) recount(t *testing.T) {
	t.Helper()
	if _, err := order.RecountAll(context.Background(), r.db); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) status(t *testing.T, id int64) string {
	t.Helper()
	var st string
	if err := r.db.Raw("SELECT status FROM orders WHERE id = ?", id).Scan(&st).Error; err != nil {
		t.Fatal(err)
	}
	return st
}

// stocks are the voucher's stock in the database and in Redis.
func (r *rig) stocks(t *testing.T) (dbStock, redisStock int64) {
	t.Helper()
	if err := r.db.Raw("SELECT stock FROM vouchers WHERE id = ?", r.v.ID).Scan(&dbStock).Error; err != nil {
		t.Fatal(err)
	}
	n, err := r.rdb.HGet(context.Background(), r.keys.State(r.v.ID), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	return dbStock, n
}

func (r *rig) healer() *Healer { return NewHealer(r.db, r.rdb, r.keys, r.life, nil, quiet) }

// TestHealWritesBackWhatTheDatabaseLost, on MariaDB and SQLite: of six
// written orders the database loses three; a seventh is on its way (on
// the stream, pending), an eighth was dead-lettered; a ninth buyer holds
// in Redis an order the database lost and in the database another live
// one. The heal queues the three lost orders again, and only them; the
// worker writes them with their ids, buyers and acceptance times (their
// ids'), counted as healed; the stock agrees with Redis again. A second
// heal finds nothing to do.
func TestHealWritesBackWhatTheDatabaseLost(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := newRig(t, dialect, 0, 20)
			var ids []int64
			for u := range int64(6) {
				ids = append(ids, r.buy(t, 100+u))
			}
			conflicted := r.buy(t, 109)
			r.drain(t)
			lost := []int64{ids[1], ids[3], ids[5]}
			r.lose(t, append(slices.Clone(lost), conflicted)...)
			// Buyer 109's order lost, and another of theirs in the
			// database (as if written by hand).
			if err := r.db.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live, amount, paid_at) VALUES (?, 109, ?, ?, ?, 'paid', 1, 0, ?)",
				conflicted+1000, r.v.ID, time.Now(), time.Now(), time.Now()).Error; err != nil {
				t.Fatal(err)
			}
			if err := r.db.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ?", r.v.ID).Error; err != nil {
				t.Fatal(err)
			}
			pending := r.buy(t, 107) // on the stream, not written
			lettered := r.buy(t, 108)
			if err := r.db.Exec("INSERT INTO dead_letters (stream, message_id, order_id, user_id, voucher_id, reason, payload, created_at) VALUES ('s', 'x-1', ?, 108, ?, 'out_of_stock', '{}', ?)",
				lettered, r.v.ID, time.Now()).Error; err != nil {
				t.Fatal(err)
			}
			if err := r.rdb.HDel(ctx, r.keys.Pending(0), strconv.FormatInt(lettered, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			if err := r.rdb.XTrimMaxLen(ctx, r.keys.Stream(0), 0).Err(); err != nil {
				t.Fatal(err)
			}
			// The pending order goes back on the stream alone.
			if err := r.rdb.XAdd(ctx, &redis.XAddArgs{Stream: r.keys.Stream(0), Values: voucher.Message{OrderID: pending, UserID: 107, VoucherID: r.v.ID, AcceptedAt: time.Now()}.Encode()}).Err(); err != nil {
				t.Fatal(err)
			}

			rep, err := r.healer().Heal(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids64(rep.Requeued), lost) || len(rep.Failed) != 0 {
				t.Fatalf("requeued %v (failed %v); want %v", rep.Requeued, rep.Failed, lost)
			}
			var why []int64
			for _, l := range rep.Left {
				why = append(why, l.OrderID)
			}
			if slices.Sort(why); !slices.Equal(why, []int64{conflicted, lettered}) {
				t.Fatalf("left %+v; want orders %d (lettered) and %d (conflict)", rep.Left, lettered, conflicted)
			}
			r.drain(t)
			if got := r.obs.healed.Load(); got != 3 {
				t.Fatalf("writer counted %d healed; want 3", got)
			}
			for _, id := range lost {
				var o order.Order
				if err := r.db.Where("id = ?", id).Take(&o).Error; err != nil {
					t.Fatalf("lost order %d not written back: %v", id, err)
				}
				if want := idgen.Time(id); !o.AcceptedAt.Equal(want) || o.VoucherID != r.v.ID || o.Status != order.StatusPaid {
					t.Fatalf("order %d written back as %+v; want accepted at %v", id, o, want)
				}
			}
			if got := r.status(t, pending); got != order.StatusPaid {
				t.Fatalf("the pending order is %q once written", got)
			}
			// Every order Redis holds, but the two left, is written once.
			var n int64
			if err := r.db.Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", r.v.ID).Scan(&n).Error; err != nil {
				t.Fatal(err)
			}
			if n != 8 {
				t.Fatalf("%d orders; want 8 (6 written, the pending one, the buyer's other)", n)
			}
			again, err := r.healer().Heal(ctx, nil)
			if err != nil || len(again.Requeued) != 0 {
				t.Fatalf("a second heal requeued %v, %v", again.Requeued, err)
			}
		})
	}
}

// TestHealWritesBackLostEnds: a priced voucher; of four orders, one is
// cancelled by its buyer (who buys again), one expires, one is paid and
// refunded, and the database loses the three ends (it holds them awaiting
// payment or paid again, their units taken) and the second purchase. The
// heal writes each end again as Redis recorded it (the refund owes the
// payment back), then the second purchase, and the stock agrees with
// Redis. An order whose end and whose writing were both lost is left, and
// the fourth, untouched, stays awaiting payment.
func TestHealWritesBackLostEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newRig(t, "mariadb", 100, 10)
	cancelled, expired, refunded, untouched, gone := r.buy(t, 1), r.buy(t, 2), r.buy(t, 3), r.buy(t, 4), r.buy(t, 5)
	r.drain(t)
	if _, _, err := r.life.Do(ctx, order.Cancel, cancelled); err != nil {
		t.Fatal(err)
	}
	// The buyer of the cancelled order buys again.
	rebought := r.buy(t, 1)
	r.drain(t)
	if err := r.db.Exec("UPDATE orders SET pay_deadline = ? WHERE id = ?", time.Now().Add(-time.Minute), expired).Error; err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.life.Do(ctx, order.Expire, expired); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.life.Do(ctx, order.Pay, refunded); err != nil {
		t.Fatal(err)
	}
	if err := r.db.Exec("INSERT INTO payments (order_id, provider, reference, amount, status, created_at, updated_at, succeeded_at) VALUES (?, 'dev', 'r1', 100, 'succeeded', ?, ?, ?)",
		refunded, time.Now(), time.Now(), time.Now()).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := NewHealer(r.db, r.rdb, r.keys, r.life, nil, quiet).refunds.Refund(ctx, refunded); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.life.Do(ctx, order.Cancel, gone); err != nil {
		t.Fatal(err)
	}
	dbStock, redisStock := r.stocks(t)
	if dbStock != redisStock {
		t.Fatalf("before the loss: stock %d in the database, %d in redis", dbStock, redisStock)
	}

	// The database loses the second purchase and every end: its buyer
	// holds the cancelled order live there again, which the second
	// purchase would meet unless the end is written back first.
	r.lose(t, rebought)
	r.unend(t, cancelled)
	r.unend(t, expired)
	r.unend(t, refunded)
	if err := r.db.Exec("UPDATE orders SET status = 'paid', paid_at = ? WHERE id = ?", time.Now(), refunded).Error; err != nil {
		t.Fatal(err)
	}
	if err := r.db.Exec("UPDATE payments SET status = 'succeeded' WHERE order_id = ?", refunded).Error; err != nil {
		t.Fatal(err)
	}
	if err := r.db.Exec("DELETE FROM orders WHERE id = ?", gone).Error; err != nil {
		t.Fatal(err)
	}
	r.recount(t)

	rep, err := r.healer().Heal(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids64(rep.Requeued), []int64{rebought}) || len(rep.Failed) != 0 {
		t.Fatalf("requeued %v, failed %v; want the second purchase %d", rep.Requeued, rep.Failed, rebought)
	}
	r.drain(t)
	want := map[string][]int64{voucher.EndedCancelled: {cancelled}, voucher.EndedExpired: {expired}, voucher.EndedRefunded: {refunded}}
	for how, ids := range want {
		if !slices.Equal(ids64(rep.Ends[how]), ids) {
			t.Fatalf("ends %v; want %v", rep.Ends, want)
		}
	}
	if len(rep.Left) != 1 || rep.Left[0].OrderID != gone {
		t.Fatalf("left %+v; want order %d alone", rep.Left, gone)
	}
	for id, st := range map[int64]string{cancelled: order.StatusCancelled, expired: order.StatusCancelled, refunded: order.StatusRefunded,
		untouched: order.StatusAwaitingPayment, rebought: order.StatusAwaitingPayment} {
		if got := r.status(t, id); got != st {
			t.Fatalf("order %d is %s; want %s", id, got, st)
		}
	}
	var owed int64
	if err := r.db.Raw("SELECT COUNT(*) FROM payments WHERE order_id = ? AND status = 'needs_refund'", refunded).Scan(&owed).Error; err != nil || owed != 1 {
		t.Fatalf("payments of the refunded order owed back: %d, %v; want 1", owed, err)
	}
	if dbStock, redisStock := r.stocks(t); dbStock != redisStock {
		t.Fatalf("after the heal: stock %d in the database, %d in redis", dbStock, redisStock)
	}
}

func ids64(ids []ID) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}
