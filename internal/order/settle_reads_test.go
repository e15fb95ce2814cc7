package order

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
	"seckill/lua"
)

// TestSettleReadsStockOncePerVoucher: settle.lua checks a voucher's stock
// once per call, not once per order: settling 50 orders of one voucher
// reads each buyer (50 HGETs) and the stock once, on a Redis of the test's
// own (its command counts are the test's alone). The answers are those of
// a check per order: settled, and nothing for a voucher whose stock is
// not an integer. The settled orders leave the pending index in two HDELs
// for the call (the first order's at once, the rest together); the others
// stay in it.
func TestSettleReadsStockOncePerVoucher(t *testing.T) {
	t.Parallel()
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
	ctx := context.Background()
	k := voucher.NewKeys("settle-reads", 1)
	const good, bad, n = int64(1), int64(2), 50
	if err := rdb.Set(ctx, k.Ready(0), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for v, stock := range map[int64]string{good: "100", bad: "not a number"} {
		if err := rdb.HSet(ctx, k.StateAt(0, v), "stock", stock).Err(); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{k.Ready(0), k.Pending(0), k.DBSeen(0)}
	args := []any{""}
	for i := range n + 2 {
		v, user, order := good, int64(1000+i), int64(5000+i)
		if i >= n {
			v = bad
		}
		// Each buyer already recorded by the purchase: only the pending
		// index entry goes.
		if err := rdb.HSet(ctx, k.BuyersAt(0, v), strconv.FormatInt(user, 10), order).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, k.Pending(0), strconv.FormatInt(order, 10), strconv.FormatInt(user, 10)+":"+strconv.FormatInt(v, 10)).Err(); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.StateAt(0, v), k.BuyersAt(0, v))
		args = append(args, user, order, v)
	}
	before, hdelsBefore := calls(t, rdb, "hget"), calls(t, rdb, "hdel")
	res, err := lua.Settle().Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != n+3 || res[0] != 1 {
		t.Fatalf("answers %v", res)
	}
	for i, d := range res[1:] {
		want := int64(settledNothing)
		if i >= n {
			want = int64(settledBadKeys)
		}
		if d != want {
			t.Fatalf("order %d: %d, want %d (answers %v)", i, d, want, res)
		}
	}
	// n+2 buyers, and each voucher's stock once.
	if got, want := calls(t, rdb, "hget")-before, int64(n+2+2); got != want {
		t.Fatalf("settling %d orders of one voucher took %d HGETs, want %d", n, got, want)
	}
	if got := calls(t, rdb, "hdel") - hdelsBefore; got != 2 {
		t.Fatalf("settling %d orders took %d HDELs, want 2", n, got)
	}
	left, err := rdb.HKeys(ctx, k.Pending(0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{strconv.Itoa(5000 + n), strconv.Itoa(5000 + n + 1)}; !slices.Equal(slices.Sorted(slices.Values(left)), want) {
		t.Fatalf("pending index after settling: %v, want %v (the unreadable voucher's orders)", left, want)
	}
}

// calls is the server's count of calls of a command so far (scripts'
// included).
func calls(t *testing.T, rdb *redis.Client, command string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls="); ok {
			n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestSettleSeesItsOwnDrops: an order settle drops from the pending index
// reads as gone to the later orders of the same call, though the index is
// written once at the end: a buyer entry naming an order settled earlier
// in the call is not taken over (answer 0, the entry kept), as with the
// order dropped at once.
func TestSettleSeesItsOwnDrops(t *testing.T) {
	t.Parallel()
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
	ctx := context.Background()
	k := voucher.NewKeys("settle-drops", 1)
	const v, user, first, second = int64(1), int64(7), int64(501), int64(502)
	for _, o := range []int64{first, second} {
		if err := rdb.HSet(ctx, k.Pending(0), strconv.FormatInt(o, 10), "7:1").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.HSet(ctx, k.BuyersAt(0, v), "7", first).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k.StateAt(0, v), "stock", 5).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, k.Ready(0), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{k.Ready(0), k.Pending(0), k.DBSeen(0), k.StateAt(0, v), k.BuyersAt(0, v), k.StateAt(0, v), k.BuyersAt(0, v)}
	res, err := lua.Settle().Run(ctx, rdb, keys, "", user, first, v, user, second, v).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, int64(settledNothing), int64(settledNothing)}; !slices.Equal(res, want) {
		t.Fatalf("answers %v, want %v", res, want)
	}
	if held, err := rdb.HGet(ctx, k.BuyersAt(0, v), "7").Int64(); err != nil || held != first {
		t.Fatalf("buyer entry %d, %v; want %d", held, err, first)
	}
}

// TestSettleDropsFirst: settle's first write is the first order's HDEL,
// as when every order was dropped at once. So a pending index of another
// type fails the call before anything is written (the buyer not recorded,
// the unit not taken), and a Redis at its memory limit (noeviction) still
// lets the call record a missing buyer: it refuses a script's writes that
// grow memory only until the script's first write.
func TestSettleDropsFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := voucher.NewKeys("settle-first", 1)
	const v = int64(1)
	// setUp makes order 501 of buyer 7 pending, the buyer missing from
	// the voucher's buyers (a rebuild read MySQL before its write), the
	// stock 5, and returns settle's keys and arguments for it.
	setUp := func(t *testing.T, rdb *redis.Client) ([]string, []any) {
		t.Helper()
		if err := rdb.HSet(ctx, k.StateAt(0, v), "stock", 5).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Set(ctx, k.Ready(0), "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
		return []string{k.Ready(0), k.Pending(0), k.DBSeen(0), k.StateAt(0, v), k.BuyersAt(0, v)}, []any{"0-1-9", 7, 501, v}
	}
	t.Run("pending index of another type", func(t *testing.T) {
		rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
		keys, args := setUp(t, rdb)
		if err := rdb.Set(ctx, k.Pending(0), "not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if err := lua.Settle().Run(ctx, rdb, keys, args...).Err(); err == nil {
			t.Fatal("settle over a pending index that is not a hash: no error")
		}
		if n, err := rdb.Exists(ctx, k.BuyersAt(0, v)).Result(); err != nil || n != 0 {
			t.Fatalf("buyers written before the failure: %d, %v", n, err)
		}
		if stock, err := rdb.HGet(ctx, k.StateAt(0, v), "stock").Int(); err != nil || stock != 5 {
			t.Fatalf("stock %d, %v after the failure; want 5", stock, err)
		}
	})
	t.Run("memory limit reached", func(t *testing.T) {
		rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
		keys, args := setUp(t, rdb)
		if err := rdb.HSet(ctx, k.Pending(0), "501", "7:1").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		res, err := lua.Settle().Run(ctx, rdb, keys, args...).Int64Slice()
		if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		if want := []int64{1, int64(settledTook)}; err != nil || !slices.Equal(res, want) {
			t.Fatalf("settle at the memory limit: %v, %v; want %v", res, err, want)
		}
		if held, err := rdb.HGet(ctx, k.BuyersAt(0, v), "7").Int64(); err != nil || held != 501 {
			t.Fatalf("buyer entry %d, %v; want 501", held, err)
		}
		if seen, err := rdb.HGet(ctx, k.DBSeen(0), "g:0-1").Result(); err != nil || seen != "9" {
			t.Fatalf("gtid recorded at the memory limit: %q, %v; want 9", seen, err)
		}
	})
}

// TestSettleRecordsGTID: settle records the GTID of the transaction that
// wrote its orders in the shard's record of the database, the highest
// sequence number per origin: a lower one, an empty one and a call that
// settled nothing leave it as it is; a record of another type is left
// alone and the orders are settled all the same.
func TestSettleRecordsGTID(t *testing.T) {
	t.Parallel()
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
	ctx := context.Background()
	k := voucher.NewKeys("settle-gtid", 1)
	const v = int64(1)
	if err := rdb.Set(ctx, k.Ready(0), "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, k.StateAt(0, v), "stock", 100).Err(); err != nil {
		t.Fatal(err)
	}
	order := int64(600)
	settle := func(gtid string, orders int) []int64 {
		t.Helper()
		keys, args := []string{k.Ready(0), k.Pending(0), k.DBSeen(0)}, []any{gtid}
		for range orders {
			order++
			keys = append(keys, k.StateAt(0, v), k.BuyersAt(0, v))
			args = append(args, order, order, v)
		}
		res, err := lua.Settle().Run(ctx, rdb, keys, args...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	record := func() map[string]string {
		t.Helper()
		m, err := rdb.HGetAll(ctx, k.DBSeen(0)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	settle("0-1-10", 2)
	settle("0-1-7", 1)
	settle("0-2-3", 1)
	settle("", 1)
	settle("0-1-99", 0)
	if got := record(); len(got) != 2 || got["g:0-1"] != "10" || got["g:0-2"] != "3" {
		t.Fatalf("record %v; want g:0-1 10 and g:0-2 3", got)
	}
	if err := rdb.Del(ctx, k.DBSeen(0)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, k.DBSeen(0), "stray", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if res := settle("0-1-11", 1); len(res) != 2 || res[0] != 1 || res[1] != int64(settledTook) {
		t.Fatalf("settle beside a record of another type: %v", res)
	}
	if got, err := rdb.Get(ctx, k.DBSeen(0)).Result(); err != nil || got != "stray" {
		t.Fatalf("record of another type: %q, %v; want it left as it was", got, err)
	}
}
