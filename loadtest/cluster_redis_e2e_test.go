//go:build linux

package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestClusterOnRedisCluster: scripts/cluster-up.sh with
// SECKILL_CLUSTER_REDIS=cluster starts six Redis Cluster nodes, each the
// process its pidfile names, forms 3 masters with 1 replica each, hands the
// instances a redis-cluster:// URL naming every node with 3 shards, one per
// master; the instances answer through nginx and sell a voucher's stock
// exactly, with every invariant of the load generator's check; the ceiling
// server starts on the same cluster; scripts/cluster-down.sh then leaves
// none of the processes it started.
func TestClusterOnRedisCluster(t *testing.T) {
	c := startCluster(t,
		"SECKILL_CLUSTER_REDIS=cluster",
		"SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000", "SECKILL_RATE_LIMIT=off",
	)
	ports := c.nodePorts

	// cluster.env: the cluster URL with every node as a seed, one shard per
	// master.
	target, err := redisconn.Parse(c.env["SECKILL_REDIS_URL"])
	if err != nil || !target.IsCluster() {
		t.Fatalf("SECKILL_REDIS_URL %q is no Redis Cluster URL: %v", c.env["SECKILL_REDIS_URL"], err)
	}
	var want []string
	for _, p := range ports {
		want = append(want, "127.0.0.1:"+p)
	}
	if got := slices.Sorted(slices.Values(target.Cluster.Addrs)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("the cluster URL names %v, want every node %v", got, want)
	}
	if c.env["SECKILL_SHARDS"] != "3" {
		t.Errorf("SECKILL_SHARDS %q, want 3", c.env["SECKILL_SHARDS"])
	}

	// Every node runs under the pid its pidfile records, and the cluster
	// is whole: ok on every node, 3 masters, 3 replicas linked to them.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	roles := map[string]int{}
	for i, port := range ports {
		name := fmt.Sprintf("redis-node-%d", i+1)
		pid := c.pid(t, name)
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port})
		t.Cleanup(func() { rdb.Close() })
		server, err := rdb.InfoMap(ctx, "server", "replication").Result()
		if err != nil {
			t.Fatalf("%s on %s: %v", name, port, err)
		}
		if got := server["Server"]["process_id"]; got != strconv.Itoa(pid) {
			t.Errorf("%s: the node on port %s is pid %s, its pidfile says %d", name, port, got, pid)
		}
		repl := server["Replication"]
		roles[repl["role"]]++
		if repl["role"] == "slave" && repl["master_link_status"] != "up" {
			t.Errorf("%s: replica whose master link is %q", name, repl["master_link_status"])
		}
		info, err := rdb.ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatalf("%s: cluster info: %v", name, err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:6") {
			t.Errorf("%s: cluster info\n%s", name, info)
		}
	}
	if roles["master"] != 3 || roles["slave"] != 3 {
		t.Errorf("roles %v, want 3 masters and 3 replicas", roles)
	}

	// The shards spread over the masters: one each.
	rdb, err := redisconn.Open(c.env["SECKILL_REDIS_URL"], redisconn.Tuning{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	places, err := voucher.KeysFor(c.env["SECKILL_KEY_PREFIX"], 3, true).Placement(ctx, rdb)
	if err != nil {
		t.Fatal(err)
	}
	masters := map[string]bool{}
	for _, pl := range places {
		masters[pl.Master] = true
	}
	if len(masters) != 3 || masters[""] {
		t.Errorf("the 3 shards are on masters %v, want one on each: %+v", masters, places)
	}

	// The instances behind nginx answer; each one is ready on the cluster.
	for _, u := range append([]string{c.env["SECKILL_URL"]}, strings.Fields(c.env["SECKILL_API_URLS"])...) {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code := httpStatus(ctx, t, u+path); code != http.StatusOK {
				t.Errorf("GET %s%s: %d", u, path, code)
			}
		}
	}

	// A small sale through nginx on the cluster; the load generator's check
	// reads the pipeline's state from the cluster and MySQL.
	var out testenv.Buffer
	summary := filepath.Join(t.TempDir(), "summary.json")
	cfg, opts, err := parseRun([]string{
		"--users", "600", "--requests", "1000", "--stock", "200", "-c", "16",
		"--drain-timeout", "90s", "--json", summary,
	}, func(k string) string { return c.env[k] }, &out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Check == nil || cfg.Check.Shards != 3 {
		t.Fatalf("the check does not read the cluster's 3 shards: %+v", cfg.Check)
	}
	err = execute(ctx, cfg, opts, &out)
	t.Logf("load generator:\n%s", out.String())
	if err != nil {
		t.Fatalf("sale on the Redis Cluster: %v", err)
	}
	if s := readSummary(t, summary); s.Check == nil || !s.Check.OK || s.Check.Orders != 200 || s.Outcomes["202 accepted"] != 200 {
		t.Fatalf("sale on the Redis Cluster: check %+v, answers %v", s.Check, s.Outcomes)
	}

	// The ceiling server starts on the same cluster.
	up := exec.CommandContext(ctx, filepath.Join("..", "scripts", "cluster-up.sh"), "ceiling")
	up.Env = append(os.Environ(), "SECKILL_CLUSTER_DIR="+c.dir, "SECKILL_CLUSTER_CEILING_PORT="+testenv.FreePort(t))
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("cluster-up.sh ceiling: %v\n%s", err, out)
	}

	// cluster-down.sh stops every process cluster-up.sh recorded.
	pidfiles, err := filepath.Glob(filepath.Join(c.dir, "run", "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, f := range pidfiles {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		pids[name] = c.pid(t, name)
	}
	for _, name := range []string{"redis-node-1", "redis-node-2", "redis-node-3", "redis-node-4", "redis-node-5", "redis-node-6", "ceiling"} {
		if _, ok := pids[name]; !ok {
			t.Errorf("no pidfile for %s: %v", name, pidfiles)
		}
	}
	down := exec.CommandContext(ctx, filepath.Join("..", "scripts", "cluster-down.sh"))
	down.Env = append(os.Environ(), "SECKILL_CLUSTER_DIR="+c.dir)
	if out, err := down.CombinedOutput(); err != nil {
		t.Fatalf("cluster-down.sh: %v\n%s", err, out)
	}
	for name, pid := range pids {
		if processRuns(pid) {
			t.Errorf("%s (pid %d) still runs after cluster-down.sh", name, pid)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, "run", "*.pid")); len(left) != 0 {
		t.Errorf("pidfiles left after cluster-down.sh: %v", left)
	}
}

// httpStatus is the status of a GET of url, 0 if there was no answer.
func httpStatus(ctx context.Context, t testing.TB, url string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
