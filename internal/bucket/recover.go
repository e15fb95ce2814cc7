package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/failing"
	"seckill/internal/voucher"
)

// Recoverer finishes the moves whose movers died: every journaled move
// older than StaleAfter is resolved on its receiver and closed on its
// donor (see the table in mover.go). It also lifts the fences a rebuild
// left behind when nobody holds their voucher's lease (clearFences).
type Recoverer struct {
	m      *Mover
	oldest atomic.Int64 // ns: the oldest entry seen by the last pass
	stats  stats

	mu     sync.Mutex
	logged map[string]bool // ids whose failure was logged, still failing
}

// NewRecoverer returns a Recoverer of m's moves, with m's settings.
func NewRecoverer(m *Mover) *Recoverer { return &Recoverer{m: m, logged: map[string]bool{}} }

// Run recovers every second until ctx ends.
func (r *Recoverer) Run(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	f := failing.Log{Log: r.m.log, What: "bucket move recovery"}
	for {
		f.Round(ctx, r.Once(ctx))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Oldest is the age of the oldest journaled move the last pass saw, 0
// when none: a move older than StaleAfter plus a pass or two is stuck.
func (r *Recoverer) Oldest() time.Duration { return time.Duration(r.oldest.Load()) }

// Stats counts the moves this Recoverer closed.
func (r *Recoverer) Stats() Stats { return r.stats.get() }

// Once makes one pass over every shard's journal. One bad entry or one
// unreachable receiver holds up only that entry, logged once; a shard
// whose journal cannot be read is skipped and reported in the error.
func (r *Recoverer) Once(ctx context.Context) error {
	var oldest time.Duration
	failing := map[string]bool{}
	var errs []error
	for shard := range r.m.keys.Shards() {
		err := r.m.scanJournal(ctx, shard, func(j journaled) {
			if j.err != nil {
				r.fail(failing, j.id, j.err)
				return
			}
			oldest = max(oldest, j.age)
			if j.age < r.m.cfg.StaleAfter {
				return
			}
			if _, err := r.m.settle(ctx, j, &r.stats); err != nil {
				r.fail(failing, j.id, err)
			}
		})
		if err != nil {
			errs = append(errs, err)
		}
		if err := r.clearFences(ctx, shard); err != nil {
			errs = append(errs, err)
		}
	}
	r.oldest.Store(int64(oldest))
	r.mu.Lock()
	r.logged = failing
	r.mu.Unlock()
	return errors.Join(errs...)
}

// fail logs an entry's failure the first time it is seen failing.
func (r *Recoverer) fail(failing map[string]bool, id string, err error) {
	failing[id] = true
	r.mu.Lock()
	seen := r.logged[id]
	r.mu.Unlock()
	if !seen {
		r.m.log.Warn("bucket move left in the journal", "move", id, "err", err)
	}
}

// clearFences lifts the shard's fences whose voucher's lease nobody holds:
// their rebuild died after its shard reopened, or could not reach the
// master to lift them, or stalled past its lease.
func (r *Recoverer) clearFences(ctx context.Context, shard int) error {
	left, err := r.m.scanFences(ctx, shard)
	if err != nil {
		return err
	}
	var errs []error
	for v, nb := range left {
		// Held: a rebuild is at it (the take of the lease tells).
		held, err := r.m.clearFences(ctx, v, nb)
		if err == nil && !held {
			r.m.log.Info("bucket fences left by a rebuild lifted", "voucher", v, "buckets", nb, "shard", shard)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Applied is the units of voucher v's journaled moves that their receiver
// has applied (its mark says so) and their donor has not closed yet: until
// the close they are in the receiver's alloc and in the donor's out at
// once, so conservation counts them once (reconcile). A move whose mark
// cannot be read fails the count.
func (m *Mover) Applied(ctx context.Context, v int64, nb int) (int64, error) {
	moves, err := m.Moves(ctx, v, nb)
	if err != nil {
		return 0, err
	}
	var units int64
	for _, mv := range moves {
		if mv.Mark == outcomeApplied {
			units += int64(mv.Units)
		}
	}
	return units, nil
}

// Fences is the rebuild fence on each bucket of voucher v ("<nb>:<token>"
// of the rebuild or first load holding it, "" none), read in one pipeline,
// for an operator (api buckets): a fence that stays while no rebuild runs
// is lifted by the recovery loop.
func Fences(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys, v int64, nb int) ([]string, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.StringCmd, nb)
	field := strconv.FormatInt(v, 10)
	for b := range nb {
		cmds[b] = pipe.HGet(ctx, fencesKey(keys, keys.BucketShard(v, b, nb)), field)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read the fences of voucher %d: %w", v, err)
	}
	out := make([]string, nb)
	for b, c := range cmds {
		out[b] = c.Val()
	}
	return out, nil
}
