package load

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/mq"
)

// DrainConfig says which voucher's drain to time.
type DrainConfig struct {
	VoucherID int64
	Expect    int    // orders MySQL holds when the drain is done
	RedisURL  string // one server or a Redis Cluster (redis-cluster://)
	MySQLDSN  string
	KeyPrefix string
	Shards    int
	Group     string        // default order-writers
	Timeout   time.Duration // default 10m
	Log       io.Writer
	// Watching, when set, runs once the watch has counted the orders
	// already there, before it says to start the worker: a caller
	// snapshots what the drain will cost from there.
	Watching func()
}

// DrainResult is how fast the orders went from the stream into MySQL.
type DrainResult struct {
	Orders      int     `json:"orders"`  // written while the clock ran
	Seconds     float64 `json:"seconds"` // from the first new order to the last
	Rate        float64 `json:"orders_per_second"`
	WaitSeconds float64 `json:"wait_seconds"` // from the start of the watch to the first new order
}

// Drain watches the voucher's orders in MySQL until there are Expect of
// them and the group has nothing pending. The clock starts at the first
// order written after the watch began.
func Drain(ctx context.Context, cfg DrainConfig) (DrainResult, error) {
	cfg.Group = cmp.Or(cfg.Group, "order-writers")
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Minute)
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	g, err := db.OpenMySQL(cfg.MySQLDSN, 2)
	if err != nil {
		return DrainResult{}, err
	}
	defer db.Close(g)
	rdb, keys, err := openSale(cfg.RedisURL, cfg.KeyPrefix, cfg.Shards)
	if err != nil {
		return DrainResult{}, err
	}
	defer rdb.Close()
	w := &drainWatch{cfg: cfg, g: g, rdb: rdb, stream: keys.Stream(keys.Shard(cfg.VoucherID))}
	return w.run(ctx)
}

// drainWatch watches one voucher's drain: its orders in MySQL and what
// its group holds pending on the voucher's stream.
type drainWatch struct {
	cfg    DrainConfig
	g      *gorm.DB
	rdb    redis.UniversalClient
	stream string
	// noCounters: the schema has no order counters (older than
	// migration 10); orders are counted one by one.
	noCounters bool
}

// run polls every 20ms until the drain is done, logging the count every
// second; it fails when the timeout passes first or the voucher had its
// orders before the watch began.
func (w *drainWatch) run(ctx context.Context) (DrainResult, error) {
	cfg := w.cfg
	watch := time.Now()
	deadline := watch.Add(cfg.Timeout)
	first, err := w.orders(ctx)
	if err != nil {
		return DrainResult{}, err
	}
	if cfg.Watching != nil {
		cfg.Watching()
	}
	fmt.Fprintf(cfg.Log, "watching voucher %d: %d of %d orders in MySQL; start the worker now\n", cfg.VoucherID, first, cfg.Expect)
	var began time.Time
	lastLog, lastNone := watch, watch
	for {
		n, err := w.orders(ctx)
		if err != nil {
			return DrainResult{}, err
		}
		now := time.Now()
		switch {
		case began.IsZero() && n > first:
			// The first batch landed since the last look that saw none:
			// count from that look (at most one poll early), so a drain
			// that lands whole between two looks still has a time.
			began = lastNone
		case began.IsZero():
			lastNone = now
		}
		done, err := w.done(ctx, n)
		if err != nil {
			return DrainResult{}, err
		}
		if done {
			if began.IsZero() {
				return DrainResult{}, fmt.Errorf("voucher %d already had %d orders when the watch began", cfg.VoucherID, n)
			}
			if err := w.counted(ctx, n); err != nil {
				return DrainResult{}, err
			}
			secs := now.Sub(began).Seconds()
			return DrainResult{Orders: n - first, Seconds: secs, Rate: float64(n-first) / secs, WaitSeconds: began.Sub(watch).Seconds()}, nil
		}
		if now.After(deadline) {
			return DrainResult{}, fmt.Errorf("after %s: %d of %d orders in MySQL", cfg.Timeout, n, cfg.Expect)
		}
		if now.Sub(lastLog) >= time.Second {
			fmt.Fprintf(cfg.Log, "%d of %d orders in MySQL\n", n, cfg.Expect)
			lastLog = now
		}
		if !sleepUntil(ctx, now.Add(20*time.Millisecond)) {
			return DrainResult{}, ctx.Err()
		}
	}
}

// orders counts the voucher's orders in MySQL: the sum of its order
// counters, which the writer keeps in the transaction that writes the
// orders, so one look reads a few rows however many orders there are. A
// COUNT(*) over the voucher's index range instead walks every order at
// every look (every 20 ms: over a drain of 20,000 orders in about 2 s,
// 35 index reads per order written), charged to MariaDB's figure. A schema
// older than the counters is counted that way.
func (w *drainWatch) orders(ctx context.Context) (int, error) {
	var n int64
	if !w.noCounters {
		err := w.g.WithContext(ctx).Raw("SELECT COALESCE(SUM(n), 0) FROM order_counts WHERE voucher_id = ?", w.cfg.VoucherID).Scan(&n).Error
		if !noSuchTable(err) {
			return int(n), err
		}
		w.noCounters = true
	}
	err := w.g.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", w.cfg.VoucherID).Scan(&n).Error
	return int(n), err
}

// done reports whether the drain is over: n orders are all that were
// expected, and the group holds nothing pending (no group: nothing).
func (w *drainWatch) done(ctx context.Context, n int) (bool, error) {
	if n < w.cfg.Expect {
		return false, nil
	}
	p, err := w.rdb.XPending(ctx, w.stream, w.cfg.Group).Result()
	switch {
	case mq.IsNoGroup(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return p.Count == 0, nil
}

// counted checks, once the drain is done, that the counters' n is the
// voucher's orders counted one by one: a writer that counted wrong would
// otherwise end the watch early or never.
func (w *drainWatch) counted(ctx context.Context, n int) error {
	if w.noCounters {
		return nil
	}
	var rows int64
	if err := w.g.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", w.cfg.VoucherID).Scan(&rows).Error; err != nil {
		return err
	}
	if int(rows) != n {
		return fmt.Errorf("voucher %d: its order counters say %d orders, MySQL holds %d", w.cfg.VoucherID, n, rows)
	}
	return nil
}

// noSuchTable reports MySQL's error for a table that does not exist.
func noSuchTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}
