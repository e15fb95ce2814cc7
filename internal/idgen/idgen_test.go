package idgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestTwoInstancesNoCollision leases two workers from one Redis, as two
// instances do, and makes ids on both at once from many goroutines.
func TestTwoInstancesNoCollision(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	cfg := Config{KeyPrefix: testenv.Prefix(t)}
	log := slog.New(slog.DiscardHandler)
	a, err := Lease(ctx, rdb, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Lease(ctx, rdb, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if a.Worker() == b.Worker() {
		t.Fatalf("both instances leased worker %d", a.Worker())
	}
	const perGoroutine, goroutines = 5000, 8
	ids := make(chan int64, 2*perGoroutine*goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 * goroutines {
		g := a
		if i%2 == 1 {
			g = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			last := int64(0)
			for range perGoroutine {
				id, err := g.Next()
				if err != nil {
					t.Error(err)
					return
				}
				if id <= last {
					t.Errorf("ids went backwards in one goroutine: %d after %d", id, last)
				}
				last = id
				ids <- id
			}
		}()
	}
	close(start)
	wg.Wait()
	close(ids)
	seen := map[int64]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("id %d made twice", id)
		}
		seen[id] = true
	}
	if len(seen) != 2*perGoroutine*goroutines {
		t.Fatalf("%d ids, want %d", len(seen), 2*perGoroutine*goroutines)
	}
}

// fakeClock is a wall clock that can step while the monotonic one runs on.
type fakeClock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

func newFakeClock() *fakeClock { return &fakeClock{wall: time.Now(), mono: time.Hour} }

func (c *fakeClock) Wall() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

func (c *fakeClock) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// advance lets time pass on both clocks.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall, c.mono = c.wall.Add(d), c.mono+d
}

// step sets the wall clock by d, as NTP does; the monotonic clock does not move.
func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
}

// held is a generator holding worker for an hour from the clock's now,
// without Redis.
func held(worker int64, c Clock) *Generator {
	g := &Generator{worker: worker, clock: c, ttl: time.Hour}
	g.anchor, g.anchorMs = c.Mono(), wallMs(c.Wall())
	g.floorMs, g.maxMs = g.anchorMs-1, g.anchorMs+time.Hour.Milliseconds()
	g.validUntil = g.anchor + time.Hour
	return g
}

func TestIDLayout(t *testing.T) {
	t.Parallel()
	c := newFakeClock()
	g := held(5, c)
	id, err := g.Next()
	if err != nil {
		t.Fatal(err)
	}
	if w := (id >> seqBits) & maxWorker; w != 5 {
		t.Fatalf("worker bits %d, want 5", w)
	}
	if ms := id >> (workerBits + seqBits); ms != wallMs(c.Wall()) {
		t.Fatalf("time bits %d, want %d", ms, wallMs(c.Wall()))
	}
	// One millisecond's sequence runs out: the next id borrows the next ms
	// and stays unique and increasing.
	prev := id
	for range maxSeq + 10 {
		next, err := g.Next()
		if err != nil || next <= prev {
			t.Fatalf("next %d after %d, %v", next, prev, err)
		}
		prev = next
	}
}

// TestBorrowStopsAtTheMark: borrowed milliseconds never pass the mark
// written to Redis, and a refused id leaves no sequence number reused.
func TestBorrowStopsAtTheMark(t *testing.T) {
	t.Parallel()
	c := newFakeClock()
	g := held(5, c)
	g.maxMs = g.anchorMs + 1
	seen := map[int64]bool{}
	n := 0
	for {
		id, err := g.Next()
		if err != nil {
			break
		}
		if seen[id] {
			t.Fatalf("id %d made twice", id)
		}
		seen[id] = true
		n++
	}
	if n != 2*(maxSeq+1) {
		t.Fatalf("%d ids before the mark stopped them, want %d", n, 2*(maxSeq+1))
	}
	if _, err := g.Next(); err == nil {
		t.Fatal("an id past the mark")
	}
}

func TestNoIDsWithoutLease(t *testing.T) {
	t.Parallel()
	c := newFakeClock()
	g := held(1, c)
	c.advance(time.Hour)
	if _, err := g.Next(); !errors.Is(err, ErrNoLease) {
		t.Fatalf("err = %v, want ErrNoLease", err)
	}
	// A wall clock stepped back does not make an expired lease look held.
	c.step(-2 * time.Hour)
	if _, err := g.Next(); !errors.Is(err, ErrNoLease) {
		t.Fatalf("err = %v after a step back, want ErrNoLease", err)
	}
}

// ids is a run of ids from one generator, checked as they come: each
// greater than the one before, none made twice.
type ids struct {
	tb   testing.TB
	last int64
	seen map[int64]bool
}

func (s *ids) take(g *Generator, n int) {
	s.tb.Helper()
	if s.seen == nil {
		s.seen = map[int64]bool{}
	}
	for range n {
		id, err := g.Next()
		if err != nil {
			s.tb.Fatalf("after %d ids: %v", len(s.seen), err)
		}
		if id <= s.last || s.seen[id] {
			s.tb.Fatalf("id %d after %d (made before: %v)", id, s.last, s.seen[id])
		}
		s.last = id
		s.seen[id] = true
	}
}

func msOf(id int64) int64 { return id >> (workerBits + seqBits) }

// TestWallClockSteps: the wall clock steps back an hour, then forward two,
// while an instance makes ids and renews its lease: ids keep coming, unique
// and increasing; a step back is ridden out on the monotonic clock, a step
// forward is taken up at the next renewal.
func TestWallClockSteps(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	c := newFakeClock()
	g, err := Lease(ctx, rdb, Config{KeyPrefix: testenv.Prefix(t), TTL: 3 * time.Second, Clock: c}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s := &ids{tb: t}
	s.take(g, 100)
	start := msOf(s.last)

	c.step(-time.Hour)
	for range 20 {
		c.advance(100 * time.Millisecond)
		s.take(g, 100)
		if g.renew(ctx); g.validUntil == 0 {
			t.Fatal("renewal after a step back lost the lease")
		}
	}
	if got, want := msOf(s.last), start+2000; got != want {
		t.Fatalf("after 2s on the monotonic clock the id clock moved %dms, want 2000", got-start)
	}

	c.step(2 * time.Hour)
	c.advance(time.Millisecond)
	s.take(g, 100)
	if got := msOf(s.last); got != start+2001 {
		t.Fatalf("before a renewal, the id clock jumped with the wall clock: %dms", got-start)
	}
	g.renew(ctx)
	c.advance(time.Millisecond)
	s.take(g, 100)
	if got, want := msOf(s.last), wallMs(c.Wall()); got != want {
		t.Fatalf("after a renewal the id clock is at %d, want the wall clock's %d", got, want)
	}
	mark, err := rdb.Get(ctx, markKey(g.key)).Int64()
	if err != nil || mark < msOf(s.last)+3000-1 {
		t.Fatalf("mark %d (%v), want at least a lease past %d", mark, err, msOf(s.last))
	}
}

// TestRestartWithWallClockBack: an instance stops (cleanly, or dies and its
// lease expires) and one starts on the same worker number with the wall
// clock an hour back: its ids are all above the ones made before.
func TestRestartWithWallClockBack(t *testing.T) {
	t.Parallel()
	for _, clean := range []bool{true, false} {
		t.Run(fmt.Sprintf("clean=%v", clean), func(t *testing.T) {
			t.Parallel()
			rdb := testenv.Redis(t)
			ctx := context.Background()
			cfg := Config{KeyPrefix: testenv.Prefix(t), TTL: 3 * time.Second, Clock: newFakeClock()}
			log := slog.New(slog.DiscardHandler)
			s := &ids{tb: t}
			for restart := range 3 {
				g, err := lease(ctx, rdb, cfg, log, fmt.Sprintf("owner-%d", restart), 7)
				if err != nil {
					t.Fatal(err)
				}
				if g.Worker() != 7 {
					t.Fatalf("restart %d leased worker %d, want 7", restart, g.Worker())
				}
				s.take(g, 5000)
				if clean {
					g.release(ctx)
					if end := msOf(s.last); g.lastMs != end {
						t.Fatalf("last ms %d, want %d", g.lastMs, end)
					}
				} else if err := rdb.Del(ctx, g.key).Err(); err != nil { // the lease ran out
					t.Fatal(err)
				}
				// The next start's wall clock is an hour behind this one's.
				next := newFakeClock()
				next.wall = cfg.Clock.Wall().Add(-time.Hour)
				cfg.Clock = next
			}
		})
	}
}

// TestLeaseReleasedOnStop: a stopped instance gives its worker number back
// and refuses to make ids after.
func TestLeaseReleasedOnStop(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	cfg := Config{KeyPrefix: testenv.Prefix(t), TTL: 3 * time.Second}
	g, err := Lease(context.Background(), rdb, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Exists(context.Background(), leaseKey(cfg.KeyPrefix, g.Worker())).Result(); err != nil || n != 0 {
		t.Fatalf("lease key still there after stop (%d, %v)", n, err)
	}
	if _, err := g.Next(); !errors.Is(err, ErrNoLease) {
		t.Fatalf("err = %v after stop, want ErrNoLease", err)
	}
}

// TestLeaseLostIsLeasedAgain: when the lease key disappears (Redis lost
// its data) and someone else takes that number, the generator leases a
// free number of its own instead of sharing it.
func TestLeaseLostIsLeasedAgain(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	cfg := Config{KeyPrefix: testenv.Prefix(t), TTL: 1500 * time.Millisecond}
	g, err := Lease(ctx, rdb, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	first := g.Worker()
	before, err := g.Next()
	if err != nil {
		t.Fatal(err)
	}
	// Someone else now holds the number.
	if err := rdb.Set(ctx, leaseKey(cfg.KeyPrefix, first), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	defer func() { cancel(); <-done }()
	var after int64
	testenv.WaitFor(t, 5*time.Second, "a new worker number", func() bool {
		after, err = g.Next()
		return g.Worker() != first && err == nil
	})
	if after <= before {
		t.Fatalf("id %d after the new lease, %d before it: the id clock went back", after, before)
	}
	if owner, _ := rdb.Get(ctx, leaseKey(cfg.KeyPrefix, first)).Result(); owner != "someone-else" {
		t.Fatalf("the other holder's lease was touched: %q", owner)
	}
}

// BenchmarkNext is the hot path: one id under the mutex.
func BenchmarkNext(b *testing.B) {
	g := held(1, systemClock{origin: time.Now()})
	for b.Loop() {
		if _, err := g.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLeasePassesOverADeadMaster: on a Redis Cluster whose master holding
// the first worker number's key is down, an instance starting leases a
// number whose key another master holds, instead of failing to start.
func TestLeasePassesOverADeadMaster(t *testing.T) {
	t.Parallel()
	rc := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	rdb := rc.Client(t)
	prefix := testenv.Prefix(t)
	dead := rc.MasterOf(t, leaseKey(prefix, 0))
	dead.Kill(t)
	g, err := lease(context.Background(), rdb, Config{KeyPrefix: prefix}, slog.New(slog.DiscardHandler), "owner", 0)
	if err != nil {
		t.Fatalf("lease with the master of worker 0's key down: %v", err)
	}
	if g.Worker() == 0 {
		t.Fatal("leased worker 0, whose master is down")
	}
}
