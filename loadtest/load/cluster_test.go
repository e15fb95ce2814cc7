package load

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// saleRedis is a Redis the load tools read a sale from: the URL they are
// given and a client the test writes the sale with.
type saleRedis struct {
	name    string
	url     string
	rdb     redis.UniversalClient
	cluster bool
}

// saleRedises are the shared single server and a Redis Cluster of three
// masters of the test's own.
func saleRedises(t *testing.T) []saleRedis {
	t.Helper()
	c := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	return []saleRedis{
		{name: "single", url: testenv.RedisURL(t), rdb: testenv.Redis(t)},
		{name: "cluster", url: c.URL(), rdb: c.Client(t), cluster: true},
	}
}

// testShards is more shards than masters, so that the vouchers of a test
// land on shards other than 0.
const testShards = 4

// saleDB opens a migrated database of the test's own and creates a voucher
// of total stock on sale in it.
func saleDB(t *testing.T, total int) (dsn string, g *gorm.DB, v voucher.Voucher) {
	t.Helper()
	ctx := context.Background()
	dsn = testenv.MySQLDSN(t)
	g, err := db.OpenMySQL(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	v = voucher.Voucher{Title: "t", TotalStock: total, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	return dsn, g, v
}

// writeOrder records order id of user for v in MySQL, as the worker does
// for a voucher with nothing to pay: paid when written, and counted.
func writeOrder(t *testing.T, g *gorm.DB, v voucher.Voucher, id, user int64) {
	t.Helper()
	now := time.Now()
	if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, paid_at) VALUES (?, ?, ?, ?, ?, 'paid', ?)",
		id, user, v.ID, now, now, now).Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ?", v.ID).Error; err != nil {
		t.Fatal(err)
	}
	recount(t, g)
}

// recount sets the order counters to the orders written by hand.
func recount(t *testing.T, g *gorm.DB) {
	t.Helper()
	if _, err := order.RecountAll(context.Background(), g); err != nil {
		t.Fatal(err)
	}
}

// holdPending appends an entry to stream and reads it in group, where it
// stays pending until acknowledged; it returns the entry's id.
func holdPending(t *testing.T, rdb redis.UniversalClient, stream, group string) string {
	t.Helper()
	ctx := context.Background()
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"order", "1"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestCheckReadsSaleOnEachRedis: the run's check reads the sale's Redis
// state under the key names the service gives it, on a single server and
// on a Redis Cluster: a drained sale passes, with Redis's stock read, and
// an entry left pending in the voucher's stream is a violation.
func TestCheckReadsSaleOnEachRedis(t *testing.T) {
	t.Parallel()
	for _, sr := range saleRedises(t) {
		t.Run(sr.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, g, v := saleDB(t, 3)
			prefix := testenv.Prefix(t)
			keys := voucher.KeysFor(prefix, testShards, sr.cluster)
			const base = 500_000
			writeOrder(t, g, v, 9001, base)
			writeOrder(t, g, v, 9002, base+1)
			v.Stock = 1
			if _, err := voucher.NewState(sr.rdb, keys).Load(ctx, v, map[int64]int64{base: 9001, base + 1: 9002}); err != nil {
				t.Fatal(err)
			}
			stream := keys.Stream(keys.Shard(v.ID))
			if err := sr.rdb.XGroupCreateMkStream(ctx, stream, "order-writers", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if !sr.cluster {
				// One server keeps the key names it always had.
				name := fmt.Sprintf("%s:{%d}:voucher:%d", prefix, v.ID%testShards, v.ID)
				if n, err := sr.rdb.HGet(ctx, name, "stock").Int(); err != nil || n != 1 {
					t.Fatalf("stock under %s: %d, %v; want 1", name, n, err)
				}
			}

			cc := CheckConfig{RedisURL: sr.url, MySQLDSN: dsn, KeyPrefix: prefix, Shards: testShards, DrainTimeout: 10 * time.Second}
			cfg := Config{UserBase: base, Log: io.Discard}
			res := Result{buyers: []buyer{{accepted: 9001, pressed: true}, {accepted: 9002, pressed: true}}, ids: []int64{base, base + 1}}
			rep, err := check(ctx, cc, cfg, v.ID, res)
			if err != nil || !rep.OK || rep.Orders != 2 || rep.RedisStock != 1 || rep.Pending != 0 {
				t.Fatalf("check of a drained sale: %+v, %v; want OK, 2 orders, Redis stock 1", rep, err)
			}

			holdPending(t, sr.rdb, stream, "order-writers")
			cc.DrainTimeout = 100 * time.Millisecond
			rep, err = check(ctx, cc, cfg, v.ID, res)
			want := "I6: 1 entries pending in group order-writers"
			if err != nil || rep.OK || rep.Pending != 1 || !slices.Contains(rep.Violations, want) {
				t.Fatalf("check with an entry pending: %+v, %v; want the violation %q", rep, err, want)
			}
		})
	}
}

// TestDrainWaitsForPendingOnEachRedis: the drain is not over while the
// workers' group holds an entry of the voucher's stream pending, on a
// single server and on a Redis Cluster, even once MySQL holds every order;
// it is over when the entry is acknowledged.
func TestDrainWaitsForPendingOnEachRedis(t *testing.T) {
	t.Parallel()
	for _, sr := range saleRedises(t) {
		t.Run(sr.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn, g, v := saleDB(t, 5)
			prefix := testenv.Prefix(t)
			keys := voucher.KeysFor(prefix, testShards, sr.cluster)
			stream := keys.Stream(keys.Shard(v.ID))
			if err := sr.rdb.XGroupCreateMkStream(ctx, stream, "order-writers", "0").Err(); err != nil {
				t.Fatal(err)
			}
			entry := holdPending(t, sr.rdb, stream, "order-writers")

			log := &testenv.Buffer{}
			cfg := DrainConfig{
				VoucherID: v.ID, Expect: 2, RedisURL: sr.url, MySQLDSN: dsn,
				KeyPrefix: prefix, Shards: testShards, Timeout: time.Minute, Log: log,
			}
			done := startDrain(ctx, cfg)
			testenv.WaitFor(t, 30*time.Second, "the watch began", func() bool {
				select {
				case r := <-done:
					t.Fatalf("drain ended before its watch began: %+v, %v", r.res, r.err)
				default:
				}
				return strings.Contains(log.String(), "watching voucher")
			})
			writeOrder(t, g, v, 9101, 1)
			writeOrder(t, g, v, 9102, 2)
			// The watch logs the count each second it goes on.
			testenv.WaitFor(t, 30*time.Second, "the watch saw every order and went on", func() bool {
				return strings.Contains(log.String(), "2 of 2 orders in MySQL")
			})
			select {
			case r := <-done:
				t.Fatalf("drain over with an entry pending: %+v, %v", r.res, r.err)
			default:
			}
			if err := sr.rdb.XAck(ctx, stream, "order-writers", entry).Err(); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.res.Orders != 2 {
				t.Fatalf("drain %+v, %v; want 2 orders", r.res, r.err)
			}
		})
	}
}
