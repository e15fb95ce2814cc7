package main

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/voucher"
)

// describeRedis logs, at start-up, where the shards live and warns about a
// layout that does not do what the settings ask: shards that leave
// masters idle on a cluster, or fewer replicas than a purchase waits for
// (each accepted purchase would then answer not_replicated). It changes
// nothing and gives up quietly when Redis does not answer yet.
func describeRedis(ctx context.Context, cfg config, rdb redis.UniversalClient, keys voucher.Keys, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if redisconn.IsCluster(rdb) {
		places, err := keys.Placement(ctx, rdb)
		if err != nil {
			log.Warn("cannot read where the shards live", "err", err)
			return
		}
		perMaster := map[string]int{}
		for _, p := range places {
			perMaster[p.Master]++
		}
		var count atomic.Int64 // ForEachMaster calls at once
		_ = redisconn.ForEachMaster(ctx, rdb, func(context.Context, *redis.Client) error { count.Add(1); return nil })
		masters := int(count.Load())
		log.Info("shards on the redis cluster", "shards", len(places), "per_master", perMaster)
		if masters > 0 && (len(places) < masters || len(places)%masters != 0) {
			log.Warn("SECKILL_SHARDS is not a multiple of the cluster's masters: some masters carry more of the sale than others, or none",
				"shards", len(places), "masters", masters)
		}
	}
	if cfg.WaitReplicas == 0 {
		return
	}
	var mu sync.Mutex
	short := map[string]int{}
	_ = redisconn.ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return nil
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_slaves:"); ok {
				if n, _ := strconv.Atoi(v); n < cfg.WaitReplicas {
					mu.Lock()
					short[c.Options().Addr] = n
					mu.Unlock()
				}
			}
		}
		return nil
	})
	if len(short) > 0 {
		log.Warn("masters with fewer replicas than SECKILL_REDIS_WAIT_REPLICAS: their accepted purchases answer not_replicated until replicas connect",
			"wait_replicas", cfg.WaitReplicas, "replicas_by_master", short)
	}
}
