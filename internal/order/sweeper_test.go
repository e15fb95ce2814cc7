package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"seckill/internal/voucher"
)

// unreadyShard and readyShard drop and restore a shard's ready marker.
func (e lifeEnv) unreadyShard(t *testing.T, shard int) {
	t.Helper()
	if err := e.rdb.Del(context.Background(), e.keys.Ready(shard)).Err(); err != nil {
		t.Fatal(err)
	}
}

func (e lifeEnv) readyShard(t *testing.T, shard int) {
	t.Helper()
	if err := voucher.NewState(e.rdb, e.keys).MarkReady(context.Background(), shard); err != nil {
		t.Fatal(err)
	}
}

// TestSweeperPagesPastStuckUnits: seven orders of a shard that cannot
// take units back (not ready: being rebuilt, or its master down), more
// than two pages of three, and behind them (higher ids) two of a healthy
// shard, all cancelled while Redis could not take their units. The
// sweeper pages through them by id, each round resuming where the last
// stopped: the healthy units go back within the rounds it takes to page
// past the stuck ones (3). Given the shards' readiness, a round skips the
// stuck shard: they go back in the first. Once the stuck shard is ready,
// its units go back within ceil(7/3)+1 rounds, starting again from the
// first order after the end was reached.
func TestSweeperPagesPastStuckUnits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		readiness bool
		rounds    int // within which the healthy units are back
	}{
		{"every shard taken for ready", false, 3},
		{"shards not ready skipped", true, 1},
	} {
		for _, dialect := range lifeDBs {
			t.Run(tc.name+"/"+dialect, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := newLifeEnvOf(t, dialect, 1990, 20, 2)
				stuckV := e.newVoucher(t, 1990, 20)
				stuckShard, healthyShard := e.keys.Shard(stuckV.ID), e.keys.Shard(e.v.ID)
				if stuckShard == healthyShard {
					t.Fatalf("both vouchers in shard %d", stuckShard)
				}
				var stuck, healthy []purchase
				for range 7 {
					p := e.reserve(t, stuckV.ID)
					e.write(t, p)
					stuck = append(stuck, p)
				}
				for range 2 {
					healthy = append(healthy, e.buy(t))
				}
				e.unreadyShard(t, stuckShard)
				e.unreadyShard(t, healthyShard)
				for _, p := range append(append([]purchase{}, stuck...), healthy...) {
					if _, moved, err := e.life.Do(ctx, Cancel, p.order); !errors.Is(err, ErrUnitNotBack) || !moved {
						t.Fatalf("cancel while the shard is not ready: moved %v, %v; want moved and ErrUnitNotBack", moved, err)
					}
				}
				e.readyShard(t, healthyShard)
				cfg := SweeperConfig{Every: time.Hour, Batch: 3}
				if tc.readiness {
					cfg.Ready = e.life.ShardReady
				}
				s := NewSweeper(e.db, e.life, cfg, quietLog)
				back := func(ps []purchase) int {
					n := 0
					for _, p := range ps {
						if e.order(t, p.order).UnitBackAt != nil {
							n++
						}
					}
					return n
				}
				for round := 1; back(healthy) < len(healthy); round++ {
					if round > tc.rounds {
						t.Fatalf("the healthy shard's units not back after %d rounds", tc.rounds)
					}
					_ = s.Sweep(ctx) // the stuck shard's units fail
				}
				if n := back(stuck); n != 0 {
					t.Fatalf("%d units of a shard not ready back", n)
				}
				e.readyShard(t, stuckShard)
				for round := 1; back(stuck) < len(stuck); round++ {
					if round > 4 {
						t.Fatalf("the stuck shard ready again: %d of %d units back after 4 rounds", back(stuck), len(stuck))
					}
					if err := s.Sweep(ctx); err != nil {
						t.Fatal(err)
					}
				}
				s1, s2 := e.sale(t, stuckV.ID, 0), e.sale(t, e.v.ID, 0)
				if s1.stock != s1.redisStock || s2.stock != s2.redisStock {
					t.Fatalf("sales %+v and %+v; want Redis agreeing with the database", s1, s2)
				}
			})
		}
	}
}

// TestSweeperPagesPastStuckOverdue: four overdue orders that cannot be
// expired (their voucher's stock was set to its total by hand), more than
// a page of three, and behind them (higher ids) two overdue orders of
// another voucher, their deadlines all lost. The sweeper pages past the
// stuck ones: the others are expired within two rounds; the stuck ones
// stay awaiting payment.
func TestSweeperPagesPastStuckOverdue(t *testing.T) {
	t.Parallel()
	const every = time.Minute
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		bad := e.newVoucher(t, 1990, 10)
		var stuck, healthy []purchase
		for range 4 {
			p := e.reserve(t, bad.ID)
			e.write(t, p)
			stuck = append(stuck, p)
		}
		for range 2 {
			healthy = append(healthy, e.buy(t))
		}
		if err := e.db.Exec("UPDATE vouchers SET stock = total_stock WHERE id = ?", bad.ID).Error; err != nil {
			t.Fatal(err)
		}
		e.clock.pass(lifeWindow + 2*every)
		s := NewSweeper(e.db, e.life, SweeperConfig{Every: every, Batch: 3}, quietLog)
		expired := func() int {
			n := 0
			for _, p := range healthy {
				if e.order(t, p.order).Status == StatusCancelled {
					n++
				}
			}
			return n
		}
		for round := 1; expired() < len(healthy); round++ {
			if round > 2 {
				t.Fatalf("%d of %d overdue orders expired after 2 rounds", expired(), len(healthy))
			}
			_ = s.Sweep(ctx) // the stuck orders fail
		}
		for _, p := range stuck {
			if o := e.order(t, p.order); o.Status != StatusAwaitingPayment {
				t.Fatalf("stuck order %s; want still awaiting payment", describe(o))
			}
		}
	})
}
