package order

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// largestBatch is the largest worker batch (SECKILL_WORKER_BATCH) proven
// to go through end to end: the setting must not allow more.
const largestBatch = 2_000

// maxPlaceholders bounds the placeholders of one insert of orders (1,000
// orders of five columns), far below SQLite's limit of 32,766: a batch of
// any size is inserted in statements of at most this many.
const maxPlaceholders = 5_000

// TestWorkerLargestBatch: a consumer reading batches of the largest size
// the worker's setting allows takes that many accepted purchases in one
// read, writes them in one transaction and acknowledges them, on SQLite
// (embedded mode) and on MariaDB. Redis and the database agree afterwards.
func TestWorkerLargestBatch(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			g := testenv.DB(t, name)
			if _, err := schema.Apply(context.Background(), g); err != nil {
				t.Fatal(err)
			}
			// The most placeholders one insert of orders took: bounded
			// whatever the batch, or a larger batch passes SQLite's
			// 32,766 (and MySQL's 65,535) and stalls the shard. The
			// writer inserts on the transaction's connection, so the
			// connections are watched.
			var most atomic.Int64
			g.Statement.ConnPool = &placeholderPool{ConnPool: g.Statement.ConnPool, most: &most}
			drainLargestBatch(t, g)
			if n := most.Load(); n == 0 || n > maxPlaceholders {
				t.Fatalf("an insert of orders took %d placeholders, want at most %d", n, maxPlaceholders)
			}
		})
	}
}

// batchWatch hears the consumer and the writer: the largest batch read,
// and the last failure (a batch that fails is handed over again; one that
// always fails stalls the shard, and its failure is what the test reports).
type batchWatch struct {
	largest atomic.Int64
	mu      sync.Mutex
	err     error
}

func (b *batchWatch) fail(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
}

func (b *batchWatch) failed() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

func (b *batchWatch) Outcomes(int, int, int) {}
func (b *batchWatch) Reclaimed(int)          {}
func (b *batchWatch) RedisError(op string)   { b.fail(fmt.Errorf("consumer: redis %s failed", op)) }

func drainLargestBatch(t *testing.T, g *gorm.DB) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	v := voucher.Voucher{Title: "t", TotalStock: largestBatch, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	state := voucher.NewState(rdb, keys)
	if _, err := state.Load(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	if err := state.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	// Every unit sold before the worker starts: its first read takes a
	// whole batch.
	reserver := voucher.NewReserver(rdb, keys)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= largestBatch; i = next.Add(1) {
				if _, err := reserver.Reserve(ctx, v.ID, i, 1_000_000+i); err != nil {
					t.Errorf("purchase %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	watch := &batchWatch{}
	locks := NewLocks([]redis.UniversalClient{rdb}, 10*time.Second, quietLog)
	writer := NewWriter(g, rdb, keys, WriterConfig{Locks: locks, KeyPrefix: keys.Prefix()}, quietLog)
	handler := mq.HandlerFunc(func(ctx context.Context, batch []mq.Message) ([]mq.Outcome, error) {
		out, err := writer.Handle(ctx, batch)
		if err != nil {
			watch.fail(err)
		}
		return out, err
	})
	stream, delayed := keys.Stream(0), keys.Delayed(0)
	c := mq.NewConsumer(rdb, mq.ConsumerConfig{
		Stream: stream, Group: "orders", Consumer: "c", Batch: largestBatch, Block: 50 * time.Millisecond,
		Delay: mq.NewDelayQueue(rdb, delayed, stream), Observer: watch,
		AfterRead: func(n int) {
			if int64(n) > watch.largest.Load() {
				watch.largest.Store(int64(n))
			}
		},
	}, handler, quietLog)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	drained := func() bool {
		var orders int64
		if err := g.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", v.ID).Scan(&orders).Error; err != nil {
			t.Fatal(err)
		}
		p, err := rdb.XPending(ctx, stream, "orders").Result()
		if err != nil {
			return false
		}
		l, err := rdb.XLen(ctx, stream).Result()
		return err == nil && orders == largestBatch && p.Count == 0 && l == 0
	}
	deadline := time.Now().Add(60 * time.Second)
	for !drained() {
		if time.Now().After(deadline) {
			t.Fatalf("orders not all written and acknowledged within 60s; batch of %d, last failure: %v", watch.largest.Load(), watch.failed())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := watch.largest.Load(); n != largestBatch {
		t.Fatalf("largest batch read %d, want %d", n, largestBatch)
	}
	var stock, dead int64
	if err := g.WithContext(ctx).Raw("SELECT stock FROM vouchers WHERE id = ?", v.ID).Scan(&stock).Error; err != nil {
		t.Fatal(err)
	}
	if err := g.WithContext(ctx).Raw("SELECT COUNT(*) FROM dead_letters").Scan(&dead).Error; err != nil {
		t.Fatal(err)
	}
	redisStock, err := rdb.HGet(ctx, keys.State(v.ID), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	pending, err := rdb.HLen(ctx, keys.Pending(0)).Result()
	if err != nil {
		t.Fatal(err)
	}
	buyers, err := rdb.HLen(ctx, keys.Buyers(v.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if stock != 0 || dead != 0 || redisStock != 0 || pending != 0 || buyers != largestBatch {
		t.Fatalf("stock %d, dead letters %d, redis stock %d, pending index %d, buyers %d; want 0 0 0 0 %d",
			stock, dead, redisStock, pending, buyers, largestBatch)
	}
}

var quietLog = slog.New(slog.DiscardHandler)

// placeholderPool passes every call to its ConnPool and keeps in most the
// largest count of values an insert of orders had (placeholders, or
// values written into the statement), in transactions too.
type placeholderPool struct {
	gorm.ConnPool
	most *atomic.Int64
}

func (p *placeholderPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if strings.HasPrefix(query, "INSERT INTO orders") || strings.HasPrefix(query, "INSERT INTO `orders`") {
		// Values, with placeholders or written in: columns times rows.
		cols, rows, _ := strings.Cut(query, " VALUES ")
		n := int64(strings.Count(cols, ",")+1) * int64(strings.Count(rows, "),(")+1)
		if n > p.most.Load() {
			p.most.Store(n)
		}
	}
	return p.ConnPool.ExecContext(ctx, query, args...)
}

func (p *placeholderPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.ConnPool.(gorm.TxBeginner).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &placeholderTx{placeholderPool{tx, p.most}, tx}, nil
}

func (p *placeholderPool) GetDBConn() (*sql.DB, error) {
	if db, ok := p.ConnPool.(*sql.DB); ok {
		return db, nil
	}
	return nil, errors.New("not a *sql.DB")
}

// placeholderTx is a transaction of placeholderPool.
type placeholderTx struct {
	placeholderPool
	tx *sql.Tx
}

func (t *placeholderTx) Commit() error   { return t.tx.Commit() }
func (t *placeholderTx) Rollback() error { return t.tx.Rollback() }
