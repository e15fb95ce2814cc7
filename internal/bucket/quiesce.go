package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/voucher"
)

// drainRounds bounds the passes Quiesce makes over the voucher's
// journals: with every bucket fenced, no new move starts, so the second
// pass normally finds none.
const drainRounds = 5

// Quiesce stops the units of voucher v (of nb buckets) for a rebuild of
// bucket lost: it takes the voucher's lease, fences every other bucket,
// finishes or returns every journaled move of v, waits ApplyWindow so
// that a move journaled in lost and never seen can no longer be applied,
// then reads the allocs. It implements voucher.Quiescer. An error leaves
// nothing held.
func (m *Mover) Quiesce(ctx context.Context, v int64, nb, lost int) (voucher.Quiet, error) {
	token := newID()
	lease := leaseKey(m.keys, v, nb)
	ok, err := m.rdb.SetNX(ctx, lease, token, m.cfg.LeaseTTL).Result()
	if err != nil {
		return voucher.Quiet{}, fmt.Errorf("quiesce voucher %d: lease: %w", v, err)
	}
	if !ok {
		return voucher.Quiet{}, fmt.Errorf("quiesce voucher %d: %w", v, ErrLeaseHeld)
	}
	var once sync.Once
	release := func(ctx context.Context) { once.Do(func() { m.release(ctx, v, nb, lost, token) }) }
	q, err := m.quiesce(ctx, v, nb, lost)
	if err != nil {
		release(context.WithoutCancel(ctx))
		return voucher.Quiet{}, fmt.Errorf("quiesce voucher %d for bucket %d: %w", v, lost, err)
	}
	q.Release = release
	return q, nil
}

func (m *Mover) quiesce(ctx context.Context, v int64, nb, lost int) (voucher.Quiet, error) {
	if err := m.fence(ctx, v, nb, lost, m.cfg.LeaseTTL); err != nil {
		return voucher.Quiet{}, err
	}
	if err := m.drain(ctx, v, nb, lost); err != nil {
		return voucher.Quiet{}, err
	}
	t := time.NewTimer(m.cfg.ApplyWindow)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return voucher.Quiet{}, ctx.Err()
	case <-t.C:
	}
	return m.allocs(ctx, v, nb, lost)
}

// fence sets (ttl > 0) or lifts (ttl 0) the fence of every bucket but
// lost, each from its own master's clock.
func (m *Mover) fence(ctx context.Context, v int64, nb, lost int, ttl time.Duration) error {
	for b := range nb {
		if b == lost {
			continue
		}
		key := m.keys.StateAt(m.keys.BucketShard(v, b, nb), v)
		res, err := m.r.run(ctx, m.s.fence, ttl > 0, []string{key}, ttl.Milliseconds())
		if res == nil && err != nil {
			return fmt.Errorf("fence bucket %d: %w", b, err)
		}
		if _, derr := decodeFence(res); derr != nil {
			return fmt.Errorf("fence bucket %d: %w", b, derr)
		}
		if err != nil {
			return fmt.Errorf("fence bucket %d: %w", b, err)
		}
	}
	return nil
}

// drain settles every journaled move of v, in every bucket's journal, the
// lost bucket's included, until a pass finds none; a journal that cannot
// be read fails the quiesce (the rebuild is tried again).
func (m *Mover) drain(ctx context.Context, v int64, nb, lost int) error {
	for range drainRounds {
		found := 0
		for b := range nb {
			var failed error
			err := m.scanJournal(ctx, m.keys.BucketShard(v, b, nb), func(j journaled) {
				if j.err != nil || j.e.v != v || failed != nil {
					return
				}
				found++
				failed = m.settle(ctx, j, &m.stats)
			})
			if err == nil {
				err = failed
			}
			// The lost bucket's journal too: a move left in it would be
			// closed after the rebuild, and a refused one would give its
			// units back to a bucket whose alloc already counts them.
			if err != nil {
				return fmt.Errorf("drain bucket %d: %w", b, err)
			}
		}
		if found == 0 {
			return nil
		}
	}
	return fmt.Errorf("moves of voucher %d still journaled after %d passes", v, drainRounds)
}

// allocs reads the alloc of every bucket but lost: ready ones in Alloc,
// the others in NotReady.
func (m *Mover) allocs(ctx context.Context, v int64, nb, lost int) (voucher.Quiet, error) {
	pipe := m.rdb.Pipeline()
	alloc := make([]*redis.StringCmd, nb)
	ready := make([]*redis.IntCmd, nb)
	for b := range nb {
		if b == lost {
			continue
		}
		s := m.keys.BucketShard(v, b, nb)
		alloc[b] = pipe.HGet(ctx, m.keys.StateAt(s, v), voucher.FieldAlloc)
		ready[b] = pipe.Exists(ctx, m.keys.Ready(s))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	q := voucher.Quiet{Alloc: map[int]int64{}}
	for b := range nb {
		if b == lost {
			continue
		}
		n, err := ready[b].Result()
		if err != nil {
			return voucher.Quiet{}, fmt.Errorf("bucket %d ready: %w", b, err)
		}
		s, err := alloc[b].Result()
		if n == 0 || errors.Is(err, redis.Nil) { // no state: not loaded either
			q.NotReady = append(q.NotReady, b)
			continue
		}
		if err != nil {
			return voucher.Quiet{}, fmt.Errorf("bucket %d alloc: %w", b, err)
		}
		if q.Alloc[b], err = strconv.ParseInt(s, 10, 64); err != nil {
			return voucher.Quiet{}, fmt.Errorf("bucket %d alloc %q: %w", b, s, err)
		}
	}
	return q, nil
}

// release lifts the fences and drops the lease if it still holds token.
func (m *Mover) release(ctx context.Context, v int64, nb, lost int, token string) {
	if err := m.fence(ctx, v, nb, lost, 0); err != nil {
		m.log.Warn("quiesce: lift fences", "voucher", v, "err", err)
	}
	lease := leaseKey(m.keys, v, nb)
	if err := m.s.releaseLease.Run(ctx, m.rdb, []string{lease}, token).Err(); err != nil {
		m.log.Warn("quiesce: release lease", "voucher", v, "err", err)
	}
}
