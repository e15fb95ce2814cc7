package main

import (
	"context"
	"strings"
	"testing"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestReadyzNamesTheShardNotLoaded: a shard whose sale state is gone makes
// the instance not ready, and /readyz names the shard, while Redis and the
// database are up.
func TestReadyzNamesTheShardNotLoaded(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	prefix := testenv.Prefix(t)
	// The warmer would rebuild the shard within its interval: make that an hour.
	o := startObserved(t, map[string]string{
		"SECKILL_REDIS_URL": rs.URL(), "SECKILL_KEY_PREFIX": prefix, "SECKILL_SHARDS": "3", "SECKILL_WARM_INTERVAL": "1h",
	})
	if st, body := get(t, o.base+"/readyz", ""); st != 200 || !strings.Contains(body, `"shards":"loaded"`) {
		t.Fatalf("/readyz answered %d %s", st, body)
	}
	keys := voucher.NewKeys(prefix, 3)
	if err := rs.Client(t).Del(context.Background(), keys.Ready(1)).Err(); err != nil {
		t.Fatal(err)
	}
	st, body := get(t, o.base+"/readyz", "")
	if st != 503 || !strings.Contains(body, `"shards":"not_loaded"`) || !strings.Contains(body, `"shards_not_loaded":[1]`) ||
		!strings.Contains(body, `"redis":"up"`) || !strings.Contains(body, `"database":"up"`) {
		t.Fatalf("/readyz answered %d %s, want 503 naming shard 1", st, body)
	}
}

// TestConfigRefusesBadRedisSettings: a cluster URL naming a database other
// than 0, a wait for replicas of the embedded Redis, and a wait shorter
// than Redis counts are refused at start-up with a message naming the
// setting.
func TestConfigRefusesBadRedisSettings(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000/2"}, "only database 0"},
		{map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000?db=3"}, "only database 0"},
		{map[string]string{"SECKILL_REDIS_URL": "mysql://127.0.0.1:7000"}, "SECKILL_REDIS_URL"},
		{map[string]string{"SECKILL_REDIS_WAIT_REPLICAS": "1"}, "embedded Redis has no replicas"},
		{map[string]string{"SECKILL_REDIS_URL": "redis://127.0.0.1:6379/0", "SECKILL_REDIS_WAIT_TIMEOUT": "500us"}, "at least 1ms"},
	}
	for _, c := range cases {
		_, err := loadConfig(func(k string) string { return c.env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one saying %q", c.env, err, c.want)
		}
	}
	if _, err := loadConfig(func(k string) string {
		return map[string]string{"SECKILL_REDIS_URL": "redis-cluster://127.0.0.1:7000?addr=127.0.0.1:7001", "SECKILL_REDIS_WAIT_REPLICAS": "1"}[k]
	}); err != nil {
		t.Errorf("a cluster URL with a replica wait: %v", err)
	}
}
