package voucher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/testenv"
)

// pageEnv is a voucher on sale with a backlog of accepted orders in Redis.
type pageEnv struct {
	rdb  *redis.Client
	keys Keys
	v    Voucher
	w    *Warmer
}

// newPageEnv creates a voucher of the given stock, open for an hour, and a
// warmer on rdb whose database knows no order of it (every order of the
// backlog is still in flight).
func newPageEnv(t testing.TB, rdb *redis.Client, stock int) pageEnv {
	t.Helper()
	g := migratedMySQL(t)
	ctx := context.Background()
	keys := NewKeys(testenv.Prefix(t), 1)
	store := NewStore(g)
	v := Voucher{Title: "t", TotalStock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := store.Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	w := NewWarmer(store, NewState(rdb, keys), ledger{}, keys, time.Hour, slog.New(slog.DiscardHandler))
	return pageEnv{rdb: rdb, keys: keys, v: v, w: w}
}

// order is the i-th order of the backlog: user i+1, order id 1e9+i.
func (e pageEnv) order(i int) Message {
	return Message{OrderID: 1_000_000_000 + int64(i), UserID: int64(i) + 1, VoucherID: e.v.ID, AcceptedAt: time.Now()}
}

// backlog writes what n accepted purchases leave in Redis, as the purchase
// script writes it (stream entry, pending-index entry, buyer, unit taken),
// in pipelines of a few thousand commands. The first delayed of them wait
// in the delay queue instead of the stream (their buyer lock was held).
func (e pageEnv) backlog(t testing.TB, n, delayed int) {
	t.Helper()
	ctx := context.Background()
	const chunk = 5000
	q := mq.NewDelayQueue(e.rdb, e.keys.Delayed(0), e.keys.Stream(0))
	for from := 0; from < n; from += chunk {
		pipe := e.rdb.Pipeline()
		for i := from; i < min(from+chunk, n); i++ {
			m := e.order(i)
			if i < delayed {
				pipe.ZAdd(ctx, q.Key(), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: payload(m)})
			} else {
				pipe.XAdd(ctx, &redis.XAddArgs{Stream: e.keys.Stream(0), Values: m.Encode()})
			}
			pipe.HSet(ctx, e.keys.Pending(0), strconv.FormatInt(m.OrderID, 10), fmt.Sprintf("%d:%d", m.UserID, m.VoucherID))
			pipe.HSet(ctx, e.keys.Buyers(e.v.ID), strconv.FormatInt(m.UserID, 10), strconv.FormatInt(m.OrderID, 10))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.HSet(ctx, e.keys.State(e.v.ID), "stock", e.v.TotalStock-n,
		"begin_ms", e.v.BeginAt.UnixMilli(), "end_ms", e.v.EndAt.UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
}

// payload is a message as the delay queue holds it.
func payload(m Message) string {
	fields := map[string]string{}
	for k, v := range m.Encode() {
		fields[k] = v.(string)
	}
	return mq.Payload(fields)
}

// lose drops the shard's sale state but not its backlog, as a failover to
// a replica that had the orders but not the marker would: a rebuild is due.
func (e pageEnv) lose(t testing.TB) {
	t.Helper()
	if err := e.rdb.Del(context.Background(), e.keys.Ready(0), e.keys.State(e.v.ID), e.keys.Buyers(e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
}

// checkRebuilt checks that the rebuilt state holds every one of the n
// orders of the backlog, and their units.
func (e pageEnv) checkRebuilt(t testing.TB, n int) {
	t.Helper()
	ctx := context.Background()
	stock, err := e.rdb.HGet(ctx, e.keys.State(e.v.ID), "stock").Int()
	if err != nil {
		t.Fatal(err)
	}
	buyers, err := e.w.buyers(ctx, e.v.ID)
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for i := range n {
		m := e.order(i)
		if buyers[strconv.FormatInt(m.UserID, 10)] != strconv.FormatInt(m.OrderID, 10) {
			missing++
		}
	}
	if stock != e.v.TotalStock-n || len(buyers) != n || missing != 0 {
		t.Fatalf("rebuilt stock %d, %d buyers, %d orders missing; want %d, %d, 0", stock, len(buyers), missing, e.v.TotalStock-n, n)
	}
	if ready, err := e.rdb.Exists(ctx, e.keys.Ready(0)).Result(); err != nil || ready != 1 {
		t.Fatalf("shard not reopened (%d, %v)", ready, err)
	}
}

// TestRebuildMovesDuringPaging: the rebuild reads the backlog in pages
// while the worker moves orders from the stream to the delay queue (a
// buyer lock held elsewhere) and the delay poller moves them back. Every
// order keeps its reservation in the rebuilt state, and purchases, which
// would change the pending index the rebuild reads, still fail closed.
func TestRebuildMovesDuringPaging(t *testing.T) {
	t.Parallel()
	e := newPageEnv(t, testenv.Redis(t), 10_000)
	const n, delayed = 5000, 100
	e.backlog(t, n, delayed)
	e.lose(t)
	ctx := context.Background()
	q := mq.NewDelayQueue(e.rdb, e.keys.Delayed(0), e.keys.Stream(0))
	pages := 0
	e.w.afterPage = func() {
		pages++
		if pages > 2 {
			return
		}
		// Move the oldest stream entries to the delay queue, as retry.lua
		// does (in one step), and the delay queue's members to the end of
		// the stream, as the poller does.
		entries, err := e.rdb.XRangeN(ctx, e.keys.Stream(0), "-", "+", 50).Result()
		if err != nil {
			t.Error(err)
			return
		}
		pipe := e.rdb.TxPipeline()
		for _, x := range entries {
			m, err := Decode(x.Values)
			if err != nil {
				t.Error(err)
				return
			}
			pipe.ZAdd(ctx, q.Key(), redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: payload(m)})
			pipe.XDel(ctx, e.keys.Stream(0), x.ID)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Error(err)
		}
		if moved, err := q.Forward(ctx, time.Now().Add(2*time.Hour), delayed); err != nil || moved == 0 {
			t.Errorf("forward: %d moved, %v", moved, err)
		}
		if _, err := NewReserver(e.rdb, e.keys).Reserve(ctx, e.v.ID, 1<<40, 1<<41); !errors.Is(err, ErrNotReady) {
			t.Errorf("purchase during the rebuild: %v, want ErrNotReady", err)
		}
	}
	if _, err := e.w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if pages < 2 {
		t.Fatalf("the backlog was read in %d page(s), want several", pages)
	}
	e.checkRebuilt(t, n)
	if diffs, err := e.w.Reconcile(ctx); err != nil || len(diffs) != 0 {
		t.Fatalf("reconcile: %+v, %v; want no difference", diffs, err)
	}
}

// TestRebuildLargeBacklog: a shard with 200,000 orders in flight (a long
// database outage, then Redis was replaced) is rebuilt, and reconciled,
// without any one command holding Redis for long. The server's SLOWLOG
// records about 5 ms for the longest command (a page of the pending index,
// or of buyers), where reading the whole backlog in one script took 2 to 5
// seconds, and loading the buyers in one call 1.5 to 2 seconds; the bound
// leaves room for a busy test machine.
func TestRebuildLargeBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 orders: not in -short")
	}
	t.Parallel()
	s := testenv.StartRedis(t, testenv.RedisOptions{})
	e := newPageEnv(t, s.Client(t), 300_000)
	const n, delayed = 200_000, 20_000
	e.backlog(t, n, delayed)
	e.lose(t)
	ctx := context.Background()
	for _, c := range [][]any{{"config", "set", "slowlog-log-slower-than", "0"}, {"config", "set", "slowlog-max-len", "100000"}, {"slowlog", "reset"}} {
		if err := e.rdb.Do(ctx, c...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.w.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	rebuild := longest(t, e.rdb)
	e.checkRebuilt(t, n)
	if err := e.rdb.Do(ctx, "slowlog", "reset").Err(); err != nil {
		t.Fatal(err)
	}
	if diffs, err := e.w.Reconcile(ctx); err != nil || len(diffs) != 0 {
		t.Fatalf("reconcile: %+v, %v; want no difference", diffs, err)
	}
	reconcile := longest(t, e.rdb)
	t.Logf("longest command: rebuild %v (%s), reconcile %v (%s)", rebuild.Duration, rebuild.Args[0], reconcile.Duration, reconcile.Args[0])
	const bound = 250 * time.Millisecond
	for _, l := range []redis.SlowLog{rebuild, reconcile} {
		if l.Duration > bound {
			t.Errorf("a command held Redis for %v (%v), want under %v", l.Duration, l.Args, bound)
		}
	}
}

// longest returns the longest command in the server's slow log.
func longest(t testing.TB, rdb *redis.Client) redis.SlowLog {
	t.Helper()
	logs, err := rdb.SlowLogGet(context.Background(), -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var top redis.SlowLog
	for _, l := range logs {
		if l.Duration > top.Duration {
			top = l
		}
	}
	if len(top.Args) > 4 {
		top.Args = append(top.Args[:4:4], "...")
	}
	if len(top.Args) == 0 {
		top.Args = []string{"(none)"}
	}
	return top
}
