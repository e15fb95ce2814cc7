package order

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// heldOf reads which locks of a take are held.
func heldOf(held []*redsync.Mutex) []bool {
	out := make([]bool, len(held))
	for i, m := range held {
		out[i] = m != nil
	}
	return out
}

// lockNodes starts n independent lock nodes.
func lockNodes(t *testing.T, n int) ([]redis.UniversalClient, []*testenv.RedisServer) {
	t.Helper()
	var nodes []redis.UniversalClient
	var servers []*testenv.RedisServer
	for range n {
		s := testenv.StartRedis(t, testenv.RedisOptions{})
		servers = append(servers, s)
		c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 200 * time.Millisecond, MaxRetries: 0})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
	}
	return nodes, servers
}

// TestLocksQuorumWithOneNodeDown: on three independent nodes a lock is
// held by a majority; with one node killed locks still work and still
// exclude each other; with two killed no lock can be taken, the try fails
// and leaves nothing behind on the live node.
func TestLocksQuorumWithOneNodeDown(t *testing.T) {
	t.Parallel()
	nodes, servers := lockNodes(t, 3)
	l := NewLocks(nodes, 5*time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	check := func(stage string) {
		k := "k-" + stage
		a, err := l.tryAll(ctx, []string{k}, []string{"order:1"})
		if err != nil || a[0] == nil {
			t.Fatalf("%s: first lock: %v %v", stage, a, err)
		}
		b, err := l.tryAll(ctx, []string{k}, []string{"order:2"})
		if err != nil || b[0] != nil {
			t.Fatalf("%s: second holder got the lock (%v, %v)", stage, b, err)
		}
		l.release(ctx, a)
		// A release returns once a majority released; the last node's
		// may still be on its way.
		testenv.WaitFor(t, 5*time.Second, stage+": lock released on every live node", func() bool {
			for i, n := range nodes {
				if i == 1 && stage != "three nodes" {
					continue // killed
				}
				if x, err := n.Exists(ctx, k).Result(); err != nil || x != 0 {
					return false
				}
			}
			return true
		})
		c, err := l.tryAll(ctx, []string{k}, []string{"order:3"})
		if err != nil || c[0] == nil {
			t.Fatalf("%s: lock not free after release: %v", stage, err)
		}
		l.release(ctx, c)
	}
	check("three nodes")
	// A lock left behind by an earlier try of the same order is taken
	// over; another order still waits.
	stale, err := l.tryAll(ctx, []string{"s"}, []string{"order:9"})
	if err != nil || stale[0] == nil {
		t.Fatalf("stale lock: %v", err)
	}
	again, err := l.tryAll(ctx, []string{"s"}, []string{"order:9"})
	if err != nil || again[0] == nil {
		t.Fatalf("the same order could not take over its own lock: %v", err)
	}
	if other, err := l.tryAll(ctx, []string{"s"}, []string{"order:10"}); err != nil || other[0] != nil {
		t.Fatalf("another order took a held lock: %v", err)
	}
	servers[1].Kill(t)
	check("one node killed")
	servers[2].Kill(t)
	if set, err := l.tryAll(ctx, []string{"k-two", "s"}, []string{"order:11", "order:9"}); err == nil {
		t.Fatalf("two nodes of three killed: took %v, want an error", heldOf(set))
	}
	for _, k := range []string{"k-two", "s"} {
		if x, err := nodes[0].Exists(ctx, k).Result(); err != nil || x != 0 {
			t.Fatalf("a failed try left %s on the live node (%d, %v)", k, x, err)
		}
	}
}

// TestLocksPausedNodeHoldsUpNothing: on three nodes, one paused
// (SIGSTOP), a batch's locks are taken and released as soon as the two
// others answer, not after the paused node's read timeout (5s here).
func TestLocksPausedNodeHoldsUpNothing(t *testing.T) {
	t.Parallel()
	var nodes []redis.UniversalClient
	var servers []*testenv.RedisServer
	for range 3 {
		s := testenv.StartRedis(t, testenv.RedisOptions{})
		servers = append(servers, s)
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ReadTimeout: 5 * time.Second, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
	}
	l := NewLocks(nodes, 10*time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	var keys, values []string
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("k%d", i))
		values = append(values, fmt.Sprintf("order:%d", i))
	}
	servers[2].Pause(t)
	t.Cleanup(func() { servers[2].Resume(t) })
	began := time.Now()
	set, err := l.tryAll(ctx, keys, values)
	if err != nil || slices.Contains(set, nil) {
		t.Fatalf("take with one node paused: %v %v", set, err)
	}
	l.release(ctx, set)
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("take and release took %v: they waited for the paused node", took)
	}
	for i, n := range nodes[:2] {
		if x, err := n.Exists(ctx, keys...).Result(); err != nil || x != 0 {
			t.Fatalf("node %d: %d locks left after release (%v)", i, x, err)
		}
	}
}

// TestLocksPartialGrantReleased: on three nodes, a lock only one node
// granted (two hold another order's) is a conflict, and that node lets it
// go; the other order's locks stay. In the same batch a key of another
// type counts as held elsewhere, and the batch's other locks are taken.
// Keys y0..y2, each held elsewhere on node i alone, make the batch wait
// for all three nodes (any two split on one of them), so k's grant is
// given back before the take returns, not by the late path (which
// TestLocksStampede covers).
func TestLocksPartialGrantReleased(t *testing.T) {
	t.Parallel()
	nodes, _ := lockNodes(t, 3)
	l := NewLocks(nodes, 5*time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	for _, n := range nodes[:2] {
		if err := n.Set(ctx, "k", "order:2", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range nodes {
		if err := n.HSet(ctx, "h", "f", "v").Err(); err != nil {
			t.Fatal(err)
		}
		if err := n.Set(ctx, fmt.Sprintf("y%d", i), "order:9", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	set, err := l.tryAll(ctx, []string{"k", "h", "free", "y0", "y1", "y2"},
		[]string{"order:1", "order:3", "order:4", "order:5", "order:6", "order:7"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{false, false, true, true, true, true}; !slices.Equal(heldOf(set), want) {
		t.Fatalf("held %v, want %v", heldOf(set), want)
	}
	if x, err := nodes[2].Exists(ctx, "k").Result(); err != nil || x != 0 {
		t.Fatalf("node 2 still holds k for order 1 after the take (%d, %v): its grant not given back", x, err)
	}
	for i, n := range nodes[:2] {
		if v, err := n.Get(ctx, "k").Result(); err != nil || v != "order:2" {
			t.Fatalf("node %d: k = %q (%v), want order:2's lock kept", i, v, err)
		}
	}
	l.release(ctx, set)
	testenv.WaitFor(t, 5*time.Second, "the batch's locks released on every node", func() bool {
		for i, n := range nodes {
			if x, err := n.Exists(ctx, "free").Result(); err != nil || x != 0 {
				return false
			}
			if v, err := n.Get(ctx, fmt.Sprintf("y%d", i)).Result(); err != nil || v != "order:9" {
				t.Fatalf("node %d: y%d = %q (%v), want order 9's lock kept", i, i, v, err)
			}
			for j := range 3 {
				if v, _ := n.Get(ctx, fmt.Sprintf("y%d", j)).Result(); v != "order:9" && v != "" {
					return false
				}
			}
		}
		return true
	})
}

// TestLocksAsRedsyncHoldsThem: a batch's locks are what redsync's Mutex
// holds: redsync's Extend and Unlock of a Mutex with the lock's value work
// on them, a redsync Mutex of another value cannot take one, and a lock
// redsync took excludes another order's batch and is taken over by its
// own order's.
func TestLocksAsRedsyncHoldsThem(t *testing.T) {
	t.Parallel()
	nodes, _ := lockNodes(t, 1)
	node := nodes[0]
	ttl := 5 * time.Second
	l := NewLocks(nodes, ttl, slog.New(slog.DiscardHandler))
	rs := redsync.New(goredis.NewPool(node))
	ctx := context.Background()
	set, err := l.tryAll(ctx, []string{"k1", "k2"}, []string{"order:1", "order:2"})
	if err != nil || !slices.Equal(heldOf(set), []bool{true, true}) {
		t.Fatalf("take: %v %v", set, err)
	}
	if v, err := node.Get(ctx, "k1").Result(); err != nil || v != "order:1" {
		t.Fatalf("k1 = %q (%v), want order:1", v, err)
	}
	if p, err := node.PTTL(ctx, "k1").Result(); err != nil || p <= 0 || p > ttl {
		t.Fatalf("k1 expires in %v (%v), want within %v", p, err, ttl)
	}
	if ok, err := rs.NewMutex("k1", redsync.WithValue("order:1"), redsync.WithExpiry(time.Minute)).Extend(); !ok || err != nil {
		t.Fatalf("redsync's Extend of order 1's lock: %v %v", ok, err)
	}
	if p, err := node.PTTL(ctx, "k1").Result(); err != nil || p <= ttl {
		t.Fatalf("k1 expires in %v (%v) after redsync extended it to a minute", p, err)
	}
	if err := rs.NewMutex("k2", redsync.WithTries(1)).TryLock(); err == nil {
		t.Fatal("a redsync Mutex of another value took k2, held by the batch")
	}
	if ok, err := rs.NewMutex("k2", redsync.WithValue("order:2")).Unlock(); !ok || err != nil {
		t.Fatalf("redsync's Unlock of order 2's lock: %v %v", ok, err)
	}
	if x, err := node.Exists(ctx, "k2").Result(); err != nil || x != 0 {
		t.Fatalf("k2 still there after redsync's Unlock (%d, %v)", x, err)
	}

	m := rs.NewMutex("k3", redsync.WithTries(1), redsync.WithGenValueFunc(func() (string, error) { return "order:3", nil }))
	if err := m.TryLock(); err != nil {
		t.Fatal(err)
	}
	if other, err := l.tryAll(ctx, []string{"k3"}, []string{"order:4"}); err != nil || other[0] != nil {
		t.Fatalf("order 4 took k3, which redsync holds for order 3 (%v)", err)
	}
	own, err := l.tryAll(ctx, []string{"k3"}, []string{"order:3"})
	if err != nil || own[0] == nil {
		t.Fatalf("order 3 could not take over the lock redsync took for it (%v)", err)
	}
	l.release(ctx, set)
	l.release(ctx, own)
	if n, err := node.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys left after release (%v), want 0", n, err)
	}
}

// TestLocksStampede: 500 batches released at once, each of three keys
// among 20 and for an order of its own. On one node and on a Redis
// Cluster (where the keys lie in many slots) every key ends with exactly
// one holder; on three nodes (a Redlock, where split votes leave a key to
// no one) with at most one. After the nodes forgot their scripts (restart,
// SCRIPT FLUSH) the release still deletes every lock.
func TestLocksStampede(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		nodes func(t *testing.T) []redis.UniversalClient
		exact bool
	}{
		{"one node", func(t *testing.T) []redis.UniversalClient { n, _ := lockNodes(t, 1); return n }, true},
		{"three nodes", func(t *testing.T) []redis.UniversalClient { n, _ := lockNodes(t, 3); return n }, false},
		{"cluster", func(t *testing.T) []redis.UniversalClient {
			return []redis.UniversalClient{testenv.StartCluster(t, testenv.ClusterOptions{Replicas: -1}).Client(t)}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			nodes := c.nodes(t)
			// A minute: a failed call is a retried batch, not a wrong
			// answer; what this test counts is the winners.
			l := NewLocks(nodes, time.Minute, slog.New(slog.DiscardHandler))
			ctx := context.Background()
			const callers, keys = 500, 20
			sets := make([][]*redsync.Mutex, callers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			var failed atomic.Int64
			for i := range callers {
				wg.Go(func() {
					<-start
					var ks, vs []string
					for _, j := range []int{i, i + 7, i + 13} {
						ks = append(ks, fmt.Sprintf("k%d", j%keys))
						vs = append(vs, fmt.Sprintf("order:%d", i))
					}
					set, err := l.tryAll(ctx, ks, vs)
					if err != nil {
						failed.Add(1)
						return
					}
					sets[i] = set
				})
			}
			close(start)
			wg.Wait()
			if failed.Load() != 0 {
				t.Fatalf("%d lock calls failed", failed.Load())
			}
			holders := map[string]int{}
			for _, s := range sets {
				for _, m := range s {
					if m != nil {
						holders[m.Name()]++
					}
				}
			}
			total := 0
			for k := range keys {
				n := holders[fmt.Sprintf("k%d", k)]
				total += n
				if n > 1 || (c.exact && n != 1) {
					t.Errorf("key k%d: %d holders", k, n)
				}
			}
			if total == 0 {
				t.Fatal("no batch took any lock")
			}
			// Grants the takes did not wait for are given back, or held.
			l.late.Wait()
			for _, n := range nodes {
				if err := n.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range sets {
				l.release(ctx, s)
			}
			testenv.WaitFor(t, 10*time.Second, "every lock released on every node", func() bool {
				for k := range keys {
					for _, n := range nodes {
						if x, err := n.Exists(ctx, fmt.Sprintf("k%d", k)).Result(); err != nil || x != 0 {
							return false
						}
					}
				}
				return true
			})
		})
	}
}

// TestLocksWatchExtends: the watchdog renews a batch's held locks before
// they expire, and only those.
func TestLocksWatchExtends(t *testing.T) {
	t.Parallel()
	nodes, _ := lockNodes(t, 1)
	node := nodes[0]
	ttl := 600 * time.Millisecond
	l := NewLocks(nodes, ttl, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if err := node.Set(ctx, "taken", "order:2", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	set, err := l.tryAll(ctx, []string{"k", "taken"}, []string{"order:1", "order:1"})
	if err != nil || !slices.Equal(heldOf(set), []bool{true, false}) {
		t.Fatalf("take: %v %v", set, err)
	}
	stop := l.watch(ctx, set)
	// Renewed: still there three expiries later.
	deadline := time.Now().Add(3 * ttl)
	testenv.WaitFor(t, 10*time.Second, "three expiries passed", func() bool {
		if x, _ := node.Exists(ctx, "k").Result(); x != 1 {
			t.Fatal("the watched lock expired")
		}
		return time.Now().After(deadline)
	})
	stop()
	if v, err := node.Get(ctx, "taken").Result(); err != nil || v != "order:2" {
		t.Fatalf("taken = %q (%v): the watch touched a lock it does not hold", v, err)
	}
	testenv.WaitFor(t, 10*time.Second, "the lock expires once the watch stopped", func() bool {
		x, _ := node.Exists(ctx, "k").Result()
		return x == 0
	})
}

func stateEnv(t *testing.T, e writerEnv, vid int64, stock int, buyers map[int64]int64) {
	t.Helper()
	st := voucher.NewState(e.rdb, e.keys)
	v := voucher.Voucher{ID: vid, Stock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if _, err := st.Load(context.Background(), v, buyers); err != nil {
		t.Fatal(err)
	}
}

func redisStock(t *testing.T, e writerEnv, vid int64) (int64, map[string]string) {
	t.Helper()
	ctx := context.Background()
	n, err := e.rdb.HGet(ctx, e.keys.State(vid), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.rdb.HGetAll(ctx, e.keys.Buyers(vid)).Result()
	return n, b
}

// TestWriterLockConflict: a buyer whose lock is held elsewhere is retried
// through the delay queue; on the last attempt it is dead-lettered and its
// reservation given back, exactly once.
func TestWriterLockConflict(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	locks := NewLocks([]redis.UniversalClient{e.rdb}, 5*time.Second, slog.New(slog.DiscardHandler))
	w := NewWriter(e.db, e.rdb, e.keys, WriterConfig{Locks: locks, KeyPrefix: e.keys.Prefix(), MaxAttempts: 3}, slog.New(slog.DiscardHandler))
	v := e.voucher(t, 10)
	// Redis reserved two units: stock 8, buyers 1 and 2.
	stateEnv(t, e, v, 8, map[int64]int64{1: 901, 2: 902})
	other, err := locks.tryAll(context.Background(), []string{lockKey(e.keys.Prefix(), v, 2)}, []string{"order:77"})
	if err != nil || other[0] == nil {
		t.Fatalf("hold lock: %v", err)
	}
	defer locks.release(context.Background(), other)

	batch := []mq.Message{msg(1, 901, 1, v), msg(2, 902, 2, v)}
	out := handle(t, w, batch)
	if out[0] != mq.Ack || out[1] != mq.Retry {
		t.Fatalf("outcomes %v, want [Ack Retry]", out)
	}
	if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 0 {
		t.Fatalf("stock %d orders %d dead %d; want 9 1 0", s, o, d)
	}
	last := msg(2, 902, 2, v)
	last.Attempt = 2
	for range 2 { // the second time is a redelivery
		if out := handle(t, w, []mq.Message{last}); out[0] != mq.Ack {
			t.Fatalf("last attempt: outcome %v, want Ack (dead letter)", out[0])
		}
		d, err := NewStore(e.db).DeadLetterOf(context.Background(), 902)
		if err != nil || d.Reason != ReasonAttemptLimit {
			t.Fatalf("dead letter %+v, %v", d, err)
		}
		stock, buyers := redisStock(t, e, v)
		if stock != 9 || buyers["2"] != "" || buyers["1"] != "901" {
			t.Fatalf("redis stock %d buyers %v; want 9 and only buyer 1", stock, buyers)
		}
	}
	if s, o, d := e.counts(t, v); s != 9 || o != 1 || d != 1 {
		t.Fatalf("stock %d orders %d dead %d; want 9 1 1", s, o, d)
	}
}

// TestWriterDeliveryLimit: a message delivered too often is dead-lettered
// and its reservation given back once; the buyer may buy again.
func TestWriterDeliveryLimit(t *testing.T) {
	t.Parallel()
	e := newWriterEnv(t)
	v := e.voucher(t, 5)
	stateEnv(t, e, v, 4, map[int64]int64{7: 1001})
	m := msg(1, 1001, 7, v)
	m.Deliveries = 6
	for range 2 {
		if out := handle(t, e.w, []mq.Message{m}); out[0] != mq.Ack {
			t.Fatalf("outcome %v", out[0])
		}
		stock, buyers := redisStock(t, e, v)
		if stock != 5 || len(buyers) != 0 {
			t.Fatalf("redis stock %d buyers %v; want 5 and none", stock, buyers)
		}
	}
	if s, o, d := e.counts(t, v); s != 5 || o != 0 || d != 1 {
		t.Fatalf("stock %d orders %d dead %d; want 5 0 1", s, o, d)
	}
}

// redsync's scripts (redsync v4's scripts.go), by the SHA-1 of their text:
// its Unlock's compare-and-delete and its Extend's compare-and-expire.
const (
	redsyncUnlockSHA = "e950836ed1e694540c503ef9972b8de518044d3b"
	redsyncExtendSHA = "d75bb8b5bd13532ddedd17762e772346e39b321e"
)

// evalCounter counts the scripts a client sends as EVAL in pipelines, by
// the SHA-1 of their text, and the pipelines that carry each.
type evalCounter struct {
	mu    sync.Mutex
	evals map[string]int
	pipes map[string]int
}

func (c *evalCounter) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		seen := map[string]bool{}
		for _, cmd := range cmds {
			if a := cmd.Args(); len(a) > 1 && a[0] == "eval" {
				src, _ := a[1].(string)
				h := fmt.Sprintf("%x", sha1.Sum([]byte(src)))
				c.evals[h]++
				if !seen[h] {
					seen[h] = true
					c.pipes[h]++
				}
			}
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// count is how many times the script of SHA-1 h was sent, and in how many
// pipelines.
func (c *evalCounter) count(h string) (evals, pipes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.evals[h], c.pipes[h]
}

// TestLocksReleaseAndExtendThroughRedsync: the locks a batch holds are
// extended by the watchdog and released by redsync itself (its Extend and
// Unlock scripts, one per lock, sharing pipelines): a held lock outlives
// its expiry while watched, with its PTTL renewed; one whose value another
// holder set meanwhile (it expired and was taken) is neither extended nor
// released; the others are gone after the release.
func TestLocksReleaseAndExtendThroughRedsync(t *testing.T) {
	t.Parallel()
	node := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
	c := &evalCounter{evals: map[string]int{}, pipes: map[string]int{}}
	node.AddHook(c)
	ttl := 900 * time.Millisecond
	l := NewLocks([]redis.UniversalClient{node}, ttl, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	const n = 200
	var keys, values []string
	for i := range n {
		keys = append(keys, fmt.Sprintf("k%d", i))
		values = append(values, fmt.Sprintf("order:%d", i))
	}
	held, err := l.tryAll(ctx, keys, values)
	if err != nil || slices.Contains(held, nil) {
		t.Fatalf("take: %v %v", heldOf(held), err)
	}
	taken := time.Now()
	// k0 expired under a pause and another order took it.
	if err := node.Set(ctx, "k0", "order:other", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	stop := l.watch(ctx, held)
	testenv.WaitFor(t, 10*time.Second, "two expiries passed with the watch on", func() bool {
		return time.Since(taken) > 2*ttl
	})
	for _, k := range keys[1:] {
		if p, err := node.PTTL(ctx, k).Result(); err != nil || p <= 0 || p > ttl {
			t.Fatalf("%s expires in %v (%v) two expiries after its take: not renewed to %v", k, p, err, ttl)
		}
	}
	stop()
	if e, _ := c.count(redsyncExtendSHA); e < 2*n {
		t.Fatalf("redsync's Extend sent %d times for %d locks over two expiries", e, n)
	}
	if p, err := node.PTTL(ctx, "k0").Result(); err != nil || p <= ttl {
		t.Fatalf("k0, another order's, expires in %v (%v): the watch extended it", p, err)
	}

	l.release(ctx, held)
	unlocks, pipes := c.count(redsyncUnlockSHA)
	if unlocks != n {
		t.Fatalf("redsync's Unlock sent %d times for %d locks", unlocks, n)
	}
	if pipes >= unlocks {
		t.Errorf("%d unlocks in %d pipelines: the releases did not share pipelines", unlocks, pipes)
	} else {
		t.Logf("%d unlocks in %d pipelines", unlocks, pipes)
	}
	if x, err := node.Exists(ctx, keys[1:]...).Result(); err != nil || x != 0 {
		t.Fatalf("%d locks left after the release (%v)", x, err)
	}
	if v, err := node.Get(ctx, "k0").Result(); err != nil || v != "order:other" {
		t.Fatalf("k0 = %q (%v) after the release, want another order's lock kept", v, err)
	}
}

// holdFirstPipeline holds up the first pipeline a client sends until
// release is closed; sent is closed once it is on its way.
type holdFirstPipeline struct {
	once    sync.Once
	sent    chan struct{}
	release chan struct{}
}

func (h *holdFirstPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdFirstPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdFirstPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		first := false
		h.once.Do(func() { first = true })
		if first {
			close(h.sent)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// TestPipePoolTakesBackUnsent: a command queued behind a pipeline on the
// wire, whose caller gives up (its context ends) before it is sent, is
// taken back and never reaches Redis, so it cannot land after the
// caller's later commands of its key; one already sent is waited for.
func TestPipePoolTakesBackUnsent(t *testing.T) {
	t.Parallel()
	node := testenv.StartRedis(t, testenv.RedisOptions{}).Client(t)
	h := &holdFirstPipeline{sent: make(chan struct{}), release: make(chan struct{})}
	node.AddHook(h)
	p := newPipePool(node)
	onWire, _ := p.Get(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := onWire.SetNX("k", "order:1", time.Minute)
		first <- err
	}()
	<-h.sent
	ctx, cancel := context.WithCancel(context.Background())
	queued, _ := p.Get(ctx)
	second := make(chan error, 1)
	go func() {
		_, err := queued.Eval(&rsredis.Script{KeyCount: 1, Src: `return redis.call("DEL", KEYS[1])`}, "k")
		second <- err
	}()
	// The DEL waits in k's lane behind the pipeline on the wire.
	testenv.WaitFor(t, 5*time.Second, "the DEL queued", func() bool {
		l := &p.lanes[maphash.String(p.seed, "k")%pipeLanes]
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.queue) == 1
	})
	cancel()
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(h.release) }) })
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the given-up DEL answered %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the given-up DEL is still waiting for the pipeline ahead of it")
	}
	released.Do(func() { close(h.release) })
	if err := <-first; err != nil {
		t.Fatalf("the SET on the wire: %v", err)
	}
	if v, err := node.Get(context.Background(), "k").Result(); err != nil || v != "order:1" {
		t.Fatalf("k = %q (%v): the DEL given up before it was sent reached Redis", v, err)
	}
}
