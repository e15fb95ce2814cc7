package verify

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	lifecycle "seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// TestCheckLifecycle: a sale of 5 units whose orders went every way (one
// awaiting payment, one paid, one used, one expired and its buyer bought
// again, one refunded, a payment that came after its order expired) passes
// when MySQL and Redis agree on the live orders; each way the lifecycle
// can go wrong, seeded in MySQL or Redis, is reported, in the words of the
// check.
func TestCheckLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, err := db.OpenMySQL(testenv.MySQLDSN(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	v := voucher.Voucher{Title: "t", FaceValue: 1000, TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	// The unique live buyer key and the live column's check are the
	// database's last guard; without them the check must still see two
	// live orders of one buyer, or a live column at odds with the state.
	exec(t, g, "ALTER TABLE orders DROP INDEX uniq_orders_live_buyer")
	exec(t, g, "ALTER TABLE orders DROP CONSTRAINT chk_orders_live")

	now := time.Now()
	deadline, back := now.Add(time.Minute), now.Add(time.Second)
	exec(t, g, "UPDATE vouchers SET price = 500, stock = 1 WHERE id = ?", v.ID)
	const cols = "id, user_id, voucher_id, accepted_at, created_at, status, live, amount, pay_deadline, paid_at, used_at, cancelled_at, cancel_reason, refunded_at, unit_back_at"
	for _, o := range [][]any{
		{901, 1, v.ID, now, now, AwaitingPayment, 1, 500, deadline, nil, nil, nil, nil, nil, nil},
		{902, 2, v.ID, now, now, Paid, 1, 500, deadline, now, nil, nil, nil, nil, nil},
		{903, 3, v.ID, now, now, Used, 1, 500, deadline, now, now, nil, nil, nil, nil},
		{904, 4, v.ID, now, now, Cancelled, nil, 500, deadline, nil, nil, now, "expired", nil, back},
		{905, 5, v.ID, now, now, Refunded, nil, 500, deadline, now, nil, nil, nil, now, back},
		{906, 4, v.ID, now, now, Paid, 1, 500, deadline, now, nil, nil, nil, nil, nil},
	} {
		exec(t, g, "INSERT INTO orders ("+cols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", o...)
	}
	// Orders written by hand are counted by a recount.
	recounted, err := lifecycle.RecountAll(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	wantAfter := map[string]int64{AwaitingPayment: 1, Paid: 2, Used: 1, Cancelled + ":expired": 1, Refunded: 1}
	if len(recounted) != 1 || recounted[0].VoucherID != v.ID || len(recounted[0].Before) != 0 || !maps.Equal(recounted[0].After, wantAfter) {
		t.Fatalf("recounted %+v; want voucher %d from nothing to %v", recounted, v.ID, wantAfter)
	}
	if again, err := lifecycle.RecountAll(ctx, g); err != nil || len(again) != 0 {
		t.Fatalf("a second recount changed %+v (%v); want nothing", again, err)
	}
	const pcols = "id, order_id, provider, reference, amount, status, created_at, updated_at, succeeded_at, refunded_at"
	for _, p := range [][]any{
		{1, 902, "dev", "r1", 500, "succeeded", now, now, now, nil},
		{2, 903, "dev", "r2", 500, "succeeded", now, now, now, nil},
		{3, 904, "webhook", "r3", 500, "needs_refund", now, now, now, nil},
		{4, 905, "dev", "r4", 500, "refunded", now, now, now, now},
		{5, 906, "dev", "r5", 500, "succeeded", now, now, now, nil},
	} {
		exec(t, g, "INSERT INTO payments ("+pcols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", p...)
	}
	if err := rdb.HSet(ctx, keys.State(v.ID), "stock", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.Buyers(v.ID), "1", "901", "2", "902", "3", "903", "4", "906").Err(); err != nil {
		t.Fatal(err)
	}
	accepted := map[int64]int64{901: 1, 902: 2, 903: 3, 904: 4, 905: 5, 906: 4}
	in := Input{VoucherID: v.ID, Accepted: accepted}
	expiryStream, expiryQueue := lifecycle.ExpiryKeys(keys, keys.Shard(v.ID))
	check := func(in Input, want ...string) Report {
		t.Helper()
		r, err := Check(ctx, g, rdb, keys, in)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(r.Violations, "\n")
		if len(want) == 0 && !r.OK() {
			t.Fatalf("violations:\n%s\nwant none", got)
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Fatalf("violations:\n%s\nwant %q", got, w)
			}
		}
		return r
	}

	r := check(in)
	wantStates := map[string]int{AwaitingPayment: 1, Paid: 2, Used: 1, Cancelled: 1, Refunded: 1}
	if r.Orders != 6 || r.Live != 4 || r.NeedsRefund != 1 || !maps.Equal(r.ByState, wantStates) {
		t.Fatalf("report %+v; want 6 orders, 4 live, 1 payment needing a refund, by state %v", r, wantStates)
	}
	if s := r.String(); !strings.Contains(s, "orders=6 live=4 (awaiting_payment=1 paid=2 used=1 cancelled=1 refunded=1) needs_refund=1") {
		t.Fatalf("report reads %q", s)
	}

	// Ended orders are still accepted orders written (I3), and orders
	// nobody accepted (I4): leaving them out is reported.
	notAccepted := maps.Clone(accepted)
	delete(notAccepted, 904)
	check(Input{VoucherID: v.ID, Accepted: notAccepted, Refused: []int64{5}},
		"I4: order 904 (user 4) was never accepted", "I4: refused user 5 holds an order")
	lost := maps.Clone(accepted)
	lost[907] = 7
	check(Input{VoucherID: v.ID, Accepted: lost}, "I3: accepted order 907 (user 7) is not in the database")

	// Each case breaks one thing, is checked, then put back.
	for _, c := range []struct {
		name        string
		break_, fix func()
		want        []string
	}{
		{"paid and cancelled",
			sql(t, g, "UPDATE orders SET paid_at = ? WHERE id = 904", now), sql(t, g, "UPDATE orders SET paid_at = NULL WHERE id = 904"),
			[]string{"I8: cancelled order 904 (user 4) has paid_at"}},
		{"used and cancelled",
			sql(t, g, "UPDATE orders SET used_at = ? WHERE id = 904", now), sql(t, g, "UPDATE orders SET used_at = NULL WHERE id = 904"),
			[]string{"I8: cancelled order 904 (user 4) has used_at"}},
		{"cancelled without its time and reason",
			sql(t, g, "UPDATE orders SET cancelled_at = NULL, cancel_reason = NULL WHERE id = 904"),
			sql(t, g, "UPDATE orders SET cancelled_at = ?, cancel_reason = 'expired' WHERE id = 904", now),
			[]string{"I8: cancelled order 904 (user 4) has no cancelled_at", "I8: cancelled order 904 (user 4) has no cancel_reason"}},
		{"cancelled for no known reason",
			sql(t, g, "UPDATE orders SET cancel_reason = 'whim' WHERE id = 904"), sql(t, g, "UPDATE orders SET cancel_reason = 'expired' WHERE id = 904"),
			[]string{`I8: cancelled order 904 (user 4) has cancel_reason "whim"`}},
		{"paid without paid_at",
			sql(t, g, "UPDATE orders SET paid_at = NULL WHERE id = 902"), sql(t, g, "UPDATE orders SET paid_at = ? WHERE id = 902", now),
			[]string{"I8: paid order 902 (user 2) has no paid_at"}},
		{"used without paid_at or used_at",
			sql(t, g, "UPDATE orders SET paid_at = NULL, used_at = NULL WHERE id = 903"), sql(t, g, "UPDATE orders SET paid_at = ?, used_at = ? WHERE id = 903", now, now),
			[]string{"I8: used order 903 (user 3) has no paid_at", "I8: used order 903 (user 3) has no used_at"}},
		{"refunded without paid_at or refunded_at",
			sql(t, g, "UPDATE orders SET paid_at = NULL, refunded_at = NULL WHERE id = 905"), sql(t, g, "UPDATE orders SET paid_at = ?, refunded_at = ? WHERE id = 905", now, now),
			[]string{"I8: refunded order 905 (user 5) has no paid_at", "I8: refunded order 905 (user 5) has no refunded_at"}},
		{"awaiting payment without a deadline",
			sql(t, g, "UPDATE orders SET pay_deadline = NULL WHERE id = 901"), sql(t, g, "UPDATE orders SET pay_deadline = ? WHERE id = 901", deadline),
			[]string{"I8: awaiting_payment order 901 (user 1) has no pay_deadline"}},
		{"a state nobody knows",
			sql(t, g, "UPDATE orders SET status = 'refunding' WHERE id = 905"), sql(t, g, "UPDATE orders SET status = 'refunded' WHERE id = 905"),
			[]string{`I8: order 905 (user 5) is in unknown state "refunding"`}},
		{"a paid order not live",
			sql(t, g, "UPDATE orders SET live = NULL WHERE id = 902"), sql(t, g, "UPDATE orders SET live = 1 WHERE id = 902"),
			[]string{"I8: paid order 902 (user 2) is not live", "I5: total stock 5 != database stock 1 + live orders 3"}},
		{"a refunded order still live",
			sql(t, g, "UPDATE orders SET live = 1 WHERE id = 905"), sql(t, g, "UPDATE orders SET live = NULL WHERE id = 905"),
			[]string{"I8: refunded order 905 (user 5) is still live"}},
		{"two live orders of one buyer",
			sql(t, g, "UPDATE orders SET status = 'paid', live = 1, paid_at = ?, cancelled_at = NULL, cancel_reason = NULL, unit_back_at = NULL WHERE id = 904", now),
			sql(t, g, "UPDATE orders SET status = 'cancelled', live = NULL, paid_at = NULL, cancelled_at = ?, cancel_reason = 'expired', unit_back_at = ? WHERE id = 904", now, back),
			[]string{"I2: user 4 holds 2 live orders", "I5: total stock 5 != database stock 1 + live orders 5"}},
		{"a cancellation that did not give its unit back to Redis",
			sql(t, g, "UPDATE orders SET unit_back_at = NULL WHERE id = 904"), sql(t, g, "UPDATE orders SET unit_back_at = ? WHERE id = 904", back),
			[]string{"I9: cancelled order 904 (user 4) did not give its unit back to Redis (no unit_back_at)"}},
		{"a refund whose buyer entry stayed in Redis",
			redisDo(t, rdb, "HSET", keys.Buyers(v.ID), "5", "905"), redisDo(t, rdb, "HDEL", keys.Buyers(v.ID), "5"),
			[]string{"I9: refunded order 905 (user 5) still holds Redis's buyer entry of user 5", "I5: Redis has 5 buyers, the database 4 live orders"}},
		{"a cancellation whose buyer entry Redis still names",
			redisDo(t, rdb, "HSET", keys.Buyers(v.ID), "4", "904"), redisDo(t, rdb, "HSET", keys.Buyers(v.ID), "4", "906"),
			[]string{"I9: cancelled order 904 (user 4) still holds Redis's buyer entry of user 4", `I5: Redis names order "904" for user 4, the database live order 906`}},
		{"a pay deadline due and left in the delay queue",
			redisDo(t, rdb, "ZADD", expiryQueue, "1", `["order_id","901"]`), redisDo(t, rdb, "ZREM", expiryQueue, `["order_id","901"]`),
			[]string{"I6: pay deadlines not drained: 0 held by the expirers, 0 on their stream, 1 due in the delay queue"}},
		{"a pay deadline on the expiry stream, not handled",
			redisDo(t, rdb, "XADD", expiryStream, "1-1", "order_id", "901"), redisDo(t, rdb, "XDEL", expiryStream, "1-1"),
			[]string{"I6: pay deadlines not drained: 0 held by the expirers, 1 on their stream, 0 due in the delay queue"}},
		{"a unit given back twice in Redis",
			redisDo(t, rdb, "HINCRBY", keys.State(v.ID), "stock", "1"), redisDo(t, rdb, "HINCRBY", keys.State(v.ID), "stock", "-1"),
			[]string{"I5: Redis stock 2 != total stock 5 - live orders 4"}},
		{"a unit never given back in MySQL",
			sql(t, g, "UPDATE vouchers SET stock = 0 WHERE id = ?", v.ID), sql(t, g, "UPDATE vouchers SET stock = 1 WHERE id = ?", v.ID),
			[]string{"I5: total stock 5 != database stock 0 + live orders 4"}},
		{"a payment that revived nothing but succeeded",
			sql(t, g, "UPDATE payments SET status = 'succeeded' WHERE id = 3"), sql(t, g, "UPDATE payments SET status = 'needs_refund' WHERE id = 3"),
			[]string{"I10: payment 3 succeeded but its order 904 is cancelled"}},
		{"a payment succeeded for an order awaiting payment",
			sql(t, g, "INSERT INTO payments ("+pcols+") VALUES (6, 901, 'dev', 'r6', 500, 'succeeded', ?, ?, ?, NULL)", now, now, now),
			sql(t, g, "DELETE FROM payments WHERE id = 6"),
			[]string{"I10: payment 6 succeeded but its order 901 is awaiting_payment"}},
		{"an order paid by two payments",
			sql(t, g, "INSERT INTO payments ("+pcols+") VALUES (7, 902, 'dev', 'r7', 500, 'succeeded', ?, ?, ?, NULL)", now, now, now),
			sql(t, g, "DELETE FROM payments WHERE id = 7"),
			[]string{"I10: payments 1 and 7 both paid order 902"}},
		{"a payment the counters missed",
			sql(t, g, "UPDATE order_counts SET n = n - 1, amount = amount - 500 WHERE voucher_id = ? AND status = 'paid'", v.ID),
			sql(t, g, "UPDATE order_counts SET n = n + 1, amount = amount + 500 WHERE voucher_id = ? AND status = 'paid'", v.ID),
			[]string{"I11: the counters hold 1 paid orders amounting to 500, the orders are 2 amounting to 1000"}},
		{"an expiry counted as the buyer's cancellation",
			sql(t, g, "UPDATE order_counts SET cancel_reason = 'buyer' WHERE voucher_id = ? AND status = 'cancelled'", v.ID),
			sql(t, g, "UPDATE order_counts SET cancel_reason = 'expired' WHERE voucher_id = ? AND status = 'cancelled'", v.ID),
			[]string{"I11: the counters hold 1 cancelled (buyer) orders amounting to 500, the orders are 0 amounting to 0",
				"I11: the counters hold 0 cancelled (expired) orders amounting to 0, the orders are 1 amounting to 500"}},
		{"a refund needed for an order still awaiting payment",
			sql(t, g, "INSERT INTO payments ("+pcols+") VALUES (8, 901, 'dev', 'r8', 500, 'needs_refund', ?, ?, ?, NULL)", now, now, now),
			sql(t, g, "DELETE FROM payments WHERE id = 8"),
			[]string{"I10: payment 8 is needs_refund but its order 901 is awaiting_payment"}},
	} {
		c.break_()
		check(in, c.want...)
		c.fix()
		check(in)
	}
}

// exec runs one statement, failing the test on an error.
func exec(t *testing.T, g *gorm.DB, q string, args ...any) {
	t.Helper()
	if err := g.Exec(q, args...).Error; err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// sql returns a step that runs one statement.
func sql(t *testing.T, g *gorm.DB, q string, args ...any) func() {
	return func() { t.Helper(); exec(t, g, q, args...) }
}

// redisDo returns a step that runs one Redis command.
func redisDo(t *testing.T, rdb redis.UniversalClient, args ...any) func() {
	return func() {
		t.Helper()
		if err := rdb.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
}
