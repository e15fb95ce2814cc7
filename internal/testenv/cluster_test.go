package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/testenv"
)

// startCluster starts a 3x1 cluster and logs how long it took: start-up
// time is what every cluster test pays.
func startCluster(t *testing.T) *testenv.Cluster {
	t.Helper()
	began := time.Now()
	c := testenv.StartCluster(t, testenv.ClusterOptions{})
	t.Logf("3x1 cluster healthy in %s", time.Since(began).Round(time.Millisecond))
	return c
}

// setSpread writes n keys with no hash tag, which land on every master,
// and returns them with their values.
func setSpread(t *testing.T, rdb redis.UniversalClient, prefix string, n int) map[string]string {
	t.Helper()
	ctx := context.Background()
	kv := map[string]string{}
	for i := range n {
		k, v := fmt.Sprintf("%s:%d", prefix, i), fmt.Sprintf("v%d", i)
		if err := rdb.Set(ctx, k, v, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
		kv[k] = v
	}
	return kv
}

func checkAll(t *testing.T, rdb redis.UniversalClient, kv map[string]string) {
	t.Helper()
	ctx := context.Background()
	for k, want := range kv {
		if got, err := rdb.Get(ctx, k).Result(); err != nil || got != want {
			t.Fatalf("get %s = %q, %v; want %q", k, got, err, want)
		}
	}
}

// checkServesAll fails unless n says the cluster is ok and sees every slot
// served by a node other than gone, at once: no waiting.
func checkServesAll(t *testing.T, n *testenv.ClusterNode, gone *testenv.ClusterNode) {
	t.Helper()
	ctx := context.Background()
	rdb := n.Client(t)
	info, err := rdb.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("cluster info on %s: %v\n%s", n.Addr, err, info)
	}
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("cluster slots on %s: %v", n.Addr, err)
	}
	served := 0
	for _, r := range ranges {
		if r.Nodes[0].ID == gone.ID {
			t.Fatalf("%s: slots %d-%d still on %s", n.Addr, r.Start, r.End, gone.Addr)
		}
		served += r.End - r.Start + 1
	}
	if served != 16384 {
		t.Fatalf("%s: %d slots served, want 16384", n.Addr, served)
	}
}

func TestStartClusterServesEverySlot(t *testing.T) {
	t.Parallel()
	c := startCluster(t)

	nodes := c.Nodes()
	if len(nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(nodes))
	}
	ids := map[string]bool{}
	for _, n := range nodes {
		if n.ID == "" || ids[n.ID] || n.Addr == "" || n.Dir == "" {
			t.Fatalf("node %+v: empty or repeated id, no address or no directory", n)
		}
		ids[n.ID] = true
	}
	if m := c.Masters(t); len(m) != 3 {
		t.Fatalf("%d masters, want 3", len(m))
	}

	target, err := redisconn.Parse(c.URL())
	if err != nil || !target.IsCluster() || len(target.Cluster.Addrs) != 6 {
		t.Fatalf("redisconn.Parse(%q) = %+v, %v; want a cluster of 6 addresses", c.URL(), target, err)
	}
	rdb := target.Open(redisconn.Tuning{})
	t.Cleanup(func() { _ = rdb.Close() })

	kv := setSpread(t, rdb, testenv.Prefix(t), 200)
	checkAll(t, c.Client(t), kv)
	served := map[*testenv.ClusterNode]bool{}
	for k := range kv {
		served[c.MasterOf(t, k)] = true
	}
	if len(served) != 3 {
		t.Fatalf("200 keys served by %d masters, want 3", len(served))
	}
}

func TestClusterFailoverKeepsReplicatedWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startCluster(t)
	rdb := c.Client(t)
	kv := setSpread(t, rdb, testenv.Prefix(t), 100)

	key := testenv.Prefix(t) + ":waited"
	master := c.MasterOf(t, key)
	// WAIT counts the replicas that have this connection's writes, so the
	// write and the WAIT share one: a pipeline on the master's own client.
	var wait *redis.IntCmd
	if _, err := master.Client(t).Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, "kept", 0)
		wait = redis.NewIntCmd(ctx, "WAIT", 1, 1000)
		_ = p.Process(ctx, wait)
		return nil
	}); err != nil || wait.Val() != 1 {
		t.Fatalf("set and wait on %s: %d replicas, %v; want 1", master.Addr, wait.Val(), err)
	}
	kv[key] = "kept"

	began := time.Now()
	master.Kill(t)
	c.WaitFailover(t, master, time.Minute)
	t.Logf("failover in %s", time.Since(began).Round(time.Millisecond))
	for _, n := range c.Nodes() {
		if n != master {
			checkServesAll(t, n, master)
		}
	}
	if now := c.MasterOf(t, key); now == master {
		t.Fatalf("%s still serves %s after it was killed", master.Addr, key)
	}
	if slices.Contains(c.Masters(t), master) {
		t.Fatalf("killed %s is still listed as a master", master.Addr)
	}

	// The client learns the new slot map on its first failed call: retry
	// those, but a missing key is lost data.
	testenv.WaitFor(t, 30*time.Second, "client reads "+key+" from the new master", func() bool {
		got, err := rdb.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) || err == nil && got != "kept" {
			t.Fatalf("get %s after failover = %q, %v; want kept", key, got, err)
		}
		return err == nil
	})
	checkAll(t, rdb, kv)

	// Back from its nodes.conf, the old master rejoins as a replica of the
	// node that took its slots.
	master.Restart(t)
	c.WaitHealthy(t, time.Minute)
	if slices.Contains(c.Masters(t), master) {
		t.Fatalf("restarted %s came back as a master", master.Addr)
	}
	checkAll(t, rdb, kv)
}

func TestClusterMigrateSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := startCluster(t)
	rdb := c.Client(t)

	tag := "{" + testenv.Prefix(t) + "}" // every key in one slot
	kv := setSpread(t, rdb, tag, 50)
	slot := c.KeySlot(t, tag)
	from := c.MasterOf(t, tag)
	var to *testenv.ClusterNode
	for _, m := range c.Masters(t) {
		if m != from {
			to = m
			break
		}
	}

	m := c.BeginMigrate(t, slot, to)
	if moved := m.MoveKeys(t, 20); moved != 20 {
		t.Fatalf("first batch moved %d keys, want 20", moved)
	}
	// Half moved: the client follows ASK redirections for the moved keys,
	// and a new key goes to the importing node.
	checkAll(t, rdb, kv)
	if err := rdb.Set(ctx, tag+":new", "during", 0).Err(); err != nil {
		t.Fatalf("set during migration: %v", err)
	}
	kv[tag+":new"] = "during"
	m.Finish(t)

	if now := c.MasterOf(t, tag); now != to {
		t.Fatalf("slot %d served by %s after the move, want %s", slot, now.Addr, to.Addr)
	}
	n, err := to.Client(t).ClusterCountKeysInSlot(ctx, slot).Result()
	if err != nil || n != int64(len(kv)) {
		t.Fatalf("%s holds %d keys of slot %d, %v; want %d", to.Addr, n, slot, err, len(kv))
	}
	checkAll(t, rdb, kv)

	c.MigrateSlot(t, slot, from)
	checkAll(t, rdb, kv)
	c.WaitHealthy(t, 30*time.Second)
}
