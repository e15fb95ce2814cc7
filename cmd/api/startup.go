package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/order"
	"seckill/internal/redisconn"
	"seckill/internal/voucher"
)

// checkShardCount holds SECKILL_SHARDS against the count the data in
// Redis was written with (recorded at start-up). Another count moves
// vouchers to other shards and, on a cluster, renames every stream: the
// old streams' orders and pay deadlines would wait for a worker that no
// longer reads them. So a change is refused while the old layout's order
// streams, retry delay queues, pay-deadline streams or pay-deadline delay
// queues hold anything, and once they are drained it is taken: every
// shard's state is rebuilt from the database. A Redis that does not answer
// is left to the warmer and the probes.
func checkShardCount(ctx context.Context, cfg config, rdb redis.UniversalClient, keys voucher.Keys, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	key := shardCountKey(cfg.KeyPrefix)
	was, err := rdb.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return rdb.Set(ctx, key, cfg.Shards, 0).Err()
	case err != nil:
		log.Warn("cannot read the shard count the data was written with; not checked", "err", err)
		return nil
	}
	old, err := strconv.Atoi(was)
	if err != nil || old == cfg.Shards {
		return err
	}
	oldKeys := voucher.KeysFor(cfg.KeyPrefix, old, redisconn.IsCluster(rdb))
	left, err := backlogOf(ctx, rdb, oldKeys)
	if err != nil {
		return fmt.Errorf("SECKILL_SHARDS=%d, but the data in Redis was written with %d shards and its streams cannot be read: %w", cfg.Shards, old, err)
	}
	if left.orders > 0 || left.deadlines > 0 {
		return fmt.Errorf("SECKILL_SHARDS=%d, but the data in Redis was written with %d shards, and its streams and delay queues still hold "+
			"%d orders not yet written and %d pay deadlines not yet handled, which no worker would read: keep SECKILL_SHARDS=%d, "+
			"stop purchases and let the workers drain them (seckill_stream_length and seckill_delay_queue_size at 0, and "+
			"SECKILL_PAY_WINDOW past the last purchase for the pay deadlines), then stop every instance and start them all with SECKILL_SHARDS=%d",
			cfg.Shards, old, left.orders, left.deadlines, old, cfg.Shards)
	}
	log.Warn("SECKILL_SHARDS changed on existing data; the old streams are empty, so every shard's state is rebuilt from the database under the new count",
		"was", old, "now", cfg.Shards)
	for shard := range keys.Shards() {
		if err := rdb.Del(ctx, keys.Ready(shard)).Err(); err != nil {
			return fmt.Errorf("drop shard %d's ready marker: %w", shard, err)
		}
	}
	return rdb.Set(ctx, key, cfg.Shards, 0).Err()
}

// backlog is what a shard layout's streams and delay queues still hold.
type backlog struct {
	orders    int64 // order stream entries and orders waiting to go back onto it
	deadlines int64 // pay deadlines due on their stream or waiting in their queue
}

// backlogOf counts the entries of every shard's order stream, retry delay
// queue, pay-deadline stream and pay-deadline delay queue under keys.
func backlogOf(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys) (backlog, error) {
	var b backlog
	for shard := range keys.Shards() {
		n, err := entries(ctx, rdb, keys.Stream(shard), keys.Delayed(shard))
		if err != nil {
			return backlog{}, err
		}
		b.orders += n
		stream, queue := order.ExpiryKeys(keys, shard)
		n, err = entries(ctx, rdb, stream, queue)
		if err != nil {
			return backlog{}, err
		}
		b.deadlines += n
	}
	return b, nil
}

// entries is the length of a stream plus the size of its delay queue.
func entries(ctx context.Context, rdb redis.UniversalClient, stream, queue string) (int64, error) {
	l, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		return 0, err
	}
	z, err := rdb.ZCard(ctx, queue).Result()
	if err != nil {
		return 0, err
	}
	return l + z, nil
}

// warnUnpayable warns when priced vouchers are on sale while payments are
// off: each of their orders waits for a payment nobody can make, then
// expires.
func warnUnpayable(ctx context.Context, cfg config, c *core) {
	if cfg.Pay.Provider != "off" {
		return
	}
	live, err := c.vstore.Live(ctx, time.Now())
	if err != nil {
		c.log.Warn("cannot list the vouchers on sale to check their prices", "err", err)
		return
	}
	var priced []int64
	for _, v := range live {
		if v.Price > 0 {
			priced = append(priced, v.ID)
		}
	}
	if len(priced) > 0 {
		c.log.Warn("priced vouchers are on sale while payments are off (SECKILL_PAY_PROVIDER=off): their orders cannot be paid and expire; "+
			"set SECKILL_PAY_PROVIDER=webhook with SECKILL_PAY_GATEWAY_URL and SECKILL_PAY_WEBHOOK_SECRET", "voucher_ids", priced)
	}
}

// checkCoverage reads cluster-require-full-coverage from every node of a
// Redis Cluster. Where it is yes, one master's failure makes the whole
// cluster refuse every command until the failover ends: every shard, and
// every bucket of every voucher, answers 503, where a voucher of several
// buckets is meant to stop only the dead master's bucket. Start-up is
// refused then (SECKILL_FULL_COVERAGE=warn only warns). A node that does
// not answer CONFIG GET (a managed service may forbid it) is warned about.
func checkCoverage(ctx context.Context, cfg config, rdb redis.UniversalClient, log *slog.Logger) error {
	if !redisconn.IsCluster(rdb) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var full, unknown []string
	// Every node, replicas too: a replica takes its master's place in a
	// failover, with its own setting.
	addrs, err := clusterNodes(ctx, rdb)
	for _, addr := range addrs {
		c := nodeClient(rdb, addr)
		v, err := c.ConfigGet(ctx, "cluster-require-full-coverage").Result()
		_ = c.Close()
		switch {
		case err != nil || v["cluster-require-full-coverage"] == "":
			unknown = append(unknown, addr)
		case v["cluster-require-full-coverage"] == "yes":
			full = append(full, addr)
		}
	}
	if err != nil {
		// Some masters did not list their nodes: those found still count.
		log.Warn("cannot list every node of the cluster; cluster-require-full-coverage read from those found", "err", err, "nodes", addrs)
	}
	if len(unknown) > 0 {
		log.Warn("cannot read cluster-require-full-coverage from these nodes; set it to no so that one master down stops only its own shards", "nodes", unknown)
	}
	if len(full) == 0 {
		return nil
	}
	slices.Sort(full)
	msg := fmt.Sprintf("the Redis Cluster nodes %v have cluster-require-full-coverage yes: one master down would stop every shard and every bucket for the whole failover; "+
		"set it to no on every node (CONFIG SET cluster-require-full-coverage no, and in redis.conf), or start with SECKILL_FULL_COVERAGE=warn", full)
	if cfg.FullCoverage == "warn" {
		log.Warn(msg)
		return nil
	}
	return errors.New(msg)
}

// clusterNodes lists the address of every node of the cluster, masters
// and replicas, from CLUSTER NODES of each master (failed nodes left out):
// the cluster client's own ForEachShard visits the masters only (it knows
// replicas when it routes reads to them).
func clusterNodes(ctx context.Context, rdb redis.UniversalClient) ([]string, error) {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	err := redisconn.ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		text, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || strings.Contains(f[2], "fail") || strings.Contains(f[2], "noaddr") {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			seen[addr] = true
		}
		return nil
	})
	addrs := slices.Sorted(maps.Keys(seen))
	return addrs, err
}

// nodeClient is a client of one node of rdb's cluster, with its options.
func nodeClient(rdb redis.UniversalClient, addr string) *redis.Client {
	o := rdb.(*redis.ClusterClient).Options()
	return redis.NewClient(&redis.Options{Addr: addr, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, PoolSize: 1})
}
