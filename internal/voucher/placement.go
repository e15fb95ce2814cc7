package voucher

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
)

// ShardPlace is where a shard's keys live.
type ShardPlace struct {
	Shard int
	Tag   string // the hash-tagged head of the shard's keys
	Slot  int    // the cluster hash slot of every key of the shard
	// Master is the address of the server holding the shard: on a cluster
	// the master serving Slot, "" when no master serves it.
	Master string
}

// Placement reports which server holds each shard, for an operator checking
// that the shards spread over a cluster's masters. On a cluster it asks the
// cluster for its slot map once (CLUSTER SLOTS); on a single server every
// shard is on that server.
func (k Keys) Placement(ctx context.Context, rdb redis.UniversalClient) ([]ShardPlace, error) {
	places := make([]ShardPlace, k.Shards())
	for s := range places {
		tag := k.Tag(s)
		places[s] = ShardPlace{Shard: s, Tag: tag, Slot: redisconn.Slot(tag)}
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		ranges, err := c.ClusterSlots(ctx).Result()
		if err != nil {
			return nil, fmt.Errorf("shard placement: cluster slots: %w", err)
		}
		slices.SortFunc(ranges, func(a, b redis.ClusterSlot) int { return cmp.Compare(a.Start, b.Start) })
		for i := range places {
			places[i].Master = masterOf(ranges, places[i].Slot)
		}
	case *redis.Client:
		for i := range places {
			places[i].Master = c.Options().Addr
		}
	default:
		return nil, fmt.Errorf("shard placement: redis client %T is neither one server nor a cluster", rdb)
	}
	return places, nil
}

// masterOf returns the address of the master serving slot in ranges, sorted
// by first slot, or "" when no range holds it.
func masterOf(ranges []redis.ClusterSlot, slot int) string {
	i, _ := slices.BinarySearchFunc(ranges, slot, func(r redis.ClusterSlot, s int) int { return cmp.Compare(r.Start, s) })
	if i == len(ranges) || ranges[i].Start != slot {
		i-- // the range starting before slot, which may reach it
	}
	if i < 0 || ranges[i].End < slot || len(ranges[i].Nodes) == 0 {
		return ""
	}
	return ranges[i].Nodes[0].Addr
}
