package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestConfigEmbeddedListensOnLoopback: the embedded mode (free payments,
// login codes on the terminal) listens on 127.0.0.1 unless SECKILL_ADDR
// says otherwise; with a database server on every interface.
func TestConfigEmbeddedListensOnLoopback(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "127.0.0.1:8080"},
		{map[string]string{"SECKILL_REDIS_URL": "redis://127.0.0.1:6379/0"}, "127.0.0.1:8080"},
		{map[string]string{"SECKILL_ADDR": ":9000"}, ":9000"},
		{map[string]string{"SECKILL_MYSQL_DSN": "u:p@tcp(db:3306)/seckill", "SECKILL_TOKEN_SECRET": testSecret}, ":8080"},
	} {
		cfg, err := loadConfig(func(k string) string { return c.env[k] })
		if err != nil || cfg.Addr != c.want {
			t.Errorf("%v: addr %q (%v), want %q", c.env, cfg.Addr, err, c.want)
		}
	}
}

// TestConfigLogLine: the start-up line logs every setting of the table,
// durations as Go writes them (15m0s, not nanoseconds), secrets only as
// set or not, passwords redacted.
func TestConfigLogLine(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(func(k string) string {
		return map[string]string{
			"SECKILL_MYSQL_DSN": "seckill:hunter2pass@tcp(db:3306)/seckill", "SECKILL_TOKEN_SECRET": testSecret,
			"SECKILL_REDIS_URL": "redis://:redispass@r:6379/0", "SECKILL_LOCK_NODES": "redis://:lockpass@l:6379/0",
			"SECKILL_ADMIN_PHONES": "+8613900000000,+15550000001",
		}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("starting", "config", cfg)
	line := b.String()
	for _, want := range []string{`"pay_window":"15m0s"`, `"shutdown_timeout":"15s"`, `"token_ttl":"24h0m0s"`, `"token_secret_set":true`, `"pay_provider":"off"`, `"admin_phones":"2 phones"`} {
		if !strings.Contains(line, want) {
			t.Errorf("the start-up line lacks %s:\n%s", want, line)
		}
	}
	for _, secret := range []string{testSecret, "hunter2pass", "redispass", "lockpass", "+8613900000000", "+15550000001"} {
		if strings.Contains(line, secret) {
			t.Errorf("the start-up line shows %q:\n%s", secret, line)
		}
	}
	for _, s := range settings() {
		if key := strings.ToLower(strings.TrimPrefix(s.name, "SECKILL_")); !strings.Contains(line, `"`+key) {
			t.Errorf("the start-up line lacks %s", key)
		}
	}
}

// TestPricedVoucherNeedsPayments: with a database server payments are off
// by default, and then a priced voucher is refused (422 payments_off,
// naming the setting) while a free one is created; an instance that
// starts with priced vouchers on sale and payments off says so.
func TestPricedVoucherNeedsPayments(t *testing.T) {
	t.Parallel()
	shared := map[string]string{"SECKILL_MYSQL_DSN": testenv.MySQLDSN(t), "SECKILL_REDIS_URL": testenv.RedisURL(t), "SECKILL_KEY_PREFIX": testenv.Prefix(t)}
	with := func(extra map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range shared {
			out[k] = v
		}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	admin := token(t, 1, auth.RoleAdmin)
	create := func(base string, price int) (int, map[string]any) {
		return call(t, "POST", base+"/api/v1/vouchers", admin, map[string]any{
			"title": "priced", "face_value": 1000, "price": price, "stock": 5,
			"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
		})
	}
	paying := startObserved(t, with(map[string]string{"SECKILL_PAY_PROVIDER": "dev"}))
	if st, body := create(paying.base, 500); st != http.StatusCreated {
		t.Fatalf("priced voucher with payments on: %d %v", st, body)
	}

	off := startObserved(t, with(nil))
	st, body := create(off.base, 500)
	if msg, _ := body["message"].(string); st != http.StatusUnprocessableEntity || body["code"] != "payments_off" || !strings.Contains(msg, "SECKILL_PAY_PROVIDER") {
		t.Errorf("priced voucher with payments off: %d %v, want 422 payments_off naming SECKILL_PAY_PROVIDER", st, body)
	}
	if st, body := create(off.base, 0); st != http.StatusCreated {
		t.Errorf("free voucher with payments off: %d %v", st, body)
	}
	if logs := off.logs(); !strings.Contains(logs, "priced vouchers are on sale while payments are off") {
		t.Errorf("an instance starting with payments off and a priced voucher on sale does not warn:\n%s", logs)
	}
}

// TestShardCountChange: the shard count is recorded with the data; a
// start with another count is refused, saying what to do, while the old
// layout's streams hold orders, and taken once they are drained (every
// shard's state then rebuilt).
func TestShardCountChange(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := rs.Client(t)
	ctx := context.Background()
	prefix := testenv.Prefix(t)
	log := slog.New(slog.DiscardHandler)
	cfgOf := func(shards int) config { return config{KeyPrefix: prefix, Shards: shards} }
	keysOf := func(shards int) voucher.Keys { return voucher.NewKeys(prefix, shards) }

	if err := checkShardCount(ctx, cfgOf(2), rdb, keysOf(2), log); err != nil {
		t.Fatalf("first start: %v", err)
	}
	if err := checkShardCount(ctx, cfgOf(2), rdb, keysOf(2), log); err != nil {
		t.Fatalf("same count again: %v", err)
	}
	// An order waits in the old layout's shard 1.
	if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: keysOf(2).Stream(1), Values: []string{"o", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	err := checkShardCount(ctx, cfgOf(3), rdb, keysOf(3), log)
	if err == nil || !strings.Contains(err.Error(), "SECKILL_SHARDS=2") || !strings.Contains(err.Error(), "drain") {
		t.Fatalf("another count with an order waiting: %v, want a refusal saying to keep SECKILL_SHARDS=2 until drained", err)
	}
	if n, _ := rdb.Get(ctx, shardCountKey(prefix)).Int(); n != 2 {
		t.Fatalf("the recorded count is %d after a refusal, want 2", n)
	}
	// Drained: the switch is taken, and every shard rebuilt.
	if err := rdb.Del(ctx, keysOf(2).Stream(1)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, keysOf(3).Ready(0), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := checkShardCount(ctx, cfgOf(3), rdb, keysOf(3), log); err != nil {
		t.Fatalf("another count once drained: %v", err)
	}
	if n, _ := rdb.Get(ctx, shardCountKey(prefix)).Int(); n != 3 {
		t.Errorf("the recorded count is %d after the switch, want 3", n)
	}
	if n, _ := rdb.Exists(ctx, keysOf(3).Ready(0)).Result(); n != 0 {
		t.Errorf("shard 0's ready marker survived the switch: its state would not be rebuilt under the new count")
	}
}

// TestShardCountChangeWaitsForEveryBacklog: a start with another shard
// count is refused while anything waits under the old layout, not only an
// order on its stream: an order in the retry delay queue, a pay deadline
// queued (due in a quarter of an hour) or due on the expiries' stream. The
// refusal says to keep the old count and to stop every instance before
// switching; once the entry is gone the switch is taken.
func TestShardCountChangeWaitsForEveryBacklog(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := rs.Client(t)
	log := slog.New(slog.DiscardHandler)
	due := redis.Z{Score: float64(time.Now().Add(15 * time.Minute).UnixMilli()), Member: `["order_id","7"]`}
	cases := []struct {
		name string
		add  func(ctx context.Context, old voucher.Keys) (key string, err error)
		want string
	}{
		{"retry delay queue", func(ctx context.Context, old voucher.Keys) (string, error) {
			return old.Delayed(1), rdb.ZAdd(ctx, old.Delayed(1), due).Err()
		}, "1 orders not yet written and 0 pay deadlines"},
		{"pay deadline queued", func(ctx context.Context, old voucher.Keys) (string, error) {
			_, queue := order.ExpiryKeys(old, 1)
			return queue, rdb.ZAdd(ctx, queue, due).Err()
		}, "0 orders not yet written and 1 pay deadlines"},
		{"pay deadline due", func(ctx context.Context, old voucher.Keys) (string, error) {
			stream, _ := order.ExpiryKeys(old, 0)
			return stream, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{"order_id", "7"}}).Err()
		}, "0 orders not yet written and 1 pay deadlines"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			prefix := testenv.Prefix(t)
			cfgOf := func(shards int) config { return config{KeyPrefix: prefix, Shards: shards} }
			keysOf := func(shards int) voucher.Keys { return voucher.NewKeys(prefix, shards) }
			if err := checkShardCount(ctx, cfgOf(2), rdb, keysOf(2), log); err != nil {
				t.Fatalf("first start: %v", err)
			}
			key, err := c.add(ctx, keysOf(2))
			if err != nil {
				t.Fatal(err)
			}
			err = checkShardCount(ctx, cfgOf(3), rdb, keysOf(3), log)
			if err == nil {
				t.Fatalf("SECKILL_SHARDS=3 taken with %s still holding an entry of the 2-shard layout", key)
			}
			for _, want := range []string{c.want, "keep SECKILL_SHARDS=2", "stop every instance", "with SECKILL_SHARDS=3"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not say %q", err, want)
				}
			}
			if n, _ := rdb.Get(ctx, shardCountKey(prefix)).Int(); n != 2 {
				t.Fatalf("the recorded count is %d after a refusal, want 2", n)
			}
			if err := rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			if err := checkShardCount(ctx, cfgOf(3), rdb, keysOf(3), log); err != nil {
				t.Fatalf("another count once drained: %v", err)
			}
		})
	}
}
