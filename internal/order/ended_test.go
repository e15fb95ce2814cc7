package order

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"seckill/internal/voucher"
)

// TestWriterPricedOrderAwaitsPayment: the order of a voucher with a price
// is written awaiting payment, for the price, with its deadline one pay
// window after it was written, and that deadline is in the expiry queue.
func TestWriterPricedOrderAwaitsPayment(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		p := e.reserve(t, e.v.ID)
		from := time.Now()
		e.write(t, p)
		to := time.Now()
		o := e.order(t, p.order)
		if o.Status != StatusAwaitingPayment || o.Amount != 1990 || o.PaidAt != nil || o.Live == nil || *o.Live != 1 {
			t.Fatalf("order %s; want awaiting payment of 1990, live", describe(o))
		}
		if !within(o.PayDeadline, from.Add(lifeWindow), to.Add(lifeWindow)) {
			t.Fatalf("order %s; want its deadline a pay window (%s) after it was written, between %s and %s", describe(o), lifeWindow, from, to)
		}
		due := dueOf(t, e)
		if d, ok := due[p.order]; !ok || len(due) != 1 || d < o.PayDeadline.UnixMilli()-1 || d > o.PayDeadline.UnixMilli()+1 {
			t.Fatalf("scheduled %v; want order %d at its deadline %d", due, p.order, o.PayDeadline.UnixMilli())
		}
	})
}

// TestWriterFreeOrderPaid: the order of a voucher with nothing to pay is
// written paid, when written, with no deadline, and nothing is scheduled.
func TestWriterFreeOrderPaid(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 0, 10, func(t *testing.T, e lifeEnv) {
		p := e.reserve(t, e.v.ID)
		from := time.Now()
		e.write(t, p)
		to := time.Now()
		o := e.order(t, p.order)
		if o.Status != StatusPaid || o.Amount != 0 || o.PayDeadline != nil || !within(o.PaidAt, from, to) || o.Live == nil {
			t.Fatalf("order %s; want paid when written (between %s and %s), nothing to pay, no deadline", describe(o), from, to)
		}
		if due := dueOf(t, e); len(due) != 0 {
			t.Fatalf("scheduled %v; want nothing", due)
		}
	})
}

// TestWriterEndedOrderRedelivered: a message delivered again after its
// order was cancelled is acknowledged and never settles: it neither takes
// a unit nor records the buyer again. It gives the unit back in Redis
// only when the cancellation could not (its buyer entry still names the
// order), once; when the buyer has bought again, the new purchase keeps
// its entry.
func TestWriterEndedOrderRedelivered(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		redeliver := func(t *testing.T, p purchase, want sale) {
			t.Helper()
			before := e.order(t, p.order)
			for range 2 {
				e.write(t, p)
				if s := e.sale(t, p.voucher, p.user); s != want {
					t.Fatalf("redelivered: sale %+v, want %+v", s, want)
				}
				if o := e.order(t, p.order); describe(o) != describe(before) {
					t.Fatalf("redelivered: order %s, was %s", describe(o), describe(before))
				}
			}
		}
		t.Run("unit given back by the cancellation", func(t *testing.T) {
			p := e.buy(t)
			if _, _, err := e.life.Do(ctx, Cancel, p.order); err != nil {
				t.Fatal(err)
			}
			redeliver(t, p, e.sale(t, p.voucher, p.user))
		})
		t.Run("buyer bought again", func(t *testing.T) {
			p := e.buy(t)
			if _, _, err := e.life.Do(ctx, Cancel, p.order); err != nil {
				t.Fatal(err)
			}
			again := e.reserveFor(t, p.voucher, p.user, e.next.Add(1))
			was := e.sale(t, p.voucher, p.user)
			if was.entry != strconv.FormatInt(again.order, 10) {
				t.Fatalf("buyer entry %q, want the new order %d", was.entry, again.order)
			}
			redeliver(t, p, was)
			e.write(t, again)
			if o := e.order(t, again.order); o.Status != StatusAwaitingPayment {
				t.Fatalf("the buyer's new order %s; want awaiting payment", describe(o))
			}
			if s := e.sale(t, p.voucher, p.user); s.entry != was.entry || s.redisStock != was.redisStock || s.stock != was.stock-1 {
				t.Fatalf("after the new order: sale %+v, was %+v", s, was)
			}
		})
		t.Run("unit not given back by the cancellation", func(t *testing.T) {
			p := e.buy(t)
			was := e.sale(t, p.voucher, p.user)
			e.unready(t)
			if _, _, err := e.life.Do(ctx, Cancel, p.order); !errors.Is(err, ErrUnitNotBack) {
				t.Fatalf("cancel while the shard is not ready: %v, want ErrUnitNotBack", err)
			}
			e.ready(t)
			if s := e.sale(t, p.voucher, p.user); s.redisStock != was.redisStock || s.entry != strconv.FormatInt(p.order, 10) {
				t.Fatalf("sale %+v, was %+v; want Redis as it was", s, was)
			}
			redeliver(t, p, was.up())
		})
	})
}

// TestRebuildCountsLiveOrders: Redis restarted empty after orders were
// paid, used, cancelled, expired and refunded, and is rebuilt from the
// database: only live orders (awaiting payment, paid, used) hold a unit
// and a buyer entry. The stock is the total less the live orders; the
// buyers of ended orders buy again, the others are refused with their
// live order.
func TestRebuildCountsLiveOrders(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		late := e.lifecycleAhead(2 * lifeWindow)
		moves := [][]Action{nil, nil, {Pay}, {Pay, Redeem}, {Cancel}, {Expire}, {Pay, Refund}}
		var live, ended []purchase
		for _, ms := range moves {
			p := e.buy(t)
			for _, a := range ms {
				if _, _, err := late.Do(ctx, a, p.order); err != nil {
					t.Fatal(err)
				}
			}
			if len(ms) > 0 && targets[ms[len(ms)-1]].givesBack {
				ended = append(ended, p)
			} else {
				live = append(live, p)
			}
		}
		// Redis lost everything of the shard.
		if err := e.rdb.Del(ctx, e.keys.Ready(0), e.keys.State(e.v.ID), e.keys.Buyers(e.v.ID), e.keys.Pending(0)).Err(); err != nil {
			t.Fatal(err)
		}
		warmer := voucher.NewWarmer(voucher.NewStore(e.db), voucher.NewState(e.rdb, e.keys), NewStore(e.db), e.keys, time.Hour, quietLog)
		if _, err := warmer.Warm(ctx); err != nil {
			t.Fatal(err)
		}
		s := e.sale(t, e.v.ID, 0)
		if want := int64(10 - len(live)); s.stock != want || s.redisStock != want {
			t.Fatalf("rebuilt: sale %+v; want stock %d in both (10 less %d live orders)", s, want, len(live))
		}
		buyers, err := e.rdb.HGetAll(ctx, e.keys.Buyers(e.v.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(buyers) != len(live) {
			t.Fatalf("rebuilt buyers %v; want the %d live orders' alone", buyers, len(live))
		}
		for _, p := range live {
			if buyers[strconv.FormatInt(p.user, 10)] != strconv.FormatInt(p.order, 10) {
				t.Fatalf("rebuilt buyers %v; want buyer %d -> %d", buyers, p.user, p.order)
			}
		}
		if diffs, err := warmer.Reconcile(ctx); err != nil || len(diffs) != 0 {
			t.Fatalf("reconcile: %+v, %v; want no difference", diffs, err)
		}
		res := voucher.NewReserver(e.rdb, e.keys)
		for _, p := range live {
			_, err := res.Reserve(ctx, p.voucher, p.user, e.next.Add(1))
			if pe := (*voucher.PurchasedError)(nil); !errors.As(err, &pe) || pe.OrderID != p.order {
				t.Fatalf("buyer %d of live order %d buys again: %v; want already purchased", p.user, p.order, err)
			}
		}
		var again []purchase
		for _, p := range ended {
			again = append(again, e.reserveFor(t, p.voucher, p.user, e.next.Add(1)))
		}
		e.write(t, again...)
		for _, p := range again {
			if o := e.order(t, p.order); o.Status != StatusAwaitingPayment {
				t.Fatalf("new order of an ended order's buyer: %s", describe(o))
			}
		}
		if s := e.sale(t, e.v.ID, 0); s.stock != int64(10-len(live)-len(again)) || s.redisStock != s.stock {
			t.Fatalf("after the buyers bought again: sale %+v; want stock %d in both", s, 10-len(live)-len(again))
		}
	})
}
