package order

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// poison overwrites a Redis hash with a string, as a stray write or a hand
// edit might: every script that reads it as a hash fails. mend puts the
// hash back as it was.
func poison(t *testing.T, rdb *redis.Client, key string) (mend func()) {
	t.Helper()
	ctx := context.Background()
	was, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, key, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		pipe := rdb.TxPipeline()
		pipe.Del(ctx, key)
		for f, v := range was {
			pipe.HSet(ctx, key, f, v)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// poisonStock overwrites a voucher state's stock with something that is
// not an integer. mend puts it back.
func poisonStock(t *testing.T, rdb *redis.Client, key string) (mend func()) {
	t.Helper()
	ctx := context.Background()
	was, err := rdb.HGet(ctx, key, "stock").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key, "stock", "plenty").Err(); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := rdb.HSet(ctx, key, "stock", was).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// poisons are the ways a voucher's state key can be unreadable.
var poisons = []struct {
	name   string
	poison func(t *testing.T, rdb *redis.Client, key string) (mend func())
}{{"state not a hash", poison}, {"stock not an integer", poisonStock}}

// writerErrors counts the failed Redis calls a writer reports, by op.
type writerErrors struct {
	nopObserver
	mu sync.Mutex
	n  map[string]int
}

func (c *writerErrors) RedisError(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
}

func (c *writerErrors) count(op string) int { c.mu.Lock(); defer c.mu.Unlock(); return c.n[op] }

// TestExpiryBatchOneBadOrder: an expiry batch of four overdue orders, one
// of a voucher whose Redis state cannot be read (overwritten with a
// string, or its stock with a word), so its unit cannot go back. Every
// expiry is acked: the three good orders are expired with their units
// back; the bad one is expired in the database and left to the sweeper,
// counted once as a failed give-back, nothing of its reservation touched.
// Once the key is mended, a sweep gives its unit back.
func TestExpiryBatchOneBadOrder(t *testing.T) {
	t.Parallel()
	for _, kind := range poisons {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			expiryBatchOneBadOrder(t, kind.poison)
		})
	}
}

func expiryBatchOneBadOrder(t *testing.T, poison func(t *testing.T, rdb *redis.Client, key string) (mend func())) {
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		bad := e.newVoucher(t, 1990, 10)
		good := []purchase{e.reserve(t, e.v.ID), e.reserve(t, e.v.ID), e.reserve(t, e.v.ID)}
		broken := e.reserve(t, bad.ID)
		e.write(t, good[0], broken, good[1], good[2])
		was, badWas := e.sale(t, e.v.ID, 0), e.sale(t, bad.ID, broken.user)
		mend := poison(t, e.rdb, e.keys.State(bad.ID))
		e.clock.pass(lifeWindow + time.Second)
		if n := forward(t, e); n != 4 {
			t.Fatalf("forwarded %d, want 4", n)
		}
		errsBefore := e.moves.redisErrors("unit_back")
		expire(t, NewExpirer(e.life, e.exp, quietLog), readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10))
		for _, p := range good {
			o := e.order(t, p.order)
			if o.Status != StatusCancelled || o.UnitBackAt == nil {
				t.Errorf("good order %s; want expired, its unit back", describe(o))
			}
		}
		if s := e.sale(t, e.v.ID, 0); s.stock != was.stock+3 || s.redisStock != was.redisStock+3 {
			t.Errorf("sale %+v, was %+v; want the 3 good units back in both", s, was)
		}
		if o := e.order(t, broken.order); o.Status != StatusCancelled || o.UnitBackAt != nil {
			t.Errorf("bad order %s; want expired, its unit not back (left to the sweeper)", describe(o))
		}
		if n := e.moves.redisErrors("unit_back") - errsBefore; n != 1 {
			t.Errorf("%d failed give-backs counted, want 1", n)
		}
		mend()
		if s := e.sale(t, bad.ID, broken.user); s.redisStock != badWas.redisStock || s.entry != strconv.FormatInt(broken.order, 10) {
			t.Fatalf("bad voucher's sale %+v, was %+v: a failed give-back wrote something", s, badWas)
		}
		if err := NewSweeper(e.db, e.life, SweeperConfig{Every: time.Hour}, quietLog).Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if s := e.sale(t, bad.ID, broken.user); s != badWas.up() {
			t.Fatalf("after the sweep: bad voucher's sale %+v, want %+v", s, badWas.up())
		}
	})
}

// reserveAll reserves each purchase in Redis and returns its messages.
func reserveAll(t *testing.T, e writerEnv, ps [][3]int64) []mq.Message {
	t.Helper()
	r := voucher.NewReserver(e.rdb, e.keys)
	var batch []mq.Message
	for i, p := range ps {
		order, user, v := p[0], p[1], p[2]
		if _, err := r.Reserve(context.Background(), v, user, order); err != nil {
			t.Fatalf("buyer %d buys voucher %d: %v", user, v, err)
		}
		batch = append(batch, msg(i+1, order, user, v))
	}
	return batch
}

func sameOutcomes(t *testing.T, got, want []mq.Outcome) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("outcomes %v, want %v", got, want)
		}
	}
}

// TestWriterGiveBackOneBadOrder: a batch of four messages over the
// delivery limit (dead-lettered, their reservations given back), one of a
// voucher whose Redis state was overwritten with a string. The three good
// reservations are given back and acked; the bad one's message is left
// pending (delivered again later), counted once, its reservation
// untouched. Delivered again once the key is mended, it is given back and
// acked.
func TestWriterGiveBackOneBadOrder(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	errs := &writerErrors{}
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Observer: errs}, quietLog)
	ctx := context.Background()
	v, bad := e.voucher(t, 10), e.voucher(t, 10)
	stateEnv(t, e, v, 10, nil)
	stateEnv(t, e, bad, 10, nil)
	batch := reserveAll(t, e, [][3]int64{{4001, 1, v}, {4002, 2, bad}, {4003, 3, v}, {4004, 4, v}})
	for i := range batch {
		batch[i].Deliveries = 99
	}
	mend := poison(t, e.rdb, e.keys.State(bad))
	out, err := w.Handle(ctx, batch)
	if err != nil {
		t.Fatalf("handle: %v; want the good ones done, the bad one left pending", err)
	}
	sameOutcomes(t, out, []mq.Outcome{mq.Ack, mq.LeavePending, mq.Ack, mq.Ack})
	if stock, buyers := redisStock(t, e, v); stock != 10 || len(buyers) != 0 {
		t.Errorf("good voucher: redis stock %d buyers %v; want 10 and none (given back)", stock, buyers)
	}
	if pending, err := e.rdb.HKeys(ctx, e.keys.Pending(0)).Result(); err != nil || len(pending) != 1 || pending[0] != "4002" {
		t.Errorf("pending index %v (%v); want only the bad order 4002, untouched", pending, err)
	}
	if n := errs.count("give_back"); n != 1 {
		t.Errorf("%d failed give-backs counted, want 1", n)
	}
	mend()
	if stock, buyers := redisStock(t, e, bad); stock != 9 || buyers["2"] != "4002" {
		t.Fatalf("bad voucher: redis stock %d buyers %v; want its reservation untouched", stock, buyers)
	}
	sameOutcomes(t, handle(t, w, batch[1:2]), []mq.Outcome{mq.Ack})
	if stock, buyers := redisStock(t, e, bad); stock != 10 || len(buyers) != 0 {
		t.Fatalf("bad voucher mended: redis stock %d buyers %v; want 10 and none", stock, buyers)
	}
	if _, o, d := e.counts(t, bad); o != 0 || d != 1 {
		t.Fatalf("bad voucher: %d orders, %d dead letters; want 0 and 1", o, d)
	}
}

// TestWriterSettleOneBadOrder: a batch of four new orders, one of a
// voucher whose buyers hash in Redis was overwritten with a string. All
// four are written; the three good ones are settled (gone from the pending
// index) and acked; the bad one's message is left pending, counted once,
// and its order stays in the pending index. Delivered again once the key
// is mended, it is settled and acked.
func TestWriterSettleOneBadOrder(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	errs := &writerErrors{}
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Observer: errs}, quietLog)
	ctx := context.Background()
	v, bad := e.voucher(t, 10), e.voucher(t, 10)
	stateEnv(t, e, v, 10, nil)
	stateEnv(t, e, bad, 10, nil)
	batch := reserveAll(t, e, [][3]int64{{5001, 1, v}, {5002, 2, bad}, {5003, 3, v}, {5004, 4, v}})
	mend := poison(t, e.rdb, e.keys.Buyers(bad))
	out, err := w.Handle(ctx, batch)
	if err != nil {
		t.Fatalf("handle: %v; want the good ones done, the bad one left pending", err)
	}
	sameOutcomes(t, out, []mq.Outcome{mq.Ack, mq.LeavePending, mq.Ack, mq.Ack})
	pending, err := e.rdb.HKeys(ctx, e.keys.Pending(0)).Result()
	if err != nil || len(pending) != 1 || pending[0] != "5002" {
		t.Errorf("pending index %v (%v); want only the bad order 5002", pending, err)
	}
	if n := errs.count("settle"); n != 1 {
		t.Errorf("%d failed settles counted, want 1", n)
	}
	if _, o, _ := e.counts(t, v); o != 3 {
		t.Errorf("%d good orders written, want 3", o)
	}
	mend()
	sameOutcomes(t, handle(t, w, batch[1:2]), []mq.Outcome{mq.Ack})
	if n, err := e.rdb.HLen(ctx, e.keys.Pending(0)).Result(); err != nil || n != 0 {
		t.Fatalf("%d orders still pending (%v), want 0", n, err)
	}
	if stock, buyers := redisStock(t, e, bad); stock != 9 || len(buyers) != 1 || buyers["2"] != "5002" {
		t.Fatalf("bad voucher mended: redis stock %d buyers %v; want 9 and buyer 2 -> 5002", stock, buyers)
	}
	if s, o, d := e.counts(t, bad); s != 9 || o != 1 || d != 0 {
		t.Fatalf("bad voucher: stock %d orders %d dead %d; want 9 1 0", s, o, d)
	}
}

// TestExpirerOneUnmovableOrder: an expiry batch of one overdue order whose
// voucher's stock was set to its total by hand, so its unit cannot come
// back and the order cannot be expired. The expiry is acked all the same
// and not scheduled again (left to the sweeper, which tries again each
// round): it neither holds up the shard's later expiries nor comes back
// round the delay queue at once, for ever.
func TestExpirerOneUnmovableOrder(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 3, func(t *testing.T, e lifeEnv) {
		p := e.buy(t)
		if err := e.db.Exec("UPDATE vouchers SET stock = total_stock WHERE id = ?", p.voucher).Error; err != nil {
			t.Fatal(err)
		}
		e.clock.pass(lifeWindow + time.Second)
		if n := forward(t, e); n != 1 {
			t.Fatalf("forwarded %d, want 1", n)
		}
		expire(t, NewExpirer(e.life, e.exp, quietLog), readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10))
		if o := e.order(t, p.order); o.Status != StatusAwaitingPayment {
			t.Fatalf("order %s; want left awaiting payment", describe(o))
		}
		if d := dueOf(t, e); len(d) != 0 {
			t.Fatalf("scheduled again: %v; want it left to the sweeper", d)
		}
		if n := e.moves.mysqlErrors(); n != 0 {
			t.Fatalf("%d MySQL errors counted; a stock at its total is no failed call", n)
		}
	})
}

// TestExpirerBatchFailureIsNotLeft: an order the database refuses to
// expire fails the whole batch, which stays pending to be tried again,
// even when another order of the batch is one left to the sweeper; acking
// it would drop the refused order's expiry until the sweeper's next round.
func TestExpirerBatchFailureIsNotLeft(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 3, func(t *testing.T, e lifeEnv) {
		full, refusedBuy := e.buy(t), e.buy(t)
		// The unit of full cannot go back (stock at its total, edited by
		// hand); the database refuses refusedBuy's move outright.
		if err := e.db.Exec("UPDATE vouchers SET stock = total_stock WHERE id = ?", full.voucher).Error; err != nil {
			t.Fatal(err)
		}
		trigger := map[string]string{
			"mysql": fmt.Sprintf(`CREATE TRIGGER refuse_expiry BEFORE UPDATE ON orders FOR EACH ROW
				IF OLD.id = %d THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF`, refusedBuy.order),
			"sqlite": fmt.Sprintf(`CREATE TRIGGER refuse_expiry BEFORE UPDATE ON orders FOR EACH ROW
				WHEN OLD.id = %d BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`, refusedBuy.order),
		}[e.db.Dialector.Name()]
		if err := e.db.Exec(trigger).Error; err != nil {
			t.Fatal(err)
		}
		e.clock.pass(lifeWindow + time.Second)
		if n := forward(t, e); n != 2 {
			t.Fatalf("forwarded %d, want 2", n)
		}
		batch := readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10)
		x := NewExpirer(e.life, e.exp, quietLog)
		if out, err := x.Handle(context.Background(), batch); err == nil {
			t.Fatalf("the batch answered %v and no error; want it failed, to be tried again", out)
		}
		if o := e.order(t, refusedBuy.order); o.Status != StatusAwaitingPayment {
			t.Fatalf("refused order %s; want awaiting payment", describe(o))
		}
		// Once the database takes them (the trigger gone, the stock as it
		// was), the same batch, tried again, expires both.
		if err := e.db.Exec("DROP TRIGGER refuse_expiry").Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Exec("UPDATE vouchers SET stock = total_stock - 2 WHERE id = ?", full.voucher).Error; err != nil {
			t.Fatal(err)
		}
		expire(t, x, batch)
		for _, id := range []int64{full.order, refusedBuy.order} {
			if o := e.order(t, id); o.Status != StatusCancelled {
				t.Fatalf("order %s after the batch was tried again; want cancelled", describe(o))
			}
		}
	})
}

// TestWriterSettleStockNotAnInteger: the settle of an order whose buyer
// Redis lost (it records the buyer and takes the unit) meets a stock that
// is not an integer: that order alone is left pending, nothing written for
// it, the others settled; once the stock is mended it settles.
func TestWriterSettleStockNotAnInteger(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{}, quietLog)
	ctx := context.Background()
	v, bad := e.voucher(t, 10), e.voucher(t, 10)
	stateEnv(t, e, v, 10, nil)
	stateEnv(t, e, bad, 10, nil)
	batch := reserveAll(t, e, [][3]int64{{6001, 1, v}, {6002, 2, bad}, {6003, 3, v}})
	if err := e.rdb.HDel(ctx, e.keys.Buyers(bad), "2").Err(); err != nil { // lost, as after a rebuild
		t.Fatal(err)
	}
	mend := poisonStock(t, e.rdb, e.keys.State(bad))
	sameOutcomes(t, handle(t, w, batch), []mq.Outcome{mq.Ack, mq.LeavePending, mq.Ack})
	if buyers, err := e.rdb.HGetAll(ctx, e.keys.Buyers(bad)).Result(); err != nil || len(buyers) != 0 {
		t.Fatalf("bad voucher's buyers %v (%v); want none written", buyers, err)
	}
	if pending, err := e.rdb.HKeys(ctx, e.keys.Pending(0)).Result(); err != nil || len(pending) != 1 || pending[0] != "6002" {
		t.Fatalf("pending index %v (%v); want only 6002", pending, err)
	}
	mend()
	sameOutcomes(t, handle(t, w, batch[1:2]), []mq.Outcome{mq.Ack})
	if stock, buyers := redisStock(t, e, bad); stock != 8 || buyers["2"] != "6002" {
		t.Fatalf("mended: redis stock %d buyers %v; want 8 (the lost buyer's unit taken again) and 2 -> 6002", stock, buyers)
	}
}
