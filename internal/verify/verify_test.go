package verify

import (
	"context"
	"strings"
	"testing"
	"time"

	"seckill/internal/db"
	lifecycle "seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestCheckRedisAgrees: a drained sale whose Redis matches the database
// passes; a buyer entry with no order behind it (a unit no one can buy), a
// missing one (a buyer who could buy again) and an entry left in the
// shard's pending-order index (a rebuild would count it as in flight) are
// each reported.
func TestCheckRedisAgrees(t *testing.T) {
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
	v := voucher.Voucher{Title: "t", TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, q := range []string{"UPDATE vouchers SET stock = 3 WHERE id = ?", "INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, paid_at) VALUES (901, 1, ?, ?, ?, ?), (902, 2, ?, ?, ?, ?)"} {
		args := []any{v.ID}
		if strings.HasPrefix(q, "INSERT") {
			args = []any{v.ID, now, now, now, v.ID, now, now, now}
		}
		if err := g.Exec(q, args...).Error; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lifecycle.RecountAll(ctx, g); err != nil { // the orders written by hand, counted
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.State(v.ID), "stock", 3).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, keys.Buyers(v.ID), "1", "901", "2", "902").Err(); err != nil {
		t.Fatal(err)
	}
	in := Input{VoucherID: v.ID, Accepted: map[int64]int64{901: 1, 902: 2}}
	check := func(want string) {
		t.Helper()
		r, err := Check(ctx, g, rdb, keys, in)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(r.Violations, "; ")
		if (want == "") != r.OK() || !strings.Contains(got, want) {
			t.Fatalf("violations %q, want %q", got, want)
		}
	}
	check("")

	if err := rdb.HSet(ctx, keys.Buyers(v.ID), "9", "909").Err(); err != nil {
		t.Fatal(err)
	}
	check("I5: Redis has 3 buyers, the database 2 live orders")
	if err := rdb.HDel(ctx, keys.Buyers(v.ID), "9", "2").Err(); err != nil {
		t.Fatal(err)
	}
	check(`I5: Redis names order "" for user 2, the database live order 902`)
	if err := rdb.HSet(ctx, keys.Buyers(v.ID), "2", "902").Err(); err != nil {
		t.Fatal(err)
	}
	check("")
	if err := rdb.HSet(ctx, keys.Pending(0), "903", "3:1").Err(); err != nil {
		t.Fatal(err)
	}
	check("I6: 1 orders left in the shard's pending-order index")
}
