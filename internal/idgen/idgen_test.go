package idgen

import (
	"context"
	"errors"
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

func TestIDLayout(t *testing.T) {
	t.Parallel()
	now := time.Now()
	g := &Generator{worker: 5, now: func() time.Time { return now }, validUntil: now.Add(time.Hour)}
	id, err := g.Next()
	if err != nil {
		t.Fatal(err)
	}
	if w := (id >> seqBits) & maxWorker; w != 5 {
		t.Fatalf("worker bits %d, want 5", w)
	}
	if ms := id >> (workerBits + seqBits); ms != now.Sub(Epoch).Milliseconds() {
		t.Fatalf("time bits %d, want %d", ms, now.Sub(Epoch).Milliseconds())
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

func TestNoIDsWithoutLease(t *testing.T) {
	t.Parallel()
	now := time.Now()
	g := &Generator{worker: 1, now: func() time.Time { return now }, validUntil: now.Add(-time.Millisecond)}
	if _, err := g.Next(); !errors.Is(err, ErrNoLease) {
		t.Fatalf("err = %v, want ErrNoLease", err)
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
	cfg := Config{KeyPrefix: testenv.Prefix(t), TTL: 300 * time.Millisecond}
	g, err := Lease(ctx, rdb, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	first := g.Worker()
	// Someone else now holds the number.
	if err := rdb.Set(ctx, leaseKey(cfg.KeyPrefix, first), "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(rctx) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, 5*time.Second, "a new worker number", func() bool {
		_, err := g.Next()
		return g.Worker() != first && err == nil
	})
	if owner, _ := rdb.Get(ctx, leaseKey(cfg.KeyPrefix, first)).Result(); owner != "someone-else" {
		t.Fatalf("the other holder's lease was touched: %q", owner)
	}
}
