package load

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// DrainConfig says which voucher's drain to time.
type DrainConfig struct {
	VoucherID int64
	Expect    int // orders MySQL holds when the drain is done
	RedisURL  string
	MySQLDSN  string
	KeyPrefix string
	Shards    int
	Group     string        // default order-writers
	Timeout   time.Duration // default 10m
	Log       io.Writer
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
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return DrainResult{}, fmt.Errorf("redis url: %w", err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	keys := voucher.NewKeys(cfg.KeyPrefix, cfg.Shards)
	stream := keys.Stream(keys.Shard(cfg.VoucherID))

	count := func() (int, error) {
		var n int64
		err := g.WithContext(ctx).Raw("SELECT COUNT(*) FROM orders WHERE voucher_id = ?", cfg.VoucherID).Scan(&n).Error
		return int(n), err
	}
	pending := func() (int64, error) {
		p, err := rdb.XPending(ctx, stream, cfg.Group).Result()
		if err != nil {
			if mq.IsNoGroup(err) {
				return 0, nil
			}
			return 0, err
		}
		return p.Count, nil
	}
	watch := time.Now()
	deadline := watch.Add(cfg.Timeout)
	first, err := count()
	if err != nil {
		return DrainResult{}, err
	}
	fmt.Fprintf(cfg.Log, "watching voucher %d: %d of %d orders in MySQL; start the worker now\n", cfg.VoucherID, first, cfg.Expect)
	var began time.Time
	base, lastLog := first, watch
	for {
		n, err := count()
		if err != nil {
			return DrainResult{}, err
		}
		now := time.Now()
		if began.IsZero() && n > first {
			// The first batch landed; count from the state before it.
			began, base = now, first
		}
		if n >= cfg.Expect {
			p, err := pending()
			if err != nil {
				return DrainResult{}, err
			}
			if p == 0 {
				if began.IsZero() {
					return DrainResult{}, fmt.Errorf("voucher %d already had %d orders when the watch began", cfg.VoucherID, n)
				}
				secs := now.Sub(began).Seconds()
				return DrainResult{Orders: n - base, Seconds: secs, Rate: float64(n-base) / secs, WaitSeconds: began.Sub(watch).Seconds()}, nil
			}
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
