package voucher

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// rebuildLog records what a Warmer tells OnRebuild.
type rebuildLog struct {
	mu  sync.Mutex
	got []rebuildEvent
}

type rebuildEvent struct {
	shard  int
	reason string
}

func (l *rebuildLog) record(shard int, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, rebuildEvent{shard, reason})
}

// take returns the rebuilds recorded since the last take.
func (l *rebuildLog) take() []rebuildEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	got := l.got
	l.got = nil
	return got
}

// restartEnv is a sale of one voucher per shard on a Redis the test may
// restart, with the vouchers in a MySQL database of the test.
type restartEnv struct {
	rdb    redis.UniversalClient
	keys   Keys
	store  *Store
	ledger ledger
	ids    []int64 // voucher of each shard
}

// newRestartEnv creates one voucher of the given stock per shard.
func newRestartEnv(t testing.TB, rdb redis.UniversalClient, shards, stock int, l ledger) restartEnv {
	t.Helper()
	ctx := context.Background()
	e := restartEnv{rdb: rdb, keys: NewKeys(testenv.Prefix(t), shards), store: NewStore(migratedMySQL(t)), ledger: l}
	e.ids = make([]int64, shards)
	for have := 0; have < shards; {
		v := Voucher{Title: "t", TotalStock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
		if err := e.store.Create(ctx, &v); err != nil {
			t.Fatal(err)
		}
		if s := e.keys.Shard(v.ID); e.ids[s] == 0 {
			e.ids[s] = v.ID
			have++
		}
	}
	return e
}

// instance is one service instance's Warmer, its rebuilds recorded in log.
func (e restartEnv) instance(log *rebuildLog) *Warmer {
	w := NewWarmer(e.store, NewState(e.rdb, e.keys), e.ledger, e.keys, time.Hour, slog.New(slog.DiscardHandler))
	w.OnRebuild(log.record)
	return w
}

// warm runs one Warm round and fails the test on an error.
func warm(t testing.TB, w *Warmer) {
	t.Helper()
	if _, err := w.Warm(context.Background()); err != nil {
		t.Fatalf("warm: %v", err)
	}
}

// buy buys the voucher of shard for user, with order id 1000*user+shard.
func (e restartEnv) buy(t testing.TB, shard int, user int64) error {
	t.Helper()
	_, err := NewReserver(e.rdb, e.keys).Reserve(context.Background(), e.ids[shard], user, 1000*user+int64(shard))
	return err
}

// checkSale fails unless every shard's voucher holds stock units and
// exactly the buyers given (user -> order id, the same in every shard but
// for the shard added by buy).
func (e restartEnv) checkSale(t testing.TB, stock int64, users []int64, fromLedger map[int64]int64) {
	t.Helper()
	ctx := context.Background()
	for shard, id := range e.ids {
		got, err := e.rdb.HGet(ctx, e.keys.State(id), "stock").Int64()
		if err != nil || got != stock {
			t.Errorf("shard %d stock %d (%v), want %d", shard, got, err, stock)
		}
		buyers, err := e.rdb.HGetAll(ctx, e.keys.Buyers(id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for _, u := range users {
			want[strconv.FormatInt(u, 10)] = strconv.FormatInt(1000*u+int64(shard), 10)
		}
		for u, o := range fromLedger {
			want[strconv.FormatInt(u, 10)] = strconv.FormatInt(o, 10)
		}
		if len(buyers) != len(want) {
			t.Errorf("shard %d buyers %v, want %v", shard, buyers, want)
		}
		for u, o := range want {
			if buyers[u] != o {
				t.Errorf("shard %d buyer %s holds order %q, want %s", shard, u, buyers[u], o)
			}
		}
	}
}

// reconnect waits until rdb answers again after its server restarted.
func reconnect(t testing.TB, rdb redis.UniversalClient) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "redis answers after the restart", func() bool {
		return rdb.Ping(context.Background()).Err() == nil
	})
}

// everyShardOnce fails unless got holds each of shards shards exactly once,
// each for reason.
func everyShardOnce(t testing.TB, got []rebuildEvent, shards int, reason string) {
	t.Helper()
	seen := map[int]int{}
	for _, r := range got {
		seen[r.shard]++
		if r.reason != reason {
			t.Errorf("shard %d rebuilt for %q, want %q", r.shard, r.reason, reason)
		}
	}
	if len(got) != shards || len(seen) != shards {
		t.Errorf("rebuilds %v, want each of %d shards once", got, shards)
	}
}

// TestQuietRedisRebuildsNothing: on a Redis that neither restarts nor
// loses anything, Warm rounds after the first load rebuild nothing, in an
// instance that was there from the start as in one that starts later, and
// purchases go on between the rounds.
func TestQuietRedisRebuildsNothing(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 4, 100, ledger{})
	var log rebuildLog
	w := e.instance(&log)
	warm(t, w)
	everyShardOnce(t, log.take(), 4, RebuildMissing) // the first load
	later := e.instance(&log)
	for round := range 200 {
		warm(t, w)
		warm(t, later)
		if err := e.buy(t, round%4, int64(round/4+1)); err != nil {
			t.Fatalf("round %d: purchase: %v", round, err)
		}
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("a quiet redis rebuilt shards %d times, first %v", len(got), got[0])
	}
	users := make([]int64, 50)
	for i := range users {
		users[i] = int64(i + 1)
	}
	e.checkSale(t, 50, users, nil)
}

// TestRestartWithDataRebuildsEveryShardOnce: Redis restarted with its AOF
// keeps its data and ready markers, but it is another process, which may
// have lost what it had not persisted. Every shard is rebuilt once, as
// master_changed, also by an instance that started after the restart;
// stock and buyers are what they were, and purchases go on.
func TestRestartWithDataRebuildsEveryShardOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 3, 10, ledger{})
	var log rebuildLog
	before := e.instance(&log)
	warm(t, before)
	log.take()
	for shard := range 3 {
		for _, user := range []int64{1, 2, 3} {
			if err := e.buy(t, shard, user); err != nil {
				t.Fatal(err)
			}
		}
	}

	srv.Restart(t)
	reconnect(t, e.rdb)
	after := e.instance(&log) // an instance started after the restart
	warm(t, after)
	everyShardOnce(t, log.take(), 3, RebuildMasterChanged)
	for range 5 {
		warm(t, before)
		warm(t, after)
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("rebuilt again: %v", got)
	}
	e.checkSale(t, 7, []int64{1, 2, 3}, nil)
	ctx := context.Background()
	id, err := NewState(e.rdb, e.keys).masters().identity(ctx, e.keys.Ready(0))
	if err != nil || id == "" {
		t.Fatalf("run_id %q, %v", id, err)
	}
	for shard := range 3 {
		if marker, _ := e.rdb.Get(ctx, e.keys.Ready(shard)).Result(); marker != id {
			t.Errorf("shard %d marker %q, want the run_id %s", shard, marker, id)
		}
	}
	if err := e.buy(t, 0, 4); err != nil {
		t.Fatalf("purchase after the rebuild: %v", err)
	}
}

// TestRestartWithoutDataRebuildsMissing: Redis restarted with no
// persistence lost everything; purchases fail closed until the first
// instance to warm rebuilds every shard from the database, as missing,
// and the other instance, which ran before the restart too, rebuilds
// nothing more.
func TestRestartWithoutDataRebuildsMissing(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	inDB := map[int64]int64{1: 501, 2: 502}
	e := newRestartEnv(t, srv.Client(t), 3, 10, ledger{buyers: inDB})
	var log rebuildLog
	first, second := e.instance(&log), e.instance(&log)
	warm(t, first)
	warm(t, second)
	everyShardOnce(t, log.take(), 3, RebuildMissing)

	srv.Restart(t)
	reconnect(t, e.rdb)
	if err := e.buy(t, 1, 9); !errors.Is(err, ErrNotReady) {
		t.Fatalf("purchase before the rebuild: %v, want ErrNotReady", err)
	}
	warm(t, first)
	everyShardOnce(t, log.take(), 3, RebuildMissing)
	for range 5 {
		warm(t, second)
		warm(t, first)
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("rebuilt again: %v", got)
	}
	e.checkSale(t, 8, nil, inDB)
}

// TestTwoInstancesRebuildOnce: two instances that both ran before Redis
// restarted with its data reach the same verdict from Redis alone, and
// the shard is rebuilt once in all.
func TestTwoInstancesRebuildOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 2, 10, ledger{})
	var log rebuildLog
	one, two := e.instance(&log), e.instance(&log)
	warm(t, one)
	warm(t, two)
	log.take()
	if err := e.buy(t, 1, 1); err != nil {
		t.Fatal(err)
	}

	srv.Restart(t)
	reconnect(t, e.rdb)
	for range 3 {
		warm(t, one)
		warm(t, two)
	}
	everyShardOnce(t, log.take(), 2, RebuildMasterChanged)
	if err := e.buy(t, 1, 2); err != nil {
		t.Fatalf("purchase after the rebuild: %v", err)
	}
}

// TestInstancesRacingAfterRestartRebuildOnce: eight instances warming at
// the same moment after a restart rebuild each shard once: the
// compare-and-delete of the stale marker and the rebuild lease keep an
// instance from undoing or repeating another's rebuild.
func TestInstancesRacingAfterRestartRebuildOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	e := newRestartEnv(t, srv.Client(t), 2, 10, ledger{})
	var log rebuildLog
	warm(t, e.instance(&log))
	log.take()

	srv.Restart(t)
	reconnect(t, e.rdb)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8*3)
	for range 8 {
		w := e.instance(&log)
		wg.Go(func() {
			<-start
			for range 3 {
				if _, err := w.Warm(context.Background()); err != nil {
					errs <- err
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	everyShardOnce(t, log.take(), 2, RebuildMasterChanged)
}

// TestEmbeddedRedisWarmsByMarker: the embedded Redis (miniredis) does not
// tell its run_id, so a shard is judged by its ready marker's existence:
// Warm rounds rebuild nothing, and a lost marker is still rebuilt.
func TestEmbeddedRedisWarmsByMarker(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		t.Logf("miniredis answers INFO server now (%q): this test no longer covers the fallback", info)
	}
	e := newRestartEnv(t, rdb, 2, 300, ledger{})
	var log rebuildLog
	w := e.instance(&log)
	warm(t, w)
	everyShardOnce(t, log.take(), 2, RebuildMissing)
	for round := range 200 {
		warm(t, w)
		if err := e.buy(t, round%2, int64(round+1)); err != nil {
			t.Fatalf("round %d: purchase: %v", round, err)
		}
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("a quiet embedded redis rebuilt shards %d times, first %v", len(got), got[0])
	}
	if err := rdb.Del(ctx, e.keys.Ready(1)).Err(); err != nil {
		t.Fatal(err)
	}
	warm(t, w)
	if got := log.take(); len(got) != 1 || got[0] != (rebuildEvent{1, RebuildMissing}) {
		t.Fatalf("after the marker was lost: %v, want shard 1 rebuilt as missing", got)
	}
}

// TestOldMarkerRebuildsOnce: a ready marker written before markers held
// the master's run_id (a time) does not name the master: the shard is
// rebuilt once, then left alone.
func TestOldMarkerRebuildsOnce(t *testing.T) {
	t.Parallel()
	e := newRestartEnv(t, testenv.Redis(t), 1, 10, ledger{})
	ctx := context.Background()
	if err := e.rdb.Set(ctx, e.keys.Ready(0), time.Now().UTC().Format(time.RFC3339), 0).Err(); err != nil {
		t.Fatal(err)
	}
	var log rebuildLog
	w := e.instance(&log)
	for range 3 {
		warm(t, w)
	}
	if got := log.take(); len(got) != 1 || got[0] != (rebuildEvent{0, RebuildMasterChanged}) {
		t.Fatalf("rebuilds %v, want shard 0 once as master_changed", got)
	}
}

// TestDropMarkerComparesFirst: a stale marker is dropped only while it
// holds the value read and the rebuild lease is free, and the lease is
// then the dropper's; a marker another instance rewrote meanwhile stays.
func TestDropMarkerComparesFirst(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := NewKeys(testenv.Prefix(t), 1)
	st := NewState(rdb, keys)
	if err := rdb.Set(ctx, keys.Ready(0), "new-master", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if dropped, err := st.dropMarker(ctx, 0, "old-master", "a", time.Minute); err != nil || dropped {
		t.Fatalf("dropped a marker rewritten meanwhile (%v)", err)
	}
	if err := rdb.Set(ctx, keys.Rebuilding(0), "b", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if dropped, err := st.dropMarker(ctx, 0, "new-master", "a", time.Minute); err != nil || dropped {
		t.Fatalf("dropped the marker while another held the lease (%v)", err)
	}
	if got, _ := rdb.Get(ctx, keys.Ready(0)).Result(); got != "new-master" {
		t.Fatalf("marker %q, want new-master", got)
	}
	if err := rdb.Del(ctx, keys.Rebuilding(0)).Err(); err != nil {
		t.Fatal(err)
	}
	if dropped, err := st.dropMarker(ctx, 0, "new-master", "a", time.Minute); err != nil || !dropped {
		t.Fatalf("kept the marker read (%v)", err)
	}
	if got, _ := rdb.Get(ctx, keys.Rebuilding(0)).Result(); got != "a" {
		t.Fatalf("lease %q after the drop, want the dropper's", got)
	}
}

// TestClusterFailoverRebuildsItsShards: on a Redis Cluster each shard is
// judged by the master serving its slot. Quiet, Warm rounds rebuild
// nothing; after the master of shard 0 is killed and its replica takes
// over, only the shards that master served are rebuilt, as
// master_changed.
func TestClusterFailoverRebuildsItsShards(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	e := newRestartEnv(t, cluster.Client(t), 3, 10, ledger{})
	var log rebuildLog
	w := e.instance(&log)
	warm(t, w)
	everyShardOnce(t, log.take(), 3, RebuildMissing)
	for range 100 {
		warm(t, w)
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("a quiet cluster rebuilt shards %d times, first %v", len(got), got[0])
	}

	// Kill only once the replica holds every write so far: a replica still
	// syncing (a link that dropped on a loaded machine) promoted empty
	// would lose the shard's marker, a rebuild for "missing" (seen once in
	// a full run). Our own write in shard 0's slot, confirmed by WAIT,
	// comes after them in the replication stream.
	cluster.WaitHealthy(t, 30*time.Second)
	killed := cluster.MasterOf(t, e.keys.Ready(0))
	probe := redis.NewClient(&redis.Options{Addr: killed.Addr})
	defer probe.Close()
	conn := probe.Conn()
	defer conn.Close()
	ctx := context.Background()
	if err := conn.Set(ctx, e.keys.Tag(0)+":probe", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 on shard 0's master: %d (%v)", n, err)
	}
	onKilled := map[int]bool{}
	for shard := range 3 {
		onKilled[shard] = cluster.MasterOf(t, e.keys.Ready(shard)).Addr == killed.Addr
	}
	killed.Kill(t)
	cluster.WaitFailover(t, killed, 30*time.Second)
	// The client learns the new slot map within a second or so; until
	// then the shards of the killed master cannot be checked.
	testenv.WaitFor(t, 30*time.Second, "a warm round without errors after the failover", func() bool {
		_, err := w.Warm(context.Background())
		return err == nil
	})
	for range 5 {
		warm(t, w)
	}
	got := log.take()
	want := 0
	for shard, on := range onKilled {
		if on {
			want++
		}
		n := 0
		for _, r := range got {
			if r.shard == shard {
				n++
			}
		}
		switch {
		case on && n != 1:
			t.Errorf("shard %d, on the killed master, rebuilt %d times, want once", shard, n)
		case !on && n != 0:
			t.Errorf("shard %d, on a master still up, rebuilt %d times, want never", shard, n)
		}
	}
	for _, r := range got {
		if r.reason != RebuildMasterChanged {
			t.Errorf("shard %d rebuilt for %q, want %q", r.shard, r.reason, RebuildMasterChanged)
		}
	}
	t.Logf("%d of 3 shards were on the killed master; rebuilds %v", want, got)
}

// TestJudge is the verdict table of a shard, without servers.
func TestJudge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    shardCheck
		want shardVerdict
	}{
		{"marker missing", shardCheck{master: "a"}, shardLost},
		{"marker missing, identity unknown", shardCheck{}, shardLost},
		{"same master", shardCheck{marker: "a", present: true, master: "a"}, shardCurrent},
		{"identity unknown", shardCheck{marker: "a", present: true}, shardCurrent},
		{"another master", shardCheck{marker: "a", present: true, master: "b"}, shardStale},
		{"marker of an older version", shardCheck{marker: "2025-01-01T00:00:00Z", present: true, master: "b"}, shardStale},
		{"marker written while unknown", shardCheck{marker: unknownMaster, present: true, master: "b"}, shardStale},
	} {
		if got := judge(tc.c); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
