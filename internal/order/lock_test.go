package order

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestLocksQuorumWithOneNodeDown: on three independent nodes a lock is
// held by a majority; with one node killed locks still work and still
// exclude each other.
func TestLocksQuorumWithOneNodeDown(t *testing.T) {
	t.Parallel()
	var nodes []redis.UniversalClient
	var servers []*testenv.RedisServer
	for range 3 {
		s := testenv.StartRedis(t, testenv.RedisOptions{})
		servers = append(servers, s)
		c := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 200 * time.Millisecond, MaxRetries: 0})
		t.Cleanup(func() { c.Close() })
		nodes = append(nodes, c)
	}
	l := NewLocks(nodes, 5*time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	// Each stage locks a key of its own: a release returns once a majority
	// released, the last node's release may still be on its way.
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
		testenv.WaitFor(t, 5*time.Second, "lock released on every live node", func() bool {
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

// pipelineCounter counts the pipelines a client sends and the commands in
// them.
type pipelineCounter struct{ pipes, cmds atomic.Int64 }

func (c *pipelineCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *pipelineCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (c *pipelineCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipes.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// TestLocksStampede: 500 lock calls released at once on 20 keys, each for
// an order of its own: exactly one winner per key, although the calls share
// pipelines. After the node forgot its scripts (restart, SCRIPT FLUSH) the
// release still deletes every lock.
func TestLocksStampede(t *testing.T) {
	t.Parallel()
	s := testenv.StartRedis(t, testenv.RedisOptions{})
	node := s.Client(t)
	var count pipelineCounter
	node.AddHook(&count)
	// redsync gives each node TTL x 0.05 to answer: with 10s, 500 calls
	// released at once on a loaded 2-core machine under -race sometimes
	// passed 500 ms. A failed call is a retried batch, not a wrong answer;
	// what this test counts is the winners, so give the node time.
	l := NewLocks([]redis.UniversalClient{node}, time.Minute, slog.New(slog.DiscardHandler))
	ctx := context.Background()

	const callers, keys = 500, 20
	held := make([]*redsync.Mutex, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			h, err := l.tryAll(ctx, []string{fmt.Sprintf("k%d", i%keys)}, []string{fmt.Sprintf("order:%d", i)})
			if err != nil {
				failed.Add(1)
				return
			}
			held[i] = h[0]
		}()
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d lock calls failed", failed.Load())
	}
	winners := map[int]int{}
	for i, m := range held {
		if m != nil {
			winners[i%keys]++
		}
	}
	for k := range keys {
		if winners[k] != 1 {
			t.Errorf("key k%d: %d holders, want 1", k, winners[k])
		}
	}
	if p, c := count.pipes.Load(), count.cmds.Load(); p >= c {
		t.Errorf("%d pipelines for %d commands: the calls did not share pipelines", p, c)
	} else {
		t.Logf("%d commands in %d pipelines", c, p)
	}

	if err := node.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l.release(ctx, held)
	if n, err := node.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys left after release (%v), want 0", n, err)
	}
}

// slowRelease holds up the first pipeline that carries redsync's release
// script (EVAL text 1 key value) for longer than redsync waits for it:
// a slow link for that one round trip. done is closed once that pipeline
// has run.
type slowRelease struct {
	delay time.Duration
	once  sync.Once
	done  chan struct{}
}

func (s *slowRelease) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (s *slowRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (s *slowRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if a := c.Args(); len(a) == 5 && a[0] == "eval" {
				first := false
				s.once.Do(func() { first = true })
				if first {
					time.Sleep(s.delay) // the slow link
					defer close(s.done)
				}
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestLocksLateReleaseDeletesNothing: a release redsync gave up waiting
// for must not reach Redis after a later take of the same lock. The order
// takes over the lock an earlier try of it left; redsync's clean-up after
// the refused SET NX (a release of the same value) is held up on the
// wire past redsync's timeout; the lock the order then holds must still
// be there once that release has run, and another order must not get it.
func TestLocksLateReleaseDeletesNothing(t *testing.T) {
	t.Parallel()
	s := testenv.StartRedis(t, testenv.RedisOptions{})
	node := s.Client(t)
	slow := &slowRelease{delay: time.Second, done: make(chan struct{})} // redsync waits 500 ms (ttl 10s x 0.05)
	node.AddHook(slow)
	l := NewLocks([]redis.UniversalClient{node}, 10*time.Second, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	if err := node.Set(ctx, "k", "order:1", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	held, err := l.tryAll(ctx, []string{"k"}, []string{"order:1"})
	if err != nil || held[0] == nil {
		t.Fatalf("order 1 did not take over its own lock: %v", err)
	}
	select {
	case <-slow.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the held-up release never ran")
	}
	if v, err := node.Get(ctx, "k").Result(); err != nil || v != "order:1" {
		t.Fatalf("lock k = %q (%v) after the late release, want order:1", v, err)
	}
	if other, err := l.tryAll(ctx, []string{"k"}, []string{"order:2"}); err != nil || other[0] != nil {
		t.Fatalf("order 2 took k while order 1 holds it (%v)", err)
	}
}
