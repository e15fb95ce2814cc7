package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
)

// redisReadiness is what /readyz says about Redis: whether every server
// the sale needs answers, whether a cluster serves every slot, and whether
// every shard's state is loaded. Each failing part is named.
type redisReadiness struct {
	down      []string // masters that do not answer (on one server: its address)
	clusterOK bool     // every master reports cluster_state:ok (always true off a cluster)
	states    []string // cluster_state of the masters that answered and are not ok
	notLoaded []int    // shards whose ready marker is missing or cannot be read
}

func (r redisReadiness) ok() bool {
	return len(r.down) == 0 && r.clusterOK && len(r.notLoaded) == 0
}

// checkRedis asks every master (the one server off a cluster) for PING and,
// on a cluster, CLUSTER INFO; then every shard's ready marker.
func checkRedis(ctx context.Context, rdb redis.UniversalClient, shardReady func(int) string, shards int) redisReadiness {
	r := redisReadiness{clusterOK: true}
	cluster := redisconn.IsCluster(rdb)
	var mu sync.Mutex
	err := redisconn.ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		if err := c.Ping(ctx).Err(); err != nil {
			mu.Lock()
			r.down = append(r.down, addr)
			mu.Unlock()
			return nil
		}
		if !cluster {
			return nil
		}
		state := "unknown"
		if info, err := c.ClusterInfo(ctx).Result(); err == nil {
			for line := range strings.Lines(info) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_state:"); ok {
					state = v
				}
			}
		}
		if state != "ok" {
			mu.Lock()
			r.clusterOK = false
			r.states = append(r.states, addr+": "+state)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		// The cluster's slot map could not be read: no master is known.
		r.down = append(r.down, "cluster: "+err.Error())
		r.clusterOK = !cluster
	}
	if !cluster && len(r.down) > 0 {
		// The one server is down: no shard can be loaded.
		for shard := range shards {
			r.notLoaded = append(r.notLoaded, shard)
		}
		return r
	}
	pipe := rdb.Pipeline()
	exists := make([]*redis.IntCmd, shards)
	for shard := range shards {
		exists[shard] = pipe.Exists(ctx, shardReady(shard))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	for shard, cmd := range exists {
		if n, err := cmd.Result(); err != nil || n == 0 {
			r.notLoaded = append(r.notLoaded, shard)
		}
	}
	slices.Sort(r.down)
	slices.Sort(r.states)
	return r
}

// report adds the checks and, for what failed, the details.
func (r redisReadiness) report(checks, detail gin.H, cluster bool) {
	checks["redis"] = "up"
	if len(r.down) > 0 {
		checks["redis"] = "down"
		detail["redis_down"] = r.down
	}
	if cluster {
		checks["cluster"] = "ok"
		if !r.clusterOK {
			checks["cluster"] = "fail"
			detail["cluster_state"] = r.states
		}
	}
	checks["shards"] = "loaded"
	if len(r.notLoaded) > 0 {
		checks["shards"] = "not_loaded"
		detail["shards_not_loaded"] = r.notLoaded
	}
}

// String is the readiness in one line, for logs.
func (r redisReadiness) String() string {
	return fmt.Sprintf("down=%v cluster_ok=%v not_loaded=%v", r.down, r.clusterOK, r.notLoaded)
}
