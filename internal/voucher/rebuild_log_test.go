package voucher

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// TestRebuildLevel: only a rebuild that can follow a loss is a warning.
func TestRebuildLevel(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v    shardVerdict
		seen bool
		want slog.Level
	}{
		{shardLost, false, slog.LevelInfo},
		{shardLost, true, slog.LevelWarn},
		{shardStale, false, slog.LevelWarn},
		{shardStale, true, slog.LevelWarn},
	} {
		if got := rebuildLevel(c.v, c.seen); got != c.want {
			t.Errorf("rebuildLevel(%s, seen ready %v) = %v, want %v", c.v.reason(), c.seen, got, c.want)
		}
	}
}

// rebuildLines returns the level of each "rebuilding shard state" line in
// a JSON log, by shard, and forgets the log.
func rebuildLines(t *testing.T, logs *testenv.Buffer, seen *int) map[int]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	got := map[int]string{}
	for _, l := range lines[*seen:] {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Shard int    `json:"shard"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if e.Msg == "rebuilding shard state from the database" {
			got[e.Shard] = e.Level
		}
	}
	*seen = len(lines)
	return got
}

// TestFirstLoadIsNotAWarning: on a fresh Redis the first load of every
// shard is logged at INFO; an instance starting later on the loaded Redis
// rebuilds nothing; a marker lost afterwards, under the running instance,
// is a WARN.
func TestFirstLoadIsNotAWarning(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	keys := NewKeys(testenv.Prefix(t), 2)
	store := NewStore(migratedDB(t, "sqlite"))
	ctx := context.Background()
	for range 4 {
		v := Voucher{Title: "t", TotalStock: 10, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
		if err := store.Create(ctx, &v); err != nil {
			t.Fatal(err)
		}
	}
	var logs testenv.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	newWarmer := func() *Warmer { return NewWarmer(store, NewState(rdb, keys), ledger{}, keys, time.Hour, log) }
	seen := 0

	first := newWarmer()
	warm(t, first)
	if got := rebuildLines(t, &logs, &seen); len(got) != 2 || got[0] != "INFO" || got[1] != "INFO" {
		t.Fatalf("first load of a fresh redis logged %v (shard: level), want both shards at INFO\n%s", got, logs.String())
	}
	later := newWarmer()
	warm(t, later)
	if got := rebuildLines(t, &logs, &seen); len(got) != 0 {
		t.Fatalf("an instance starting on a loaded redis rebuilt %v", got)
	}
	if err := rdb.Del(ctx, keys.Ready(1)).Err(); err != nil {
		t.Fatal(err)
	}
	warm(t, first)
	if got := rebuildLines(t, &logs, &seen); len(got) != 1 || got[1] != "WARN" {
		t.Fatalf("a marker lost under a running instance logged %v (shard: level), want shard 1 at WARN\n%s", got, logs.String())
	}
}
