package load

import (
	"context"
	"io"
	"maps"
	"slices"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestCheckOrderLifecycle: the run's check counts the orders by state and
// conserves stock over the live ones: a sale of 3 where one of two buyers'
// orders expired unpaid and gave its unit back passes, with both orders
// written; the same sale whose expired order never gave its unit back to
// Redis fails, naming it.
func TestCheckOrderLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, g, v := saleDB(t, 3)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	keys := voucher.KeysFor(prefix, testShards, false)
	const base = 600_000
	writeOrder(t, g, v, 9001, base)
	writeOrder(t, g, v, 9002, base+1)
	// 9002 expired unpaid: cancelled, no longer live, its unit back in
	// MySQL's stock and in Redis.
	now := time.Now()
	if err := g.Exec("UPDATE orders SET status = 'cancelled', live = NULL, paid_at = NULL, pay_deadline = ?, cancelled_at = ?, cancel_reason = 'expired', unit_back_at = ? WHERE id = 9002",
		now, now, now).Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("UPDATE vouchers SET stock = stock + 1 WHERE id = ?", v.ID).Error; err != nil {
		t.Fatal(err)
	}
	recount(t, g)
	v.Stock = 2
	if _, err := voucher.NewState(rdb, keys).Load(ctx, v, map[int64]int64{base: 9001}); err != nil {
		t.Fatal(err)
	}

	cc := CheckConfig{RedisURL: testenv.RedisURL(t), MySQLDSN: dsn, KeyPrefix: prefix, Shards: testShards, Group: "order-writers", DrainTimeout: 10 * time.Second}
	if err := rdb.XGroupCreateMkStream(ctx, keys.Stream(keys.Shard(v.ID)), cc.Group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := Config{UserBase: base, Log: io.Discard}
	res := Result{buyers: []buyer{{accepted: 9001, pressed: true}, {accepted: 9002, pressed: true}}, ids: []int64{base, base + 1}}
	rep, err := check(ctx, cc, cfg, v.ID, res)
	wantStates := map[string]int{"paid": 1, "cancelled": 1}
	if err != nil || !rep.OK || rep.Orders != 2 || rep.Live != 1 || rep.DBStock != 2 || rep.RedisStock != 2 || !maps.Equal(rep.ByState, wantStates) {
		t.Fatalf("check of a sale with an expired order: %+v, %v; want OK, 2 orders, 1 live, stock 2, by state %v", rep, err, wantStates)
	}

	if err := g.Exec("UPDATE orders SET unit_back_at = NULL WHERE id = 9002").Error; err != nil {
		t.Fatal(err)
	}
	cc.DrainTimeout = 100 * time.Millisecond
	rep, err = check(ctx, cc, cfg, v.ID, res)
	want := "I9: cancelled order 9002 (user 600001) did not give its unit back to Redis (no unit_back_at)"
	if err != nil || rep.OK || !slices.Contains(rep.Violations, want) {
		t.Fatalf("check with a unit not back: %+v, %v; want the violation %q", rep, err, want)
	}
}

// TestCheckSkewedBuyers: with a skew the buyers are not consecutive ids;
// the check holds each buyer's answers against the orders of its own user
// id, so a sale to skewed buyers passes.
func TestCheckSkewedBuyers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, g, v := saleDB(t, 3)
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	keys := voucher.KeysFor(prefix, testShards, false)
	const base = 700_000
	ids := buyerIDs(base, 3, 0.5, 3)
	if ids[0] == base && ids[2] == base+2 {
		t.Fatalf("buyers %v are consecutive: the test would not tell the ids apart", ids)
	}
	writeOrder(t, g, v, 9101, ids[0])
	writeOrder(t, g, v, 9102, ids[2])
	v.Stock = 1
	if _, err := voucher.NewState(rdb, keys).Load(ctx, v, map[int64]int64{ids[0]: 9101, ids[2]: 9102}); err != nil {
		t.Fatal(err)
	}
	cc := CheckConfig{RedisURL: testenv.RedisURL(t), MySQLDSN: dsn, KeyPrefix: prefix, Shards: testShards, DrainTimeout: 5 * time.Second}
	if err := rdb.XGroupCreateMkStream(ctx, keys.Stream(keys.Shard(v.ID)), "order-writers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	res := Result{ids: ids, buyers: []buyer{{accepted: 9101, pressed: true}, {}, {accepted: 9102, pressed: true}}}
	rep, err := check(ctx, cc, Config{UserBase: base, Log: io.Discard}, v.ID, res)
	if err != nil || !rep.OK || rep.Orders != 2 {
		t.Fatalf("check of a sale to skewed buyers %v: %+v, %v; want OK, 2 orders", ids, rep, err)
	}
}
