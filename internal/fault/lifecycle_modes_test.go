package fault

import (
	"fmt"
	"testing"
	"time"
)

// A stampede where half the winners never pay, through two instances on
// one Redis and MariaDB, and in the embedded mode (one instance, its
// in-process Redis and SQLite file, the dev provider by default): after
// the window their units are back on sale on every instance, a second
// stampede of new buyers sells exactly those, and the final live orders
// equal the stock.
func TestLifecycleUnpaidResold(t *testing.T) {
	t.Parallel()
	t.Run("two_instances", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, true)
		c.withLifecycle(8 * time.Second)
		a := c.start("a", nil)
		b := c.start("b", nil)
		unpaidResold(c, []string{a.base, b.base})
	})
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		c := newEmbedded(t)
		c.env["SECKILL_PAY_WINDOW"] = "8s"
		c.env["SECKILL_EXPIRY_SWEEP"] = sweepInterval.String()
		a := c.startEmbedded("embedded")
		unpaidResold(c, []string{a.base})
	})
}

// unpaidResold runs the sale of TestLifecycleUnpaidResold through bases.
func unpaidResold(c *cluster, bases []string) {
	t := c.t
	t.Helper()
	vid := c.createPriced(bases[0], lifeStock)
	s := newSale()
	won := c.stampede(s, bases, vid, 10_000, lifeBuyers)
	if len(won) != lifeStock {
		t.Fatalf("%d winners of %d units; answers %v", len(won), lifeStock, s.codes)
	}
	payers, unpaid := split(won)
	c.waitStates(vid, map[string]int{"awaiting_payment": lifeStock}, 20*time.Second)
	c.pay(bases, payers)
	if st := c.states(vid); st["awaiting_payment"] != len(unpaid) || st["paid"] != len(payers) {
		t.Fatalf("orders by state %v; want %d awaiting payment and %d paid (setup slower than the pay window?)", st, len(unpaid), len(payers))
	}

	c.waitStates(vid, map[string]int{"expired": len(unpaid), "paid": len(payers), "awaiting_payment": 0}, lifeSettle)
	c.waitOnSale(bases, vid, len(unpaid), 20*time.Second)
	again := c.stampede(s, bases, vid, 20_000, lifeBuyers)
	if len(again) != len(unpaid) {
		t.Fatalf("second stampede: %d winners, want the %d units given back; answers %v", len(again), len(unpaid), s.codes)
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": len(again)}, 20*time.Second)
	c.pay(bases, again)
	rep := c.settle(s, vid, lifeSettle)
	if rep.Live != lifeStock || rep.ByState["paid"] != lifeStock || rep.ByState["cancelled"] != len(unpaid) {
		t.Fatalf("final orders: %s; want %d live and paid, %d cancelled", rep, lifeStock, len(unpaid))
	}
	report(t, fmt.Sprintf("%d of %d winners never paid, through %d instance(s); their units resold", len(unpaid), lifeStock, len(bases)), s, rep)
}
