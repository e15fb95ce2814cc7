package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// clusterSale is a sale run by two instances on a Redis Cluster of three
// masters with a replica each, three shards, one MySQL database.
type clusterSale struct {
	cl     *testenv.Cluster
	rdb    *redis.ClusterClient
	keys   voucher.Keys
	env    map[string]string
	a, b   observed
	prefix string
}

func startClusterSale(t *testing.T, extra map[string]string) clusterSale {
	t.Helper()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1})
	prefix := testenv.Prefix(t)
	env := map[string]string{
		"SECKILL_REDIS_URL":     cl.URL(),
		"SECKILL_SHARDS":        "3",
		"SECKILL_KEY_PREFIX":    prefix,
		"SECKILL_MYSQL_DSN":     testenv.MySQLDSN(t),
		"SECKILL_WARM_INTERVAL": "250ms",
	}
	for k, v := range extra {
		env[k] = v
	}
	with := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range env {
			out[k] = v
		}
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	s := clusterSale{cl: cl, rdb: cl.Client(t), keys: voucher.KeysFor(prefix, 3, true), env: env, prefix: prefix}
	s.a = startObserved(t, with(nil))
	s.b = startObserved(t, with(nil))
	return s
}

// rebuilds sums seckill_shard_rebuilds_total over both instances.
func (s clusterSale) rebuilds(t testing.TB, reason string) float64 {
	t.Helper()
	var n float64
	for _, o := range []observed{s.a, s.b} {
		_, mfs := scrape(t, o.admin+"/metrics")
		v, _ := sample(mfs, "seckill_shard_rebuilds_total", "reason", reason)
		n += v
	}
	return n
}

// ready reads the detailed readiness of an instance, on its admin
// listener (the public /readyz says only ready or not).
func ready(t testing.TB, admin string) (int, map[string]any) {
	t.Helper()
	return call(t, "GET", admin+"/admin/readyz", token(t, 1, auth.RoleAdmin), nil)
}

// TestSaleOnCluster: the whole sale on a real Redis Cluster (three masters,
// a replica each): the shards sit on three different masters, two
// instances sell a voucher of every shard to a stampede, the worker writes
// every order (each through a delay queue first: its buyer lock is held
// elsewhere), a message that cannot be an order becomes a dead letter,
// reconcile finds Redis and the database agree, login codes work, and
// /readyz says the cluster is ok.
func TestSaleOnCluster(t *testing.T) {
	t.Parallel()
	s := startClusterSale(t, nil)

	// Every shard's keys live on a different master.
	masters := map[string]int{}
	for shard := range 3 {
		masters[s.cl.MasterOf(t, s.keys.Stream(shard)).Addr]++
	}
	if len(masters) != 3 {
		t.Fatalf("3 shards sit on masters %v, want 3 different ones", masters)
	}
	st, body := ready(t, s.a.admin)
	checks, _ := body["checks"].(map[string]any)
	if st != 200 || checks["cluster"] != "ok" || checks["shards"] != "loaded" {
		t.Fatalf("/readyz: %d %v", st, body)
	}

	// One voucher per shard (ids are consecutive: shard = id % 3), sold
	// at once through both instances.
	const stock, buyers, repeaters = 40, 300, 60
	vids := make([]int64, 3)
	for i := range vids {
		vids[i] = createVoucher(t, s.a.base, stock)
	}
	shards := map[int]bool{}
	for _, vid := range vids {
		shards[s.keys.Shard(vid)] = true
	}
	if len(shards) != 3 {
		t.Fatalf("vouchers %v fall in shards %v, want all three", vids, shards)
	}
	// Every buyer finds their buyer lock held elsewhere: the worker sends
	// the accepted orders through the shards' delay queues (retry.lua and
	// forward.lua on the cluster) until the locks are let go, below.
	var held []string
	for _, vid := range vids {
		for i := range buyers {
			held = append(held, fmt.Sprintf("%s:lock:buyer:%d:%d", s.prefix, vid, 10_000+i))
		}
	}
	pipe := s.rdb.Pipeline()
	for _, key := range held {
		pipe.Set(context.Background(), key, "held-elsewhere", time.Minute)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	sales := make([]sale, len(vids))
	var wg sync.WaitGroup
	for i, vid := range vids {
		wg.Go(func() { sales[i] = stampede(t, []string{s.a.base, s.b.base}, vid, buyers, repeaters) })
	}
	wg.Wait()
	testenv.WaitFor(t, 30*time.Second, "lock conflicts counted", func() bool {
		conflicts := 0.0
		for _, o := range []observed{s.a, s.b} {
			_, mfs := scrape(t, o.admin+"/metrics")
			n, _ := sample(mfs, "seckill_lock_conflicts_total")
			conflicts += n
		}
		return conflicts > 0
	})
	for _, key := range held {
		pipe.Del(context.Background(), key)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}

	g, err := db.OpenMySQL(s.env["SECKILL_MYSQL_DSN"], 4)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	for i, vid := range vids {
		if len(sales[i].accepted) != stock {
			t.Fatalf("voucher %d: %d accepted, want %d; answers %v", vid, len(sales[i].accepted), stock, sales[i].codes)
		}
		rep := drainAndVerify(t, g, s.rdb, s.keys, vid, sales[i])
		if rep.Orders != stock || rep.RedisStock != 0 || rep.DBStock != 0 {
			t.Fatalf("voucher %d after drain: %s", vid, rep)
		}
	}

	// A message no purchase wrote becomes a dead letter, listed by the CLI.
	if err := s.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: s.keys.Stream(1), Values: []string{"garbage", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	testenv.WaitFor(t, 30*time.Second, "the dead letter listed by api dlq list", func() bool {
		out.Reset()
		if err := run(context.Background(), []string{"api", "dlq", "list"}, s.getenv, &out, &out); err != nil {
			t.Fatalf("api dlq list: %v", err)
		}
		return strings.Contains(out.String(), "undecodable")
	})

	// reconcile and shards read the cluster.
	out.Reset()
	if err := run(context.Background(), []string{"api", "reconcile"}, s.getenv, &out, &out); err != nil {
		t.Fatalf("api reconcile: %v\n%s", err, out.String())
	}
	// The database loses an order of every voucher (one per shard, so per
	// master): reconcile --repair queues each again, the instances'
	// workers write them with their buyers, and reconcile finds nothing.
	var lost []int64
	for i, vid := range vids {
		for id := range sales[i].accepted {
			loseOrders(t, g, vid, id)
			lost = append(lost, id)
			break
		}
	}
	slices.Sort(lost)
	if got := repaired(t, s.getenv); !slices.Equal(got, lost) {
		t.Fatalf("api reconcile --repair queued %v again; want %v", got, lost)
	}
	for i, id := range lost {
		testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("lost order %d written again", i), func() bool { return buyerOf(t, g, id) != 0 })
	}
	for i, vid := range vids {
		for id, user := range sales[i].accepted {
			if got := buyerOf(t, g, id); got != user {
				t.Fatalf("voucher %d: order %d's buyer %d, want %d", vid, id, got, user)
			}
		}
	}
	testenv.WaitFor(t, 20*time.Second, "api reconcile reporting nothing after the repair", func() bool {
		out.Reset()
		return run(context.Background(), []string{"api", "reconcile"}, s.getenv, &out, &out) == nil
	})
	// shards prints its result alone on stdout, as JSON (api shards | jq).
	out.Reset()
	var logs bytes.Buffer
	if err := run(context.Background(), []string{"api", "shards"}, s.getenv, &out, &logs); err != nil {
		t.Fatalf("api shards: %v\n%s", err, &logs)
	}
	var placed struct {
		Shards []struct {
			Shard  int    `json:"shard"`
			Master string `json:"master"`
		} `json:"shards"`
		Masters int `json:"masters"`
	}
	if err := json.Unmarshal(out.Bytes(), &placed); err != nil || len(placed.Shards) != 3 || placed.Masters != 3 {
		t.Fatalf("api shards printed %q (%v), want JSON of 3 shards on 3 masters", &out, err)
	}
	for _, p := range placed.Shards {
		if master := s.cl.MasterOf(t, s.keys.Stream(p.Shard)).Addr; p.Master != master {
			t.Fatalf("api shards says shard %d lives on %s, not %s:\n%s", p.Shard, p.Master, master, out.String())
		}
	}

	// Login codes: their keys spread over the cluster too.
	web := startWeb(t, map[string]string{"SECKILL_REDIS_URL": s.cl.URL(), "SECKILL_SHARDS": "3", "SECKILL_MYSQL_DSN": s.env["SECKILL_MYSQL_DSN"]})
	for _, phone := range []string{"+8613800000001", "+8613800000002", "+8613800000003"} {
		if tok, _, _ := web.login(t, phone); tok == "" {
			t.Fatalf("login %s gave no token", phone)
		}
	}
	if st, page := get(t, web.base+"/", ""); st != 200 || !strings.Contains(page, "<html") {
		t.Fatalf("the shop page on a cluster: %d", st)
	}
}

// getenv reads the settings of the sale's instances, for the subcommands.
func (s clusterSale) getenv(k string) string {
	if k == "SECKILL_TOKEN_SECRET" {
		return testSecret
	}
	if k == "SECKILL_LOG_LEVEL" {
		return "warn"
	}
	return s.env[k]
}

// TestQuietClusterRebuildsNothing: two minutes of a steady sale on a
// healthy cluster, every instance checking every shard's master four times
// a second, rebuild no shard: purchases never answer not_ready and /readyz
// stays ready.
func TestQuietClusterRebuildsNothing(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two minutes long")
	}
	s := startClusterSale(t, nil)
	vids := []int64{createVoucher(t, s.a.base, 100_000), createVoucher(t, s.a.base, 100_000), createVoucher(t, s.a.base, 100_000)}
	// The shards were rebuilt once at start-up (Redis held nothing).
	atStart := s.rebuilds(t, "missing") + s.rebuilds(t, "master_changed")

	var user atomic.Int64
	user.Store(1_000_000)
	codes := map[string]int{}
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for i := 0; time.Now().Before(deadline); i++ {
		<-tick.C
		base, admin := []string{s.a.base, s.b.base}[i%2], []string{s.a.admin, s.b.admin}[i%2]
		u := user.Add(1)
		st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, vids[i%3]), token(t, u, auth.RoleUser), nil)
		code, _ := body["code"].(string)
		if st != 202 {
			codes[fmt.Sprintf("%d %s", st, code)]++
		} else {
			codes["accepted"]++
		}
		if i%20 == 0 {
			if st, body := ready(t, admin); st != 200 {
				b, _ := json.Marshal(body)
				t.Errorf("/readyz on a quiet cluster: %d %s", st, b)
			}
		}
	}
	if len(codes) != 1 || codes["accepted"] == 0 {
		t.Errorf("answers on a quiet cluster: %v, want only accepted (202)", codes)
	}
	if n := s.rebuilds(t, "missing") + s.rebuilds(t, "master_changed"); n != atStart {
		t.Fatalf("%v shard rebuilds in two quiet minutes (after %v at start-up)", n-atStart, atStart)
	}
	t.Logf("answers %v; %v rebuilds at start-up, none after", codes, atStart)
}

// TestClusterFullCoverageRefused: on a Redis Cluster where one node (here
// a replica, which would bring it along when it takes over) says
// cluster-require-full-coverage yes (one master down would stop every
// shard and every bucket), the service refuses to start and names the node
// and the fix; with SECKILL_FULL_COVERAGE=warn it starts and warns.
func TestClusterFullCoverageRefused(t *testing.T) {
	t.Parallel()
	// A replica's setting counts too: it takes its master's place.
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1})
	cl.WaitHealthy(t, time.Minute)
	var full *testenv.ClusterNode
	for _, n := range cl.Nodes() {
		if role, _ := n.Client(t).Do(context.Background(), "role").Slice(); len(role) > 0 && role[0] == "slave" {
			full = n
			break
		}
	}
	if full == nil {
		t.Fatal("no replica in the cluster")
	}
	if err := full.Client(t).ConfigSet(context.Background(), "cluster-require-full-coverage", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"SECKILL_REDIS_URL": cl.URL(), "SECKILL_SHARDS": "3", "SECKILL_KEY_PREFIX": testenv.Prefix(t),
		"SECKILL_MYSQL_DSN": testenv.MySQLDSN(t), "SECKILL_TOKEN_SECRET": testSecret, "SECKILL_RATE_LIMIT": "off",
		"SECKILL_DATA_DIR": t.TempDir(), "SECKILL_ADDR": freeAddr(t), "SECKILL_ADMIN_ADDR": "off",
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out testenv.Buffer
	err := run(ctx, []string{"api"}, func(k string) string { return env[k] }, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "cluster-require-full-coverage yes") || !strings.Contains(err.Error(), full.Addr) {
		t.Fatalf("start with full coverage required = %v, want a refusal naming %s", err, full.Addr)
	}
	env["SECKILL_FULL_COVERAGE"] = "warn"
	logs := runService(t, env)
	if !strings.Contains(logs(), "cluster-require-full-coverage yes") {
		t.Errorf("started with SECKILL_FULL_COVERAGE=warn but no warning logged:\n%s", logs())
	}
}
