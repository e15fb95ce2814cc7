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
