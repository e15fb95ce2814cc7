package bucket

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// testVoucher is the voucher every test moves units of: with 3 shards
// and 3 buckets its buckets sit on shards 1, 2, 0.
const testVoucher = 7

// env is one test's voucher of len(stocks) buckets, each loaded with its
// stock (alloc = stock, out 0) and its shard ready.
type env struct {
	tb    testing.TB
	rdb   redis.UniversalClient
	keys  voucher.Keys
	v     int64
	nb    int
	total int64
}

// newEnv loads the buckets on the shared Redis under a fresh prefix.
func newEnv(tb testing.TB, stocks ...int64) *env {
	tb.Helper()
	return loadEnv(tb, testenv.Redis(tb), voucher.NewKeys(testenv.Prefix(tb), 3), stocks...)
}

func loadEnv(tb testing.TB, rdb redis.UniversalClient, keys voucher.Keys, stocks ...int64) *env {
	tb.Helper()
	e := &env{tb: tb, rdb: rdb, keys: keys, v: testVoucher, nb: len(stocks)}
	for _, s := range stocks {
		e.total += s
	}
	ctx := context.Background()
	for b, s := range stocks {
		err := rdb.HSet(ctx, e.state(b), "stock", s, "begin_ms", 0, "end_ms", time.Now().Add(time.Hour).UnixMilli(),
			voucher.FieldBuckets, e.nb, voucher.FieldTotal, e.total, voucher.FieldAlloc, s, voucher.FieldOut, 0).Err()
		if err != nil {
			tb.Fatal(err)
		}
		if err := rdb.Set(ctx, keys.Ready(e.shard(b)), "1", 0).Err(); err != nil {
			tb.Fatal(err)
		}
	}
	return e
}

func (e *env) shard(b int) int      { return e.keys.BucketShard(e.v, b, e.nb) }
func (e *env) state(b int) string   { return e.keys.StateAt(e.shard(b), e.v) }
func (e *env) journal(b int) string { return journalKey(e.keys, e.shard(b)) }

// mover returns a Mover on the env's Redis with cfg, logging to nowhere.
func (e *env) mover(cfg Config) *Mover {
	return NewMover(e.rdb, e.keys, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// bucket is the stock, alloc and out of bucket b.
type bucketState struct{ stock, alloc, out int64 }

func (e *env) bucket(b int) bucketState {
	e.tb.Helper()
	vals, err := e.rdb.HMGet(context.Background(), e.state(b), "stock", voucher.FieldAlloc, voucher.FieldOut).Result()
	if err != nil {
		e.tb.Fatal(err)
	}
	var n [3]int64
	for i, x := range vals {
		s, _ := x.(string)
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			e.tb.Fatalf("bucket %d field %d = %v: %v", b, i, x, err)
		}
	}
	return bucketState{n[0], n[1], n[2]}
}

// stocks is every bucket's stock.
func (e *env) stocks() []int64 {
	out := make([]int64, e.nb)
	for b := range e.nb {
		out[b] = e.bucket(b).stock
	}
	return out
}

// journaled counts the moves in every bucket's journal.
func (e *env) journaled() int64 {
	e.tb.Helper()
	var n int64
	for b := range e.nb {
		c, err := e.rdb.HLen(context.Background(), e.journal(b)).Result()
		if err != nil {
			e.tb.Fatal(err)
		}
		n += c
	}
	return n
}

// settled checks conservation with every move closed: the journals are
// empty, no bucket owes a move (out 0), no stock is negative, and the
// allocs add up to the total.
func (e *env) settled() {
	e.tb.Helper()
	if n := e.journaled(); n != 0 {
		e.tb.Errorf("%d moves still journaled", n)
	}
	var sum int64
	for b := range e.nb {
		s := e.bucket(b)
		if s.stock < 0 || s.out != 0 {
			e.tb.Errorf("bucket %d: %+v", b, s)
		}
		sum += s.alloc + s.out
	}
	if sum != e.total {
		e.tb.Errorf("sum(alloc)+sum(out) = %d, total %d", sum, e.total)
	}
}

// recoverAll runs a Recoverer until the journals are empty: a fresh
// entry is not stale until a millisecond of Redis time has passed.
func (e *env) recoverAll(r *Recoverer) {
	e.tb.Helper()
	testenv.WaitFor(e.tb, 5*time.Second, "journals recovered", func() bool {
		if err := r.Once(context.Background()); err != nil {
			e.tb.Fatal(err)
		}
		return e.journaled() == 0
	})
}

// stopAfter is an AfterStep hook that stops every move after step.
func stopAfter(step string) func(string) bool {
	return func(s string) bool { return s == step }
}
