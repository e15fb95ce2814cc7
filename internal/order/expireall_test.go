package order

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/mq"
)

// TestExpireAllRaces: 20 overdue orders of one voucher; 100 goroutines
// released at once, half expiring the whole set in one transaction each
// (Lifecycle.ExpireAll, as expirers of several instances do), half paying
// or cancelling single orders. Every order ends as exactly one of paid or
// cancelled, the moves made add up to one per order, and the voucher got
// back exactly one unit per cancelled order, in the database and in Redis.
func TestExpireAllRaces(t *testing.T) {
	t.Parallel()
	const orders, callers = 20, 100
	eachLifeDB(t, 1990, orders, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		counter := &moveCounter{moves: map[string]int{}}
		late := e.lifecycleAhead(2 * lifeWindow)
		late.obs = counter
		var ps []purchase
		var ids []int64
		for range orders {
			p := e.buy(t)
			ps = append(ps, p)
			ids = append(ids, p.order)
		}
		v := ps[0].voucher
		was := e.sale(t, v, ps[0].user)
		start := make(chan struct{})
		var (
			wg     sync.WaitGroup
			single atomic.Int64
		)
		for g := range callers {
			wg.Go(func() {
				<-start
				if g%2 == 0 {
					if _, err := late.ExpireAll(ctx, ids); err != nil {
						t.Errorf("expire all: %v", err)
					}
					return
				}
				a := Pay
				if g%4 == 3 {
					a = Cancel
				}
				_, moved, err := late.Do(ctx, a, ids[g%orders])
				if err != nil && !errors.Is(err, ErrWrongState) {
					t.Errorf("%s order %d: %v", a, ids[g%orders], err)
				}
				if moved {
					single.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		var cancelled int64
		for _, id := range ids {
			o := e.order(t, id)
			switch {
			case o.Status == StatusPaid && o.Live != nil:
			case o.Status == StatusCancelled && o.Live == nil && o.UnitBackAt != nil:
				cancelled++
			default:
				t.Fatalf("order %d: %s", id, describe(o))
			}
		}
		moves := counter.count("pay") + counter.count("cancel") + counter.count("expire")
		if moves != orders {
			t.Fatalf("%d moves heard (pay %d, cancel %d, expire %d, single %d), want %d", moves,
				counter.count("pay"), counter.count("cancel"), counter.count("expire"), single.Load(), orders)
		}
		s := e.sale(t, v, ps[0].user)
		if s.stock != was.stock+cancelled || s.redisStock != was.redisStock+cancelled {
			t.Fatalf("sale %+v after %d cancelled, was %+v", s, cancelled, was)
		}
	})
}

// TestCancelledBetweenCommitAndSettle: the buyer cancels an order after
// the writer committed it and before the writer settled it in Redis (the
// hook between the two, where a paused worker would be). The cancellation
// gives the unit back; the settle then finds no buyer entry and takes the
// unit again; the writer sees the order ended and gives it back once more.
// Redis ends with the unit on sale and no entry for the buyer, as the
// database says.
func TestCancelledBetweenCommitAndSettle(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 3, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		p := e.reserve(t, e.v.ID)
		was := e.sale(t, p.voucher, p.user)
		var cancelled []error
		e.w.cfg.AfterCommit = func() {
			_, _, err := e.life.Do(ctx, Cancel, p.order)
			cancelled = append(cancelled, err)
		}
		e.write(t, p)
		if len(cancelled) != 1 || cancelled[0] != nil {
			t.Fatalf("cancel in the hook: %v", cancelled)
		}
		o := e.order(t, p.order)
		if o.Status != StatusCancelled || o.UnitBackAt == nil {
			t.Fatalf("order: %s", describe(o))
		}
		if s := e.sale(t, p.voucher, p.user); s != (sale{stock: was.stock, redisStock: was.redisStock + 1}) {
			t.Fatalf("sale %+v, want the unit back on sale in both (was %+v, reserved in Redis only)", s, was)
		}
	})
}

// TestCancelledAndResoldBetweenCommitAndSettle: the last unit's order is
// cancelled after the writer committed it and before it settled, and
// another buyer takes the unit back on sale at once. Settle finds no
// buyer entry and no unit: it records the buyer alone, and the writer
// drops that entry without giving a unit it never took: Redis keeps the
// new buyer's reservation and no unit appears from nowhere.
func TestCancelledAndResoldBetweenCommitAndSettle(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 1, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		p := e.reserve(t, e.v.ID)
		var (
			cancelled []error
			next      purchase
		)
		e.w.cfg.AfterCommit = func() {
			if len(cancelled) > 0 {
				return // the second order's batch
			}
			_, _, err := e.life.Do(ctx, Cancel, p.order)
			cancelled = append(cancelled, err)
			next = e.reserve(t, e.v.ID)
		}
		e.write(t, p)
		if len(cancelled) != 1 || cancelled[0] != nil {
			t.Fatalf("cancel in the hook: %v", cancelled)
		}
		first := e.sale(t, p.voucher, p.user)
		if first.redisStock != 0 || first.entry != "" || first.stock != 1 {
			t.Fatalf("after the first order's cancellation: %+v, want Redis stock 0 (resold), no entry, the database's unit back", first)
		}
		if s := e.sale(t, next.voucher, next.user); s.entry != strconv.FormatInt(next.order, 10) {
			t.Fatalf("the second buyer's entry: %+v", s)
		}
		e.write(t, next)
		if s := e.sale(t, next.voucher, next.user); s.stock != 0 || s.redisStock != 0 {
			t.Fatalf("after the second order: %+v, want 0 and 0", s)
		}
	})
}

// TestExpireAllOneBadOrder: a batch of overdue orders of two vouchers, one
// of whose stock was set to its total by hand (its unit cannot come back).
// The batch's transaction fails; the orders of the other voucher are
// expired one by one all the same, and the error names the bad one.
func TestExpireAllOneBadOrder(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 3, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		bad := e.newVoucher(t, 1990, 1)
		good := []purchase{e.buy(t), e.buy(t)}
		broken := e.reserve(t, bad.ID)
		e.write(t, broken)
		if err := e.db.Exec("UPDATE vouchers SET stock = total_stock WHERE id = ?", bad.ID).Error; err != nil {
			t.Fatal(err)
		}
		late := e.lifecycleAhead(2 * lifeWindow)
		orders, err := late.ExpireAll(ctx, []int64{good[0].order, broken.order, good[1].order})
		if err == nil || !strings.Contains(err.Error(), strconv.FormatInt(broken.order, 10)) {
			t.Fatalf("expire all: %v, want an error naming order %d", err, broken.order)
		}
		for _, p := range good {
			if o := e.order(t, p.order); o.Status != StatusCancelled || o.UnitBackAt == nil || orders[p.order] == nil {
				t.Fatalf("good order %d: %s", p.order, describe(o))
			}
		}
		if o := e.order(t, broken.order); o.Status != StatusAwaitingPayment {
			t.Fatalf("the bad voucher's order: %s", describe(o))
		}
	})
}

// TestRedeliverySchedulesTheDeadlineAgain: a worker committed an unpaid
// order and stopped before scheduling its deadline (here: the member
// removed); the message delivered again is found written and schedules
// the deadline again, due at once, and the expirer then puts it at the
// order's real deadline instead of expiring it.
func TestRedeliverySchedulesTheDeadlineAgain(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 2, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		p := e.buy(t)
		q := e.exp.Queue(e.keys.Shard(p.voucher))
		member := deadline{order: p.order, user: p.user, voucher: p.voucher}.member()
		if err := e.rdb.ZRem(ctx, q.Key(), member).Err(); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		e.write(t, p)
		score, err := e.rdb.ZScore(ctx, q.Key(), member).Result()
		if err != nil {
			t.Fatalf("the deadline after the redelivery: %v", err)
		}
		if due := time.UnixMilli(int64(score)); due.Before(before.Add(-time.Second)) || due.After(time.Now()) {
			t.Fatalf("scheduled again for %v, want about now", due)
		}
		// The expirer reads the real deadline and schedules it there.
		n, err := q.Forward(ctx, time.Now(), 10)
		if err != nil || n != 1 {
			t.Fatalf("forward: %d, %v", n, err)
		}
		msgs, err := e.rdb.XRange(ctx, q.Stream(), "-", "+").Result()
		if err != nil || len(msgs) != 1 {
			t.Fatalf("expiry stream: %v, %v", msgs, err)
		}
		m := mq.Message{Stream: q.Stream(), ID: msgs[0].ID, Values: msgs[0].Values}
		if _, err := NewExpirer(e.life, e.exp, quietLog).Handle(ctx, []mq.Message{m}); err != nil {
			t.Fatal(err)
		}
		o := e.order(t, p.order)
		if o.Status != StatusAwaitingPayment {
			t.Fatalf("order expired early: %s", describe(o))
		}
		score, err = e.rdb.ZScore(ctx, q.Key(), member).Result()
		if err != nil || time.UnixMilli(int64(score)).Sub(*o.PayDeadline).Abs() > time.Millisecond {
			t.Fatalf("deadline scheduled at %v, %v; want the order's %v", time.UnixMilli(int64(score)), err, o.PayDeadline)
		}
	})
}
