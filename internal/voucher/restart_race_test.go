package voucher

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// TestRestartDuringRoundRebuildsOnce: instance B's Warm round read the
// master's run_id, then the master restarted and instance A rebuilt both
// shards with the new run_id, all before B reached shard 1. B must not
// take A's fresh marker for a stale one (rebuilding shard 1 again and
// writing the old run_id, which a third rebuild would then undo): one
// restart, one rebuild of each shard.
func TestRestartDuringRoundRebuildsOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 2, 10, ledger{})
	var log rebuildLog
	a, b := e.instance(&log), e.instance(&log)
	warm(t, a)
	warm(t, b)
	log.take()
	ctx := context.Background()
	// Shard 0's voucher state is missing: B's round loads it and reads the
	// pending index, where the restart and A's rebuild happen.
	e.rdb.Del(ctx, e.keys.State(e.ids[0]))
	fired := false
	b.afterPage = func() {
		if fired {
			return
		}
		fired = true
		srv.Restart(t)
		reconnect(t, e.rdb)
		warm(t, a)
	}
	if _, err := b.Warm(ctx); err != nil {
		t.Logf("B's round across the restart: %v", err)
	}
	b.afterPage = nil
	for range 3 {
		warm(t, a)
		warm(t, b)
	}
	per := map[int]int{}
	for _, ev := range log.take() {
		per[ev.shard]++
	}
	if per[0] != 1 || per[1] != 1 {
		t.Fatalf("rebuilds by shard after one restart: %v, want one each", per)
	}
}

// TestRunIDRefusedIsAnError: a Redis user without the INFO command (the
// common "+@all -@dangerous") cannot tell the master's run_id. That is an
// error for the shard, not an unknown identity: judged by its marker alone,
// a shard would go on selling on a promoted replica that lost writes.
func TestRunIDRefusedIsAnError(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err(); err != nil {
		t.Fatal(err)
	}
	o := *admin.Options()
	o.Username, o.Password = "app", "pw"
	app := redis.NewClient(&o)
	defer app.Close()
	keys := NewKeys(testenv.Prefix(t), 1)
	id, err := NewState(app, keys).masters().identity(ctx, keys.Ready(0))
	if err == nil || !strings.Contains(err.Error(), "INFO") {
		t.Fatalf("identity %q, err %v; want an error saying the user needs INFO", id, err)
	}
	// The server's own refusal of the section (the embedded Redis) is an
	// unknown identity, not an error: covered by TestEmbeddedRedisWarmsByMarker.
}

// TestRestartBeforeRebuildReopensWithTheNewMaster: a Warm round read the
// master's run_id at its first shard; the master restarted (keeping its
// data) before the round reached a shard whose marker is gone. That
// shard's rebuild reopens it with the run_id of the master serving it
// now, read under the lease, not the round's older one: else the next
// round would take its fresh marker for a stale one and rebuild it again.
// One restart: the lost shard is rebuilt once (missing), the other once
// (master_changed), and nothing after.
func TestRestartBeforeRebuildReopensWithTheNewMaster(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 2, 10, ledger{})
	var log rebuildLog
	w := e.instance(&log)
	warm(t, w)
	log.take()
	ctx := context.Background()
	// Shard 0's voucher state is missing: the round loads it and reads the
	// pending index, where the master restarts. Shard 1's marker is gone:
	// the round rebuilds it after the restart.
	if err := e.rdb.Del(ctx, e.keys.State(e.ids[0]), e.keys.Ready(1)).Err(); err != nil {
		t.Fatal(err)
	}
	fired := false
	w.afterPage = func() {
		if fired {
			return
		}
		fired = true
		srv.Restart(t)
		reconnect(t, e.rdb)
	}
	if _, err := w.Warm(ctx); err != nil {
		t.Logf("the round across the restart: %v", err)
	}
	w.afterPage = nil
	if !fired {
		t.Fatal("the round read no pending index of shard 0: no restart happened")
	}
	for range 3 {
		warm(t, w)
	}
	got := log.take()
	want := map[rebuildEvent]int{{0, RebuildMasterChanged}: 1, {1, RebuildMissing}: 1}
	seen := map[rebuildEvent]int{}
	for _, ev := range got {
		seen[ev]++
	}
	if len(seen) != len(want) || seen[rebuildEvent{0, RebuildMasterChanged}] != 1 || seen[rebuildEvent{1, RebuildMissing}] != 1 {
		t.Fatalf("rebuilds after one restart: %v, want shard 1 once (missing) and shard 0 once (master_changed)", got)
	}
}
