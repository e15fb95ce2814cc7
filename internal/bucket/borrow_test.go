package bucket

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/voucher"
)

// TestBorrowMovesWhenHomeEmpty: an empty home bucket borrows half the
// richest bucket's stock (rounded up, at most BorrowMax); a home with
// stock borrows nothing.
func TestBorrowMovesWhenHomeEmpty(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0, 9, 4)
	ctx := context.Background()
	m := e.mover(Config{})
	if err := m.Borrow(ctx, e.v, 0, e.nb); err != nil {
		t.Fatal(err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{5, 4, 4}) {
		t.Errorf("stocks %v, want [5 4 4]", got)
	}
	if err := m.Borrow(ctx, e.v, 0, e.nb); err != nil {
		t.Fatal(err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{5, 4, 4}) {
		t.Errorf("a home with stock borrowed: %v", got)
	}
	e.settled()

	big := newEnv(t, 0, 1000, 0)
	if err := big.mover(Config{BorrowMax: 100}).Borrow(ctx, big.v, 2, big.nb); err != nil {
		t.Fatal(err)
	}
	if got := big.stocks(); !slices.Equal(got, []int64{0, 900, 100}) {
		t.Errorf("stocks %v, want BorrowMax moved: [0 900 100]", got)
	}
}

// TestBorrowSoldOut: every bucket ready and empty with the allocs adding
// up to the total is sold out; a take journaled and not applied makes
// the same empty buckets "in transit", until it is recovered.
func TestBorrowSoldOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0, 1, 0)
	ctx := context.Background()
	m := e.mover(Config{})
	crash := e.mover(Config{AfterStep: stopAfter("take"), StaleAfter: time.Millisecond})
	if _, err := crash.Move(ctx, e.v, 1, 2, 1, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	if err := m.Borrow(ctx, e.v, 0, e.nb); !errors.Is(err, voucher.ErrInTransit) {
		t.Fatalf("Borrow with a unit in transit = %v, want ErrInTransit", err)
	}
	e.recoverAll(NewRecoverer(crash))
	if err := m.Borrow(ctx, e.v, 0, e.nb); err != nil {
		t.Fatalf("Borrow after the unit came back: %v", err)
	}
	if err := e.rdb.HSet(ctx, e.state(0), "stock", 0).Err(); err != nil { // sold
		t.Fatal(err)
	}
	if err := m.Borrow(ctx, e.v, 0, e.nb); !errors.Is(err, voucher.ErrSoldOut) {
		t.Fatalf("Borrow with every bucket empty = %v, want ErrSoldOut", err)
	}
}

// TestBorrowNotReady: a bucket not ready is never read as sold out, and
// a receiver not ready borrows nothing.
func TestBorrowNotReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0, 0, 0)
	ctx := context.Background()
	m := e.mover(Config{})
	if err := m.Borrow(ctx, e.v, 0, e.nb); !errors.Is(err, voucher.ErrSoldOut) {
		t.Fatalf("Borrow = %v, want ErrSoldOut", err)
	}
	if err := e.rdb.Del(ctx, e.keys.Ready(e.shard(2))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.Borrow(ctx, e.v, 0, e.nb); !errors.Is(err, voucher.ErrInTransit) || errors.Is(err, voucher.ErrSoldOut) {
		t.Fatalf("Borrow with bucket 2 not ready = %v, want ErrInTransit", err)
	}
	if err := m.Borrow(ctx, e.v, 2, e.nb); !errors.Is(err, voucher.ErrInTransit) {
		t.Fatalf("Borrow into a bucket not ready = %v, want ErrInTransit", err)
	}
}

// sell is a test sale: one unit out of a bucket's stock if it has one
// (alloc unchanged, as the purchase script does).
var sell = redis.NewScript(`
local s = tonumber(redis.call('HGET', KEYS[1], 'stock'))
if s > 0 then redis.call('HINCRBY', KEYS[1], 'stock', -1) return 1 end
return 0`)

// TestBorrowStampede: 300 buyers released at once, through three
// instances, each buying up to 2 units in its home bucket and borrowing
// when it is empty: exactly the total is sold, no stock goes negative,
// every move closes, and the allocs still add up.
func TestBorrowStampede(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0, 250, 150)
	ctx := context.Background()
	movers := []*Mover{e.mover(Config{}), e.mover(Config{}), e.mover(Config{})}
	var sold, soldOut atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 300 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			m, home := movers[g%3], g%e.nb
			for bought := 0; bought < 2; {
				n, err := sell.Run(ctx, e.rdb, []string{e.state(home)}).Int()
				if err != nil {
					t.Error(err)
					return
				}
				if n == 1 {
					bought++
					sold.Add(1)
					continue
				}
				err = m.Borrow(ctx, e.v, home, e.nb)
				if errors.Is(err, voucher.ErrSoldOut) {
					soldOut.Add(1)
					return
				}
				if err != nil && !errors.Is(err, voucher.ErrInTransit) {
					t.Error(err)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if sold.Load() != e.total {
		t.Errorf("sold %d, total %d", sold.Load(), e.total)
	}
	if soldOut.Load() == 0 {
		t.Error("no buyer was told sold out")
	}
	if got := e.stocks(); !slices.Equal(got, []int64{0, 0, 0}) {
		t.Errorf("stocks %v", got)
	}
	e.settled()
}

// TestBorrowPassesOverAFencedBucket: the richest bucket, fenced by a
// rebuild, gives nothing; a borrow takes from the richest unfenced one
// instead of failing on the fenced one.
func TestBorrowPassesOverAFencedBucket(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0, 3, 9)
	ctx := context.Background()
	m := e.mover(Config{})
	if _, err := m.fenceOp(ctx, e.v, e.nb, 2, "set", "3:rebuild"); err != nil {
		t.Fatal(err)
	}
	if err := m.Borrow(ctx, e.v, 0, e.nb); err != nil {
		t.Fatalf("Borrow with the richest bucket fenced = %v, want a borrow from bucket 1", err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{2, 1, 9}) {
		t.Errorf("stocks %v, want half of bucket 1's: [2 1 9]", got)
	}
	e.settled()
}
