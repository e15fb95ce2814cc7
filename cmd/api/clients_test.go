package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// TestIdleRedisConnectionsServePurchases: an instance that serves
// purchases keeps 16 idle Redis connections ready; one that only runs the
// worker keeps none and dials its connections as its loops first need
// them.
func TestIdleRedisConnectionsServePurchases(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	for role, want := range map[string]int{"all": 16, "api": 16, "worker": 0} {
		cfg, err := loadConfig(func(k string) string {
			return map[string]string{"SECKILL_REDIS_URL": url, "SECKILL_ROLE": role}[k]
		})
		if err != nil {
			t.Fatal(err)
		}
		rdb, closeRedis, err := openRedis(context.Background(), cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		got := rdb.(*redis.Client).Options().MinIdleConns
		closeRedis()
		if got != want {
			t.Errorf("SECKILL_ROLE=%s: %d idle connections kept, want %d", role, got, want)
		}
	}
}
