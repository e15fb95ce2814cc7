package redisconn_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/testenv"
)

// TestSlotKnown checks values the cluster specification states: the CRC of
// "123456789" is 0x31C3, and keys with one hash tag share a slot.
func TestSlotKnown(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]int{
		"123456789":            0x31C3,
		"{123456789}":          0x31C3,
		"x{123456789}y{z}":     0x31C3,
		"":                     0,
		"{user1000}.following": redisconn.Slot("user1000"),
		"{user1000}.followers": redisconn.Slot("user1000"),
		"foo{}{bar}":           redisconn.Slot("foo{}{bar}"), // empty tag: the whole key
	} {
		if got := redisconn.Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	if redisconn.Slot("foo{}{bar}") == redisconn.Slot("bar") {
		t.Error(`Slot("foo{}{bar}") hashed "bar": an empty first tag must hash the whole key`)
	}
}

// TestSlotMatchesRedis asks a real cluster-enabled redis-server for the slot
// of edge cases and of thousands of random keys made mostly of braces, and
// compares each with Slot. CLUSTER KEYSLOT answers before any slot is
// assigned, so one node is enough.
func TestSlotMatchesRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	}})
	rdb := srv.Client(t)

	keys := []string{
		"", "{", "}", "{}", "}{", "{{}}", "{}}", "{{}", "a{b}c{d}", "a{}b{c}", "{a}", "{a", "a}",
		"a{b", "a}b{c}", "{}{}", "{{a}}", "seckill:{0}:orders", "seckill:{0.12}:voucher:7",
		"{é}", "é{ü}ß", "{日本}語", "\x00{\x00}", "\xff{\xfe}", "{\u2603}", strings.Repeat("{x}", 100),
		strings.Repeat("k", 1000),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"{", "}", "a", "b", "0", ":", "é", "日", "\x00", "\xff"}
	for range 4000 {
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		keys = append(keys, b.String())
	}

	ctx := context.Background()
	cmds := make([]*redis.IntCmd, len(keys))
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.ClusterKeySlot(ctx, k)
		}
		return nil
	}); err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	for i, k := range keys {
		if got, want := redisconn.Slot(k), int(cmds[i].Val()); got != want {
			t.Errorf("Slot(%q) = %d, redis says %d", k, got, want)
		}
	}
}
