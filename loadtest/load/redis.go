package load

import (
	"fmt"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/voucher"
)

// openSale opens the deployment's Redis, a single server or a Redis
// Cluster as the URL says, with go-redis's defaults, and the key names the
// service gives the sale there: on a cluster its shards carry other hash
// tags than on a single server.
func openSale(url, prefix string, shards int) (redis.UniversalClient, voucher.Keys, error) {
	rdb, err := redisconn.Open(url, redisconn.Tuning{})
	if err != nil {
		return nil, voucher.Keys{}, fmt.Errorf("redis url: %w", err)
	}
	return rdb, voucher.KeysFor(prefix, shards, redisconn.IsCluster(rdb)), nil
}
