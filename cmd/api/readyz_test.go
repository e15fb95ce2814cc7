package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestReadyzNamesTheShardNotLoaded: a shard whose sale state is gone makes
// the instance not ready. The public /readyz says only that; the admin
// listener's /admin/readyz (admin token) names the shard, while Redis and
// the database are up.
func TestReadyzNamesTheShardNotLoaded(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	prefix := testenv.Prefix(t)
	// The warmer would rebuild the shard within its interval: make that an hour.
	o := startObserved(t, map[string]string{
		"SECKILL_REDIS_URL": rs.URL(), "SECKILL_KEY_PREFIX": prefix, "SECKILL_SHARDS": "3", "SECKILL_WARM_INTERVAL": "1h",
	})
	admin := token(t, 1, auth.RoleAdmin)
	if st, body := get(t, o.base+"/readyz", ""); st != 200 || body != `{"ready":true}` {
		t.Fatalf("/readyz answered %d %s", st, body)
	}
	if st, body := get(t, o.admin+"/admin/readyz", admin); st != 200 || !strings.Contains(body, `"shards":"loaded"`) {
		t.Fatalf("/admin/readyz answered %d %s", st, body)
	}
	keys := voucher.NewKeys(prefix, 3)
	if err := rs.Client(t).Del(context.Background(), keys.Ready(1)).Err(); err != nil {
		t.Fatal(err)
	}
	var st int
	var body string
	testenv.WaitFor(t, 10*time.Second, "/readyz answering 503", func() bool {
		st, body = get(t, o.base+"/readyz", "")
		return st == 503
	})
	if body != `{"ready":false}` {
		t.Errorf("public /readyz answered %d %s, want only {\"ready\":false}", st, body)
	}
	st, body = get(t, o.admin+"/admin/readyz", admin)
	if st != 503 || !strings.Contains(body, `"shards":"not_loaded"`) || !strings.Contains(body, `"shards_not_loaded":[1]`) ||
		!strings.Contains(body, `"redis":"up"`) || !strings.Contains(body, `"database":"up"`) {
		t.Fatalf("/admin/readyz answered %d %s, want 503 naming shard 1", st, body)
	}
	// The metrics say which check fails.
	_, mfs := scrape(t, o.admin+"/metrics")
	checks := map[string]float64{}
	if mf := mfs["seckill_ready_check"]; mf != nil {
		for _, m := range mf.GetMetric() {
			checks[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if checks["shards"] != 0 || checks["redis"] != 1 || checks["database"] != 1 || len(checks) != 4 {
		t.Errorf("seckill_ready_check: %v, want shards 0 and redis, database, migrations 1", checks)
	}
	if st, _ := get(t, o.admin+"/admin/readyz", ""); st != 401 {
		t.Errorf("/admin/readyz without a token answered %d, want 401", st)
	}
	if st, _ := get(t, o.admin+"/admin/readyz", token(t, 2, auth.RoleUser)); st != 403 {
		t.Errorf("/admin/readyz with a user token answered %d, want 403", st)
	}
}

// TestReadyzProbesOncePerSecond: a flood of /readyz calls costs Redis one
// probe per second of flood, however many callers: the answer is the last
// probe's for up to a second (PINGs counted by the server's commandstats;
// nothing else in the service sends PING after start-up).
func TestReadyzProbesOncePerSecond(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	o := startObserved(t, map[string]string{"SECKILL_REDIS_URL": rs.URL()})
	rdb := rs.Client(t)
	pings := func() int {
		t.Helper()
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_ping:calls="); ok {
				n, _ := strconv.Atoi(strings.Split(rest, ",")[0])
				return n
			}
		}
		return 0
	}
	before := pings()
	start := time.Now()
	const callers, each = 20, 10
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-gate
			for range each {
				if st, body := get(t, o.base+"/readyz", ""); st != 200 {
					t.Errorf("/readyz answered %d %s", st, body)
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	took := time.Since(start)
	probes := pings() - before
	// One probe per started second, and one more for the second the flood
	// began in.
	if most := int(took/time.Second) + 2; probes > most {
		t.Errorf("%d /readyz calls in %v sent %d PINGs, want at most %d", callers*each, took, probes, most)
	}
	t.Logf("%d /readyz calls in %v: %d PINGs", callers*each, took, probes)
}

// TestConfigRefusesBadRedisSettings: a cluster URL naming a database other
// than 0, a wait for replicas of the embedded Redis, and a wait shorter
// than Redis counts are refused at start-up with a message naming the
// setting; their neighbours that make sense are taken.
func TestConfigRefusesBadRedisSettings(t *testing.T) {
	t.Parallel()
	cases := []struct {
		env  map[string]string
		want string // "" for taken
	}{
		{map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000/2"}, "SECKILL_REDIS_URL is refused: redis cluster url names database 2: a Redis Cluster has only database 0"},
		{map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000?db=3"}, "SECKILL_REDIS_URL is refused: redis cluster url sets db"},
		{map[string]string{"SECKILL_REDIS_URL": "mysql://127.0.0.1:7000"}, "SECKILL_REDIS_URL is refused"},
		{map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000/0"}, ""},
		{map[string]string{"SECKILL_REDIS_WAIT_REPLICAS": "1"}, "SECKILL_REDIS_WAIT_REPLICAS needs SECKILL_REDIS_URL: the embedded Redis has no replicas"},
		{map[string]string{"SECKILL_REDIS_URL": "redis://127.0.0.1:6379/0", "SECKILL_REDIS_WAIT_REPLICAS": "1"}, ""},
		{map[string]string{"SECKILL_REDIS_URL": "redis://127.0.0.1:6379/0", "SECKILL_REDIS_WAIT_TIMEOUT": "500us"}, "SECKILL_REDIS_WAIT_TIMEOUT must be a duration of at least 1ms"},
		{map[string]string{"SECKILL_REDIS_URL": "redis://127.0.0.1:6379/0", "SECKILL_REDIS_WAIT_TIMEOUT": "1ms"}, ""},
	}
	for _, c := range cases {
		_, err := loadConfig(func(k string) string { return c.env[k] })
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: refused (%v), want taken", c.env, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: err %v, want one saying %q", c.env, err, c.want)
		}
	}
}
