package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// readGroup reads up to count new entries of a stream as one consumer of
// a group, creating the group at the stream's start.
func readGroup(t *testing.T, e lifeEnv, stream, group, consumer string, count int64) []mq.Message {
	t.Helper()
	ctx := context.Background()
	if err := mq.EnsureGroup(ctx, e.rdb, stream, group); err != nil {
		t.Fatal(err)
	}
	got, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: consumer, Streams: []string{stream, ">"}, Count: count, Block: -1}).Result()
	if err != nil {
		t.Fatalf("%s reads %s: %v", consumer, stream, err)
	}
	var out []mq.Message
	for _, x := range got[0].Messages {
		out = append(out, mq.Message{Stream: stream, ID: x.ID, Values: x.Values})
	}
	return out
}

// expire hands a batch to an expirer, which must not fail or panic, and
// must acknowledge every expiry.
func expire(t *testing.T, x *Expirer, batch []mq.Message) {
	t.Helper()
	var (
		out []mq.Outcome
		err error
	)
	func() {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("expirer panicked: %v", r)
			}
		}()
		out, err = x.Handle(context.Background(), batch)
	}()
	if err != nil {
		t.Fatalf("expire %d: %v", len(batch), err)
	}
	for i, o := range out {
		if o != mq.Ack {
			t.Fatalf("expiry %s: outcome %v, want Ack", batch[i].ID, o)
		}
	}
	if len(out) != len(batch) {
		t.Fatalf("%d outcomes for %d expiries", len(out), len(batch))
	}
}

// dueOf reads the scheduled deadline of each order in the shard's expiry
// queue, in unix milliseconds.
func dueOf(t *testing.T, e lifeEnv) map[int64]int64 {
	t.Helper()
	zs, err := e.rdb.ZRangeWithScores(context.Background(), e.exp.Queue(0).Key(), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]int64{}
	for _, z := range zs {
		f, err := mq.ParsePayload(z.Member.(string))
		if err != nil {
			t.Fatal(err)
		}
		id, err := strconv.ParseInt(fmt.Sprint(f["order_id"]), 10, 64)
		if err != nil {
			t.Fatalf("member %v: %v", z.Member, err)
		}
		out[id] = int64(z.Score)
	}
	return out
}

// forward moves every scheduled deadline due on the env's clock onto the
// expiry stream, as a poller does.
func forward(t *testing.T, e lifeEnv) int {
	t.Helper()
	n, err := e.exp.Queue(0).Forward(context.Background(), e.clock.now(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExpirerDeliveredTwice: each expiry reaches the stream twice (the
// writer scheduled it again on a redelivery of its message), and is read
// by two instances sharing the expirers' group and by a second group:
// every one of 8 orders is cancelled once, as expired, and gives back one
// unit in the database and in Redis.
func TestExpirerDeliveredTwice(t *testing.T) {
	t.Parallel()
	const n = 8
	eachLifeDB(t, 1990, 20, func(t *testing.T, e lifeEnv) {
		var ps []purchase
		for range n {
			ps = append(ps, e.reserve(t, e.v.ID))
		}
		e.write(t, ps...)
		was := e.sale(t, e.v.ID, 0)
		if d := dueOf(t, e); len(d) != n {
			t.Fatalf("%d deadlines scheduled, want %d", len(d), n)
		}
		e.clock.pass(lifeWindow + time.Minute)
		if moved := forward(t, e); moved != n {
			t.Fatalf("%d expiries forwarded, want %d", moved, n)
		}
		e.write(t, ps...) // redelivered: scheduled again, due now
		if moved := forward(t, e); moved != n {
			t.Fatalf("%d expiries forwarded again, want %d", moved, n)
		}
		stream := e.exp.Queue(0).Stream()
		a1 := readGroup(t, e, stream, ExpiryGroup, "a1", n)
		a2 := readGroup(t, e, stream, ExpiryGroup, "a2", 2*n)
		b := readGroup(t, e, stream, "other", "b1", 2*n)
		if len(a1)+len(a2) != 2*n || len(b) != 2*n {
			t.Fatalf("read %d+%d and %d expiries, want %d in each group", len(a1), len(a2), len(b), 2*n)
		}
		one := NewExpirer(e.lifecycle(), NewExpiries(e.rdb, e.keys), quietLog)
		two := NewExpirer(e.lifecycle(), NewExpiries(e.rdb, e.keys), quietLog)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, r := range []struct {
			x     *Expirer
			batch []mq.Message
		}{{one, a1}, {two, a2}, {two, b[:n]}, {one, b[n:]}} {
			wg.Go(func() {
				<-start
				expire(t, r.x, r.batch)
			})
		}
		close(start)
		wg.Wait()
		for _, p := range ps {
			o := e.order(t, p.order)
			if o.Status != StatusCancelled || o.CancelReason == nil || *o.CancelReason != CancelExpired || o.UnitBackAt == nil {
				t.Errorf("order %s; want cancelled, expired, its unit back", describe(o))
			}
			if s := e.sale(t, p.voucher, p.user); s.entry != "" {
				t.Errorf("buyer %d still holds %s in redis", p.user, s.entry)
			}
		}
		if s := e.sale(t, e.v.ID, 0); s.stock != was.stock+n || s.redisStock != was.redisStock+n {
			t.Fatalf("sale %+v, was %+v; want %d units back in both", s, was, n)
		}
		if m := e.moves.count("expire"); m != n {
			t.Fatalf("%d expirations made, want %d", m, n)
		}
	})
}

// TestExpiryPipeline runs the expiries as the service does: the writer
// schedules each deadline, two instances' pollers forward the due ones
// and their consumers share the expirers' group. Of six orders two are
// paid and one cancelled by its buyer before the deadline: once it
// passes, the other three are expired, the paid stay paid, and the four
// units are back; queue, stream and pending list drain.
func TestExpiryPipeline(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		var ps []purchase
		for range 6 {
			ps = append(ps, e.reserve(t, e.v.ID))
		}
		e.write(t, ps...)
		for _, p := range ps[:2] {
			if _, _, err := e.life.Do(ctx, Pay, p.order); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := e.life.Do(ctx, Cancel, ps[2].order); err != nil {
			t.Fatal(err)
		}
		was := e.sale(t, e.v.ID, 0)
		e.clock.pass(lifeWindow + time.Second)

		runCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		t.Cleanup(func() { stop(); wg.Wait() })
		for i := range 2 {
			exp := NewExpiries(e.rdb, e.keys)
			due := exp.Queue(0)
			c := mq.NewConsumer(e.rdb, mq.ConsumerConfig{Stream: due.Stream(), Group: ExpiryGroup, Consumer: "instance-" + strconv.Itoa(i), Block: 20 * time.Millisecond},
				NewExpirer(e.lifecycle(), exp, quietLog), quietLog)
			p := mq.NewPoller(due, mq.PollerConfig{Every: 10 * time.Millisecond, Now: e.clock.now}, quietLog)
			wg.Go(func() { _ = c.Run(runCtx) })
			wg.Go(func() { _ = p.Run(runCtx) })
		}
		stream := e.exp.Queue(0).Stream()
		testenv.WaitFor(t, 20*time.Second, "the unpaid orders expired and the expiries drained", func() bool {
			var expired int64
			if err := e.db.Raw("SELECT COUNT(*) FROM orders WHERE cancel_reason = ? AND unit_back_at IS NOT NULL", CancelExpired).Scan(&expired).Error; err != nil {
				return false
			}
			queued, _ := e.rdb.ZCard(ctx, e.exp.Queue(0).Key()).Result()
			left, _ := e.rdb.XLen(ctx, stream).Result()
			pending, err := e.rdb.XPending(ctx, stream, ExpiryGroup).Result()
			return err == nil && expired == 3 && queued == 0 && left == 0 && pending.Count == 0
		})
		for i, p := range ps {
			o := e.order(t, p.order)
			switch {
			case i < 2 && o.Status != StatusPaid:
				t.Errorf("paid order %s; want still paid", describe(o))
			case i == 2 && (o.CancelReason == nil || *o.CancelReason != CancelByBuyer):
				t.Errorf("order cancelled by its buyer: %s", describe(o))
			}
		}
		if s := e.sale(t, e.v.ID, 0); s.stock != was.stock+3 || s.redisStock != was.redisStock+3 {
			t.Fatalf("sale %+v, was %+v; want the 3 expired orders' units back in both", s, was)
		}
	})
}

// TestExpirerNotDue: an expiry that comes before its order's deadline (a
// poller whose clock runs ahead) cancels nothing: the deadline is
// scheduled again, at the order's deadline.
func TestExpirerNotDue(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		p := e.buy(t)
		was := e.sale(t, p.voucher, p.user)
		if n, err := e.exp.Queue(0).Forward(context.Background(), time.Now().Add(2*lifeWindow), 10); err != nil || n != 1 {
			t.Fatalf("forwarded %d, %v; want the one deadline", n, err)
		}
		if d := dueOf(t, e); len(d) != 0 {
			t.Fatalf("deadlines still queued after forwarding: %v", d)
		}
		expire(t, NewExpirer(e.life, e.exp, quietLog), readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10))
		o := e.order(t, p.order)
		if o.Status != StatusAwaitingPayment || o.PayDeadline == nil {
			t.Fatalf("order %s; want still awaiting payment", describe(o))
		}
		if d := dueOf(t, e); len(d) != 1 || d[p.order] != o.PayDeadline.UnixMilli() {
			t.Fatalf("scheduled %v; want order %d at its deadline %d", d, p.order, o.PayDeadline.UnixMilli())
		}
		if s := e.sale(t, p.voucher, p.user); s != was {
			t.Fatalf("sale %+v, was %+v", s, was)
		}
	})
}

// TestExpirerLeavesPaid: an order paid before its deadline is left paid
// when the deadline's expiry comes, holding its unit.
func TestExpirerLeavesPaid(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		p := e.buy(t)
		if _, _, err := e.life.Do(context.Background(), Pay, p.order); err != nil {
			t.Fatal(err)
		}
		paid, was := e.order(t, p.order), e.sale(t, p.voucher, p.user)
		e.clock.pass(lifeWindow + time.Second)
		if n := forward(t, e); n != 1 {
			t.Fatalf("forwarded %d, want 1", n)
		}
		expire(t, NewExpirer(e.life, e.exp, quietLog), readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10))
		if o := e.order(t, p.order); describe(o) != describe(paid) {
			t.Fatalf("order %s; want it as paid: %s", describe(o), describe(paid))
		}
		if s := e.sale(t, p.voucher, p.user); s != was || s.entry != strconv.FormatInt(p.order, 10) {
			t.Fatalf("sale %+v, was %+v; want the buyer still holding order %d", s, was, p.order)
		}
	})
}

// TestExpirerGivesBackBuyersCancel: an order cancelled by its buyer while
// Redis could not take the unit back (the shard was being rebuilt) gets
// it back when its deadline's expiry comes, once; the cancellation stays
// the buyer's.
func TestExpirerGivesBackBuyersCancel(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		p := e.buy(t)
		was := e.sale(t, p.voucher, p.user)
		e.unready(t)
		if _, moved, err := e.life.Do(ctx, Cancel, p.order); !errors.Is(err, ErrUnitNotBack) || !moved {
			t.Fatalf("cancel while the shard is not ready: moved %v, %v; want moved and ErrUnitNotBack", moved, err)
		}
		e.ready(t)
		if s := e.sale(t, p.voucher, p.user); s.redisStock != was.redisStock || s.entry != strconv.FormatInt(p.order, 10) {
			t.Fatalf("sale %+v, was %+v; want Redis as it was", s, was)
		}
		e.clock.pass(lifeWindow + time.Second)
		if n := forward(t, e); n != 1 {
			t.Fatalf("forwarded %d, want 1", n)
		}
		batch := readGroup(t, e, e.exp.Queue(0).Stream(), ExpiryGroup, "c", 10)
		x := NewExpirer(e.life, e.exp, quietLog)
		expire(t, x, batch)
		expire(t, x, batch) // delivered again: nothing more
		o := e.order(t, p.order)
		if o.CancelReason == nil || *o.CancelReason != CancelByBuyer || o.UnitBackAt == nil {
			t.Errorf("order %s; want cancelled by its buyer, its unit back", describe(o))
		}
		if s := e.sale(t, p.voucher, p.user); s != was.up() {
			t.Fatalf("sale %+v, want %+v: the unit back once, the buyer free", s, was.up())
		}
	})
}

// TestSweeperExpiresOverdue: orders whose deadline was never scheduled
// (lost with Redis's data) are expired by the sweeper once their deadline
// is more than its period past, not before; a paid order is left paid.
func TestSweeperExpiresOverdue(t *testing.T) {
	t.Parallel()
	const every = 10 * time.Minute
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		unpaid, paid := e.buy(t), e.buy(t)
		if _, _, err := e.life.Do(ctx, Pay, paid.order); err != nil {
			t.Fatal(err)
		}
		if err := e.rdb.Del(ctx, e.exp.Queue(0).Key()).Err(); err != nil { // the deadlines lost
			t.Fatal(err)
		}
		was := e.sale(t, e.v.ID, unpaid.user)
		s := NewSweeper(e.db, e.life, SweeperConfig{Every: every}, quietLog)
		e.clock.pass(lifeWindow + every/2) // past, by less than the period
		if err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if o := e.order(t, unpaid.order); o.Status != StatusAwaitingPayment {
			t.Fatalf("order %s half a period after its deadline; want still awaiting payment", describe(o))
		}
		e.clock.pass(every)
		if err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		o := e.order(t, unpaid.order)
		if o.Status != StatusCancelled || o.CancelReason == nil || *o.CancelReason != CancelExpired || o.UnitBackAt == nil {
			t.Fatalf("order %s; want expired by the sweeper, its unit back", describe(o))
		}
		if got := e.sale(t, e.v.ID, unpaid.user); got != was.up() {
			t.Fatalf("sale %+v, want %+v", got, was.up())
		}
		if o := e.order(t, paid.order); o.Status != StatusPaid {
			t.Fatalf("paid order %s; want paid", describe(o))
		}
		if err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if got := e.sale(t, e.v.ID, unpaid.user); got != was.up() {
			t.Fatalf("swept again: sale %+v, want %+v", got, was.up())
		}
	})
}

// TestSweeperGivesUnitsBack: a cancellation and a refund made while Redis
// could not take their units (the shard being rebuilt) are given back by
// the sweeper once it can, each once, with unit_back_at recorded; before
// that the sweep says it could not.
func TestSweeperGivesUnitsBack(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		cancelled, refunded := e.buy(t), e.buy(t)
		if _, _, err := e.life.Do(ctx, Pay, refunded.order); err != nil {
			t.Fatal(err)
		}
		was := e.sale(t, e.v.ID, 0)
		e.unready(t)
		for _, m := range []struct {
			a Action
			p purchase
		}{{Cancel, cancelled}, {Refund, refunded}} {
			if _, moved, err := e.life.Do(ctx, m.a, m.p.order); !errors.Is(err, ErrUnitNotBack) || !moved {
				t.Fatalf("%s while the shard is not ready: moved %v, %v; want moved and ErrUnitNotBack", m.a, moved, err)
			}
		}
		s := NewSweeper(e.db, e.life, SweeperConfig{Every: time.Minute}, quietLog)
		if err := s.Sweep(ctx); !errors.Is(err, ErrUnitNotBack) {
			t.Fatalf("sweep while the shard is not ready: %v, want ErrUnitNotBack", err)
		}
		if got := e.sale(t, e.v.ID, 0); got.redisStock != was.redisStock || got.stock != was.stock+2 {
			t.Fatalf("sale %+v, was %+v; want 2 units back in the database only", got, was)
		}
		e.ready(t)
		for range 2 {
			if err := s.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if got := e.sale(t, e.v.ID, 0); got.redisStock != was.redisStock+2 || got.stock != was.stock+2 {
				t.Fatalf("sale %+v, was %+v; want 2 units back in both", got, was)
			}
			for _, p := range []purchase{cancelled, refunded} {
				if o, s := e.order(t, p.order), e.sale(t, p.voucher, p.user); o.UnitBackAt == nil || s.entry != "" {
					t.Fatalf("order %s, buyer entry %q; want its unit back and the buyer free", describe(o), s.entry)
				}
			}
		}
	})
}

// TestExpiriesNudgeThePoller: a deadline this instance schedules wakes its
// shard's poller, which otherwise sleeps a minute while idle: the deadline
// due now reaches the expiry stream at once, on each of two shards.
func TestExpiriesNudgeThePoller(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := voucher.NewKeys(testenv.Prefix(t), 2)
	exp := NewExpiries(rdb, keys)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	var looks atomic.Int64 // a poller reads its clock once per look
	now := func() time.Time { looks.Add(1); return time.Now() }
	for shard := range keys.Shards() {
		p := mq.NewPoller(exp.Queue(shard), mq.PollerConfig{Every: 5 * time.Millisecond, Idle: time.Minute, Now: now}, quietLog)
		wg.Go(func() { _ = p.Run(runCtx) })
	}
	testenv.WaitFor(t, 10*time.Second, "both pollers found their queue empty", func() bool { return looks.Load() >= 2 })
	var ds []deadline
	for v := int64(1); len(ds) < 2; v++ {
		if keys.Shard(v) == len(ds) {
			ds = append(ds, deadlineOf(keys, 100+v, 7, v, 1, time.Now()))
		}
	}
	if err := exp.schedule(ctx, ds); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "both deadlines on their expiry streams", func() bool {
		for shard := range keys.Shards() {
			if n, err := rdb.XLen(ctx, exp.Queue(shard).Stream()).Result(); err != nil || n != 1 {
				return false
			}
		}
		return true
	})
}
