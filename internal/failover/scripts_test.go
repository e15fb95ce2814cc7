package failover

import (
	"context"
	"maps"
	"testing"
	"time"

	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	"seckill/lua"
)

// TestDBSync: db_sync.lua raises a record's origins to the server's
// history (keeping a higher one a worker recorded), or sets them to it
// (dropping an origin the server holds none of); either names the
// server and the lineage, only while the record holds the lineage it was
// read with; a record of another type is left alone.
func TestDBSync(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	key := voucher.NewKeys(testenv.Prefix(t), 1).DBSeen(0)
	s := db.Server{Name: "db2:3306", ID: 2, History: db.History{{Domain: 0, Server: 1}: 995, {Domain: 0, Server: 2}: 20}}
	sync := func(from, to, mode string) int {
		t.Helper()
		args := []any{from, to, s.Identity(), mode}
		for o, seq := range s.History {
			args = append(args, o.String(), seq)
		}
		n, err := lua.DBSync().Run(ctx, rdb, []string{key}, args...).Int()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	record := func() map[string]string {
		t.Helper()
		m, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if err := rdb.HSet(ctx, key, "g:0-1", "1000", "g:0-3", "7").Err(); err != nil {
		t.Fatal(err)
	}
	if n := sync("", "L", "raise"); n != 1 {
		t.Fatalf("raise: %d", n)
	}
	want := map[string]string{"lineage": "L", "server": s.Identity(), "g:0-1": "1000", "g:0-2": "20", "g:0-3": "7"}
	if got := record(); !maps.Equal(got, want) {
		t.Fatalf("after raise: %v; want %v", got, want)
	}
	if n := sync("other", "L", "set"); n != 0 {
		t.Fatalf("set read with another lineage: %d, want 0", n)
	}
	if n := sync("L", "L", "set"); n != 1 {
		t.Fatalf("set: %d", n)
	}
	want = map[string]string{"lineage": "L", "server": s.Identity(), "g:0-1": "995", "g:0-2": "20"}
	if got := record(); !maps.Equal(got, want) {
		t.Fatalf("after set: %v; want %v", got, want)
	}
	if n := sync("L", "R", "set"); n != 1 || record()["lineage"] != "R" {
		t.Fatalf("a restore's set: %d, %v", n, record())
	}
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, key, "stray", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n := sync("", "L", "raise"); n != -1 {
		t.Fatalf("a record of another type: %d, want -1", n)
	}
}

// TestRequeue: requeue.lua queues an order again only while its buyer's
// entry names it and it is not pending, in a ready shard; the queued
// message decodes as a healed order with its pay deadline.
func TestRequeue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	st := voucher.NewState(rdb, keys)
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()
	m := voucher.Message{OrderID: 501, UserID: 7, VoucherID: 1, AcceptedAt: time.Now().Truncate(time.Millisecond).UTC(), Due: due}
	requeue := func() voucher.Requeued {
		t.Helper()
		got, err := st.Requeue(ctx, []voucher.Message{m})
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	if got := requeue(); got != voucher.RequeueNotReady {
		t.Fatalf("shard not ready: %v", got)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if got := requeue(); got != voucher.RequeueNotHeld {
		t.Fatalf("no buyer entry: %v", got)
	}
	if err := rdb.HSet(ctx, keys.BuyersAt(0, 1), "7", "502").Err(); err != nil {
		t.Fatal(err)
	}
	if got := requeue(); got != voucher.RequeueNotHeld {
		t.Fatalf("the entry names another order: %v", got)
	}
	if err := rdb.HSet(ctx, keys.BuyersAt(0, 1), "7", "501").Err(); err != nil {
		t.Fatal(err)
	}
	if got := requeue(); got != voucher.RequeueQueued {
		t.Fatalf("held, not pending: %v", got)
	}
	if got := requeue(); got != voucher.RequeuePending {
		t.Fatalf("queued twice: %v", got)
	}
	es, err := rdb.XRange(ctx, keys.Stream(0), "-", "+").Result()
	if err != nil || len(es) != 1 {
		t.Fatalf("stream %v, %v; want one message", es, err)
	}
	got, err := voucher.Decode(es[0].Values)
	if err != nil {
		t.Fatal(err)
	}
	want := m
	want.Healed = true
	if got != want {
		t.Fatalf("queued %+v; want %+v", got, want)
	}
	if p, err := rdb.HGet(ctx, keys.Pending(0), "501").Result(); err != nil || p != "7:1" {
		t.Fatalf("pending index entry %q, %v", p, err)
	}
}
