package order

import (
	"context"
	"testing"

	"seckill/internal/mq"
)

// TestGiveBackNeverPassesTheTotal: a unit given back never lifts a
// voucher's stock above its total, by the guard of the update itself: the
// schema's CHECK is dropped here, as MySQL before 8.0.16 parses it and
// ignores it. The stock of a voucher is set to its total by hand; then a
// cancellation, a refund, and an expiry batch (whose orders are then
// tried one by one) are each refused, their orders stay as they were and
// the stock stays at its total.
func TestGiveBackNeverPassesTheTotal(t *testing.T) {
	t.Parallel()
	e := newLifeEnv(t, "mariadb", 1990, 5)
	ctx := context.Background()
	if err := e.db.Exec("ALTER TABLE vouchers DROP CONSTRAINT chk_vouchers_stock_le_total").Error; err != nil {
		t.Fatal(err)
	}
	cancelled, refunded, expired := e.buy(t), e.buy(t), e.buy(t)
	if _, _, err := e.life.Do(ctx, Pay, refunded.order); err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec("UPDATE vouchers SET stock = total_stock WHERE id = ?", e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	late := e.lifecycleAhead(2 * lifeWindow)
	before := map[int64]string{}
	for _, p := range []purchase{cancelled, refunded, expired} {
		before[p.order] = describe(e.order(t, p.order))
	}
	if _, moved, err := late.Do(ctx, Cancel, cancelled.order); err == nil || moved {
		t.Errorf("cancel with the stock full: moved %v, %v; want refused", moved, err)
	}
	if _, moved, err := late.Do(ctx, Refund, refunded.order); err == nil || moved {
		t.Errorf("refund with the stock full: moved %v, %v; want refused", moved, err)
	}
	if _, err := late.ExpireAll(ctx, []int64{cancelled.order, expired.order}); err == nil {
		t.Errorf("expire a batch with the stock full: no error, want refused")
	}
	for id, was := range before {
		if o := describe(e.order(t, id)); o != was {
			t.Errorf("order changed with the stock full: %s, was %s", o, was)
		}
	}
	var stock, total int
	if err := e.db.Raw("SELECT stock, total_stock FROM vouchers WHERE id = ?", e.v.ID).Row().Scan(&stock, &total); err != nil {
		t.Fatal(err)
	}
	if stock != total {
		t.Fatalf("stock %d, total %d: a give-back lifted the stock past its total", stock, total)
	}
}

// TestSettleLeavesAnEntryNotPending: settling a written order whose buyer
// entry in Redis names another order of the buyer that is no longer
// pending (written and settled before) leaves the entry and the stock
// alone: only an entry naming a pending order is taken over
// (TestSettleTakesOverRepurchase).
func TestSettleLeavesAnEntryNotPending(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	ctx := context.Background()
	v := e.voucher(t, 10)
	stateEnv(t, e, v, 9, map[int64]int64{7: 3001})
	if n, err := e.rdb.HLen(ctx, e.keys.Pending(0)).Result(); err != nil || n != 0 {
		t.Fatalf("%d orders pending (%v), want none", n, err)
	}
	for _, o := range handle(t, e.w, []mq.Message{msg(1, 3002, 7, v)}) {
		if o != mq.Ack {
			t.Fatalf("outcome %v, want Ack", o)
		}
	}
	stock, buyers := redisStock(t, e, v)
	if stock != 9 || len(buyers) != 1 || buyers["7"] != "3001" {
		t.Fatalf("redis stock %d buyers %v; want 9 and buyer 7 -> 3001 left alone", stock, buyers)
	}
}
