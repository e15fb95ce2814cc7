package order

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// bucketedSale is a priced voucher of two buckets in an env of four
// shards, and buyers of it, written, by home bucket.
type bucketedSale struct {
	v      voucher.Voucher
	byHome [2][]purchase
}

// newBucketedSale puts a voucher of 2 buckets (stock 20, 10 each) on sale
// and writes the purchases of n buyers homed in each bucket.
func newBucketedSale(t *testing.T, e lifeEnv, n int) bucketedSale {
	t.Helper()
	ctx := context.Background()
	v := voucher.Voucher{Title: "t", FaceValue: 5000, Price: 1990, TotalStock: 20, Buckets: 2,
		BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(24 * time.Hour)}
	if err := voucher.NewStore(e.db).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	if _, err := voucher.NewState(e.rdb, e.keys).Load(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	s := bucketedSale{v: v}
	r := voucher.NewReserver(e.rdb, e.keys)
	for len(s.byHome[0]) < n || len(s.byHome[1]) < n {
		user := e.next.Add(1)
		home := voucher.Home(user, 2)
		if len(s.byHome[home]) == n {
			continue
		}
		if _, err := r.Reserve(ctx, v.ID, user, user); err != nil {
			t.Fatalf("buyer %d (home %d) buys: %v", user, home, err)
		}
		m := voucher.Message{OrderID: user, UserID: user, VoucherID: v.ID, AcceptedAt: time.Now(), Bucket: home, Buckets: 2}
		p := purchase{order: user, user: user, voucher: v.ID, m: mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(user, 10), Values: m.Encode()}}
		e.write(t, p)
		s.byHome[home] = append(s.byHome[home], p)
	}
	return s
}

// shard is the shard of bucket b.
func (s bucketedSale) shard(e lifeEnv, b int) int { return e.keys.BucketShard(s.v.ID, b, 2) }

// stock is bucket b's stock in Redis.
func (s bucketedSale) stock(t *testing.T, e lifeEnv, b int) int64 {
	t.Helper()
	n, err := e.rdb.HGet(context.Background(), e.keys.StateAt(s.shard(e, b), s.v.ID), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// queuedIn lists the shards whose pay-deadline queue holds the order.
func queuedIn(t *testing.T, e lifeEnv, order int64) []int {
	t.Helper()
	var in []int
	for shard := range e.keys.Shards() {
		zs, err := e.rdb.ZRange(context.Background(), e.exp.Queue(shard).Key(), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, z := range zs {
			f, err := mq.ParsePayload(z)
			if err != nil {
				t.Fatal(err)
			}
			if f["order_id"] == strconv.FormatInt(order, 10) {
				in = append(in, shard)
			}
		}
	}
	return in
}

// TestBucketedDeadlinesRunInTheirBucket: the pay deadline of an order of a
// voucher of two buckets is queued in the shard of the buyer's home bucket
// (where its unit goes back), and nowhere else, also when an expiry
// handed over early schedules it again. With bucket 0's shard not
// ready (its master lost), the orders of bucket 1 still expire at their
// deadline, from bucket 1's shard's queue, and their units go back to
// bucket 1; those of bucket 0 wait, awaiting payment.
func TestBucketedDeadlinesRunInTheirBucket(t *testing.T) {
	t.Parallel()
	for _, dialect := range lifeDBs {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := newLifeEnvOf(t, dialect, 1990, 20, 4)
			s := newBucketedSale(t, e, 3)
			if s.shard(e, 0) == s.shard(e, 1) {
				t.Fatalf("both buckets in shard %d", s.shard(e, 0))
			}
			for b, ps := range s.byHome {
				for _, p := range ps {
					if in := queuedIn(t, e, p.order); len(in) != 1 || in[0] != s.shard(e, b) {
						t.Fatalf("order %d of bucket %d: deadline queued in shards %v, want [%d]", p.order, b, in, s.shard(e, b))
					}
				}
			}
			// Handed over early (a poller whose clock runs ahead): each
			// is scheduled again in its bucket's shard.
			due := e.exp.Queue(s.shard(e, 1))
			if n, err := due.Forward(context.Background(), time.Now().Add(2*lifeWindow), 100); err != nil || n != 3 {
				t.Fatalf("bucket 1's shard forwarded %d early deadlines (%v), want 3", n, err)
			}
			expire(t, NewExpirer(e.lifecycle(), e.exp, quietLog), readGroup(t, e, due.Stream(), ExpiryGroup, "x", 100))
			for _, p := range s.byHome[1] {
				if in := queuedIn(t, e, p.order); len(in) != 1 || in[0] != s.shard(e, 1) {
					t.Fatalf("order %d handed over early: deadline queued again in shards %v, want [%d]", p.order, in, s.shard(e, 1))
				}
			}
			was := s.stock(t, e, 1)
			e.unreadyShard(t, s.shard(e, 0))
			e.clock.pass(lifeWindow + time.Minute)
			if n, err := due.Forward(context.Background(), e.clock.now(), 100); err != nil || n != 3 {
				t.Fatalf("bucket 1's shard forwarded %d deadlines (%v), want 3", n, err)
			}
			expire(t, NewExpirer(e.lifecycle(), e.exp, quietLog), readGroup(t, e, due.Stream(), ExpiryGroup, "x", 100))
			for _, p := range s.byHome[1] {
				if o := e.order(t, p.order); o.Status != StatusCancelled || o.UnitBackAt == nil {
					t.Errorf("order of bucket 1: %s; want expired, its unit back", describe(o))
				}
			}
			for _, p := range s.byHome[0] {
				if o := e.order(t, p.order); o.Status != StatusAwaitingPayment {
					t.Errorf("order of bucket 0: %s; want still awaiting payment", describe(o))
				}
			}
			if now := s.stock(t, e, 1); now != was+3 {
				t.Fatalf("bucket 1's stock %d, was %d: want the 3 expired units back in it", now, was)
			}
		})
	}
}

// TestSweeperGivesBackToReadyBuckets: a bucketed voucher whose bucket 0's
// shard is not ready (its master lost) and whose orders of both buckets
// ended while no shard could take units back. Once bucket 1's shard is
// ready again, a sweep gives back the units of bucket 1's orders to
// bucket 1, and leaves bucket 0's, with no error: the voucher's own shard
// (bucket 0's) does not hold up its other buckets.
func TestSweeperGivesBackToReadyBuckets(t *testing.T) {
	t.Parallel()
	for _, dialect := range lifeDBs {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newLifeEnvOf(t, dialect, 1990, 20, 4)
			s := newBucketedSale(t, e, 3)
			was := s.stock(t, e, 1)
			e.unreadyShard(t, s.shard(e, 0))
			e.unreadyShard(t, s.shard(e, 1))
			for _, p := range append(append([]purchase{}, s.byHome[0]...), s.byHome[1]...) {
				if _, moved, err := e.life.Do(ctx, Cancel, p.order); !errors.Is(err, ErrUnitNotBack) || !moved {
					t.Fatalf("cancel while no shard is ready: moved %v, %v; want moved and ErrUnitNotBack", moved, err)
				}
			}
			e.readyShard(t, s.shard(e, 1))
			sw := NewSweeper(e.db, e.life, SweeperConfig{Every: time.Hour, Ready: e.life.ShardReady}, quietLog)
			if err := sw.Sweep(ctx); err != nil {
				t.Fatalf("sweep: %v", err)
			}
			for b, ps := range s.byHome {
				for _, p := range ps {
					if back := e.order(t, p.order).UnitBackAt != nil; back != (b == 1) {
						t.Errorf("order %d of bucket %d: unit back %v, want %v", p.order, b, back, b == 1)
					}
				}
			}
			if now := s.stock(t, e, 1); now != was+3 {
				t.Fatalf("bucket 1's stock %d, was %d: want its 3 units back", now, was)
			}
		})
	}
}
