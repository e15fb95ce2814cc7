package voucher

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/testenv"
	schema "seckill/sql"
)

// ledger is what the database says of a voucher's sales; the real one is
// the order store, tested with the pipeline.
type ledger struct {
	buyers map[int64]int64
	dead   map[int64]bool
}

func (l ledger) Reservations(context.Context, int64) (map[int64]int64, map[int64]bool, error) {
	b := make(map[int64]int64, len(l.buyers))
	for k, v := range l.buyers {
		b[k] = v
	}
	return b, l.dead, nil
}

// migratedMySQL opens a fresh MySQL database of the test with the schema
// applied; it is closed on cleanup.
func migratedMySQL(t testing.TB) *gorm.DB {
	t.Helper()
	g, err := db.OpenMySQL(testenv.MySQLDSN(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	if _, err := schema.Apply(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestRebuildAfterStateLoss: a shard whose ready marker is gone is rebuilt
// from the database plus the orders still in flight (on the stream or in
// the delay queue, found through the shard's pending index), purchases fail closed until then, and reconcile then finds
// nothing to report.
func TestRebuildAfterStateLoss(t *testing.T) {
	t.Parallel()
	g := migratedMySQL(t)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	store := NewStore(g)
	v := Voucher{Title: "t", TotalStock: 10, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := store.Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	// In flight: user 3 on the stream, user 4 in the delay queue, user 5
	// on the stream but already dead-lettered.
	for _, m := range []Message{{OrderID: 103, UserID: 3, VoucherID: v.ID}, {OrderID: 105, UserID: 5, VoucherID: v.ID}} {
		m.AcceptedAt = time.Now()
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(0), Values: m.Encode()}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	fields := map[string]string{}
	for k, val := range (Message{OrderID: 104, UserID: 4, VoucherID: v.ID, AcceptedAt: time.Now()}).Encode() {
		fields[k] = val.(string)
	}
	if err := mq.NewDelayQueue(rdb, keys.Delayed(0), keys.Stream(0)).Schedule(ctx, mq.Payload(fields), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The purchase script indexed each of them as pending, wherever its
	// message is now. A bad message on the stream was never accepted: it
	// is not in the index, and neither it nor a malformed index entry
	// holds a reservation.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keys.Stream(0), Values: map[string]any{"raw": "junk"}}).Err(); err != nil {
		t.Fatal(err)
	}
	vid := strconv.FormatInt(v.ID, 10)
	if err := rdb.HSet(ctx, keys.Pending(0), "103", "3:"+vid, "104", "4:"+vid, "105", "5:"+vid, "106", "junk").Err(); err != nil {
		t.Fatal(err)
	}
	l := ledger{buyers: map[int64]int64{1: 101, 2: 102}, dead: map[int64]bool{105: true}}
	w := NewWarmer(store, NewState(rdb, keys), l, keys, time.Hour, slog.New(slog.DiscardHandler))

	// No ready marker: purchases fail closed.
	if _, err := NewReserver(rdb, keys).Reserve(ctx, v.ID, 9, 900); err != ErrNotReady {
		t.Fatalf("before rebuild: %v, want ErrNotReady", err)
	}
	if _, err := w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	stock, _ := rdb.HGet(ctx, keys.State(v.ID), "stock").Int64()
	buyers, _ := rdb.HGetAll(ctx, keys.Buyers(v.ID)).Result()
	if stock != 6 || len(buyers) != 4 || buyers["3"] != "103" || buyers["4"] != "104" || buyers["5"] != "" {
		t.Fatalf("rebuilt stock %d buyers %v; want 6 and users 1-4", stock, buyers)
	}
	diffs, err := w.Reconcile(ctx)
	if err != nil || len(diffs) != 0 {
		t.Fatalf("reconcile after rebuild: %v, %v", diffs, err)
	}
	// Buyer 3 is held by the rebuilt state; a new buyer gets in.
	if _, err := NewReserver(rdb, keys).Reserve(ctx, v.ID, 3, 901); err == nil {
		t.Fatal("buyer 3 bought twice after the rebuild")
	}
	if _, err := NewReserver(rdb, keys).Reserve(ctx, v.ID, 9, 902); err != nil {
		t.Fatalf("new buyer after rebuild: %v", err)
	}
	// Reconcile reports a stock that drifted.
	if err := rdb.HSet(ctx, keys.State(v.ID), "stock", 50).Err(); err != nil {
		t.Fatal(err)
	}
	diffs, err = w.Reconcile(ctx)
	if err != nil || len(diffs) != 1 || diffs[0].What != "stock" || diffs[0].Redis != "50" || diffs[0].Expected != "5" {
		t.Fatalf("reconcile after drift: %+v, %v", diffs, err)
	}
}

// TestRebuildLeaseGuardsWrites: a rebuild that lost its lease to another
// writes nothing: neither a voucher's state nor the ready marker.
func TestRebuildLeaseGuardsWrites(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := NewKeys(testenv.Prefix(t), 1)
	st := NewState(rdb, keys)
	v := Voucher{ID: 7, TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := rdb.Set(ctx, keys.Rebuilding(0), "newer", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := st.Replace(ctx, "older", time.Minute, v, 5, map[int64]int64{1: 2}); !errors.Is(err, errLeaseLost) {
		t.Fatalf("replace with a lost lease: %v, want errLeaseLost", err)
	}
	if err := st.Reopen(ctx, "older", 0, ""); !errors.Is(err, errLeaseLost) {
		t.Fatalf("reopen with a lost lease: %v, want errLeaseLost", err)
	}
	if n, err := rdb.Exists(ctx, keys.State(7), keys.Buyers(7), keys.Ready(0)).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys written by a rebuild without its lease (%v)", n, err)
	}
	if err := st.Replace(ctx, "newer", time.Minute, v, 4, map[int64]int64{1: 2}); err != nil {
		t.Fatal(err)
	}
	if err := st.Reopen(ctx, "newer", 0, ""); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(ctx, keys.Rebuilding(0)).Result(); err != nil || n != 0 {
		t.Fatalf("the lease outlived the rebuild (%d, %v)", n, err)
	}
}

// TestWarmOpensTheShardsItCan: a shard whose rebuild fails (here its
// pending index is damaged) does not keep the shards after it closed: they
// are rebuilt and sell, and Warm reports the one that failed.
func TestWarmOpensTheShardsItCan(t *testing.T) {
	t.Parallel()
	g := migratedMySQL(t)
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 2)
	store := NewStore(g)
	byShard := map[int]int64{}
	for len(byShard) < 2 {
		v := Voucher{Title: "t", TotalStock: 10, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
		if err := store.Create(ctx, &v); err != nil {
			t.Fatal(err)
		}
		byShard[keys.Shard(v.ID)] = v.ID
	}
	if err := rdb.Set(ctx, keys.Pending(0), "damaged", 0).Err(); err != nil {
		t.Fatal(err)
	}
	w := NewWarmer(store, NewState(rdb, keys), ledger{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	if _, err := w.Warm(ctx); err == nil {
		t.Fatal("Warm reported no error for the damaged shard")
	}
	if _, err := NewReserver(rdb, keys).Reserve(ctx, byShard[1], 7, 700); err != nil {
		t.Fatalf("shard 1, after shard 0 failed to warm: %v, want a sale", err)
	}
	if _, err := NewReserver(rdb, keys).Reserve(ctx, byShard[0], 7, 701); !errors.Is(err, ErrNotReady) {
		t.Fatalf("the damaged shard 0: %v, want ErrNotReady", err)
	}
}
