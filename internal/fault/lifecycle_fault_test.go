package fault

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// Each lifecycle scenario sells lifeStock units of a priced voucher to a
// stampede of lifeBuyers buyers pressing at once, then a second stampede
// of new buyers once unpaid units are back on sale.
const (
	lifeStock  = 40
	lifeBuyers = 120
	lifeSettle = 30 * time.Second
)

// Redis without persistence is killed and restarted empty while orders
// await payment: their deadlines in the expiry queue are lost with it. The
// service rebuilds the sale from the database (the unpaid orders still
// hold their units), and after the window the sweeper expires them
// (deadline + SECKILL_EXPIRY_SWEEP, never earlier: nothing else knows
// their deadlines any more). Their units go back on sale, a new stampede
// sells exactly those, and the live orders equal the stock.
func TestLifecycleRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	c.withLifecycle(10 * time.Second)
	a := c.start("a", nil)
	vid := c.createPriced(a.base, lifeStock)
	s := newSale()
	won := c.stampede(s, []string{a.base}, vid, 10_000, lifeBuyers)
	if len(won) != lifeStock {
		t.Fatalf("%d winners of %d units; answers %v", len(won), lifeStock, s.codes)
	}
	// A quarter pay; the rest never do.
	payers, unpaid := split(won)
	payers, rest := split(payers)
	for u, id := range rest {
		unpaid[u] = id
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": lifeStock}, 20*time.Second)
	c.pay([]string{a.base}, payers)

	// Every order is written and its deadline scheduled (before its
	// message was acknowledged): the order stream is empty, the deadlines
	// wait in Redis, none has fallen due yet.
	ctx := context.Background()
	_, due := c.expiryKeys(vid)
	testenv.WaitFor(t, 10*time.Second, "order stream drained", func() bool {
		n, err := c.rdb.XLen(ctx, c.keys.Stream(c.keys.Shard(vid))).Result()
		return err == nil && n == 0 && c.pending() == 0
	})
	scheduled, err := c.rdb.ZCard(ctx, due).Result()
	if err != nil || scheduled != lifeStock {
		t.Fatalf("%d pay deadlines in the expiry queue (%v), want %d", scheduled, err, lifeStock)
	}
	if st := c.states(vid); st["awaiting_payment"] != len(unpaid) || st["paid"] != len(payers) {
		t.Fatalf("before the restart, orders by state %v; want %d awaiting payment and %d paid (setup slower than the pay window?)", st, len(unpaid), len(payers))
	}

	c.redis.Kill(t)
	c.redis.Restart(t)
	if n, err := c.rdb.ZCard(ctx, due).Result(); err != nil || n != 0 {
		t.Fatalf("after the empty restart, %d pay deadlines (%v); want none", n, err)
	}
	// Rebuilt from the database, the unpaid orders still hold their units.
	c.waitOnSale([]string{a.base}, vid, 0, 20*time.Second)

	// After the window, the sweeper expires them, and the units come back.
	c.waitStates(vid, map[string]int{"expired": len(unpaid), "paid": len(payers), "awaiting_payment": 0}, 30*time.Second)
	var early []struct {
		ID     int64
		Margin float64
	}
	if err := c.openDB().Raw("SELECT id, TIMESTAMPDIFF(MICROSECOND, pay_deadline, cancelled_at) / 1e6 AS margin FROM orders WHERE voucher_id = ? AND cancel_reason = 'expired' AND cancelled_at < pay_deadline + INTERVAL ? MICROSECOND",
		vid, sweepInterval.Microseconds()).Scan(&early).Error; err != nil {
		t.Fatal(err)
	}
	if len(early) > 0 {
		t.Fatalf("orders expired less than one sweep interval after their deadline, by something that knew a lost deadline: %+v", early)
	}
	c.waitOnSale([]string{a.base}, vid, len(unpaid), 20*time.Second)

	again := c.stampede(s, []string{a.base}, vid, 20_000, lifeBuyers)
	if len(again) != len(unpaid) {
		t.Fatalf("second stampede: %d winners, want the %d units given back; answers %v", len(again), len(unpaid), s.codes)
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": len(again)}, 20*time.Second)
	c.pay([]string{a.base}, again)
	rep := c.settle(s, vid, lifeSettle)
	if rep.Live != lifeStock || rep.ByState["paid"] != lifeStock || rep.ByState["cancelled"] != len(unpaid) {
		t.Fatalf("final orders: %s; want %d live and paid, %d cancelled", rep, lifeStock, len(unpaid))
	}
	report(t, fmt.Sprintf("redis-server without persistence killed and restarted empty with %d orders awaiting payment (their deadlines lost); the sweeper expired them", len(unpaid)), s, rep)
}

// Two instances sell a priced voucher; as the deadlines fall due one
// instance's expirer reads a batch and is killed with -9 holding it. To
// catch it holding the batch, MariaDB is paused from the payments until
// every deadline fell due and the expirers hold what they read (their
// moves wait on the database); the instance holding the most is killed,
// then MariaDB resumes. The other
// instance's expirer reclaims the entries after SECKILL_RECLAIM_IDLE (or
// its sweeper gets the orders first): every unpaid order is cancelled
// once, as expired, with one unit back each, and the expiry stream's
// pending list drains.
func TestLifecycleExpirerKilled(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	c.withLifecycle(8 * time.Second)
	c.env["SECKILL_RECLAIM_IDLE"] = "2s"
	a := c.start("a", nil)
	b := c.start("b", nil)
	bases := []string{a.base, b.base}
	vid := c.createPriced(a.base, lifeStock)
	s := newSale()
	won := c.stampede(s, bases, vid, 10_000, lifeBuyers)
	if len(won) != lifeStock {
		t.Fatalf("%d winners of %d units; answers %v", len(won), lifeStock, s.codes)
	}
	payers, unpaid := split(won)
	c.waitStates(vid, map[string]int{"awaiting_payment": lifeStock}, 20*time.Second)
	c.pay(bases, payers)
	if st := c.states(vid); st["awaiting_payment"] != len(unpaid) {
		t.Fatalf("before the deadlines, orders by state %v; want %d awaiting payment (setup slower than the pay window?)", st, len(unpaid))
	}

	c.maria.Pause(t)
	// Every deadline falls due (all were written within the stampede's
	// second) and the expirers hold what they read.
	ctx := context.Background()
	_, due := c.expiryKeys(vid)
	var held map[*instance]int64
	testenv.WaitFor(t, 20*time.Second, "every deadline due and an expirer holding some", func() bool {
		n, err := c.rdb.ZCard(ctx, due).Result()
		held = c.expiryHolders(vid, a, b)
		return err == nil && n == 0 && len(held) > 0
	})
	victim, survivor := a, b
	if held[b] > held[a] {
		victim, survivor = b, a
	}
	victim.signal(t, syscall.SIGKILL)
	c.maria.Resume(t)

	c.waitStates(vid, map[string]int{"expired": len(unpaid), "paid": len(payers), "awaiting_payment": 0}, lifeSettle)
	rep := c.settle(s, vid, lifeSettle)
	if rep.Live != len(payers) || rep.ByState["cancelled"] != len(unpaid) || rep.RedisStock != int64(len(unpaid)) || rep.DBStock != len(unpaid) {
		t.Fatalf("after the expiries: %s; want %d live, %d cancelled and %d units back in Redis and the database", rep, len(payers), len(unpaid), len(unpaid))
	}
	c.waitOnSale([]string{survivor.base}, vid, len(unpaid), 10*time.Second)
	report(t, fmt.Sprintf("SIGKILL of %s holding %d due expiries (held: a %d, b %d), MariaDB paused meanwhile; %s took over", victim.name, held[victim], held[a], held[b], survivor.name), s, rep)
}
