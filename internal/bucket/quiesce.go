package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lease"
	"seckill/internal/voucher"
)

// drainRounds bounds the passes Quiesce makes over the voucher's
// journals: with every bucket fenced, no new move starts, so the second
// pass normally finds none.
const drainRounds = 5

// A rebuild of one bucket of a voucher counts the others, so the units
// must stand still while it counts, and no other rebuild of the voucher
// may count until this one's bucket is live. Two things hold them, and
// neither trusts a clock:
//
//	what            | where                       | held by                 | ends
//	----------------+-----------------------------+-------------------------+----------------------------------
//	the lease       | Keys.Lease(v, nb)           | one Quiesce; renewed    | Release; or not renewed in time
//	                | (bucket 0's shard), a token | every LeaseTTL/3 by a   | (the holder stalled): the next
//	                | with a time to live         | watchdog (lease.Keep)   | rebuild takes it; Quiet.Ctx ends
//	a fence, one    | fencesKey(shard of b),      | the lease holder; no    | lifted by its holder (compare and
//	per bucket b    | field v = "<nb>:<token>"    | time to live            | delete), or overwritten by the
//	                |                             |                         | next lease holder (a takeover)
//
// Quiesce: take the lease; fence every bucket (the lost one too); settle
// every journaled move; wait ApplyWindow (a move journaled in the lost
// bucket and never seen can no longer be applied); read the allocs; then
// lift the other buckets' fences, each of which must still hold this
// token (the check that no takeover happened while they were read: a
// fence is never lifted by anyone who has not first overwritten every
// fence of the voucher). The lost bucket's fence stays until Release: its
// shard reopens only while it holds this token (Quiet.Guard, checked by
// reopen.lua), so a rebuild that stalled past its lease, whose fences a
// newer rebuild took over, makes nothing live; and the newer rebuild,
// having set every fence before it counted, counted with the stalled one
// stopped.
//
// take.lua refuses a fenced donor; units moving between the other ready
// buckets after the allocs are read leave their sum unchanged, and a
// bucket that is not ready neither gives nor takes units.

// Quiesce stops the units of voucher v (of nb buckets) for a rebuild of
// bucket lost, as above. It implements voucher.Quiescer. An error leaves
// nothing held.
func (m *Mover) Quiesce(ctx context.Context, v int64, nb, lost int) (voucher.Quiet, error) {
	h, err := m.hold(ctx, v, nb)
	if err != nil {
		return voucher.Quiet{}, fmt.Errorf("quiesce voucher %d: %w", v, err)
	}
	q, err := m.quiesce(h.l.Context(), v, nb, lost, h.value)
	if err != nil {
		if cause := h.l.Err(); errors.Is(cause, lease.ErrLost) {
			err = fmt.Errorf("%w (%w)", err, cause)
		}
		h.release(ctx)
		return voucher.Quiet{}, fmt.Errorf("quiesce voucher %d for bucket %d: %w", v, lost, err)
	}
	q.Ctx = h.l.Context()
	q.Guard = m.guard(v, lost, nb, h.value)
	q.Release = h.release
	return q, nil
}

// held is a voucher's lease taken by this Mover and the fence value it
// writes; release lifts both, once.
type held struct {
	l       *lease.Lease
	value   string
	release func(ctx context.Context)
}

// hold takes voucher v's lease (kept by the watchdog); ErrLeaseHeld when
// another holds it.
func (m *Mover) hold(ctx context.Context, v int64, nb int) (held, error) {
	l, took, err := lease.Take(ctx, m.rdb, leaseKey(m.keys, v, nb), m.cfg.LeaseTTL)
	if err != nil {
		return held{}, fmt.Errorf("lease: %w", err)
	}
	if !took {
		return held{}, ErrLeaseHeld
	}
	h := held{l: l, value: fenceValue(nb, l.Token())}
	var once sync.Once
	// Bounded, even when ctx has ended: a master that does not answer
	// holds up a release (and the shards its caller rebuilds next) for
	// seconds at most; a fence left is lifted by the recovery loop.
	h.release = func(ctx context.Context) {
		once.Do(func() {
			cctx, cancel := cleanup(ctx)
			defer cancel()
			m.release(cctx, l, v, nb, h.value)
		})
	}
	return h, nil
}

// guard is bucket b's fence holding value, as a write's guard.
func (m *Mover) guard(v int64, b, nb int, value string) voucher.Guard {
	return voucher.Guard{Key: fencesKey(m.keys, m.keys.BucketShard(v, b, nb)), Field: strconv.FormatInt(v, 10), Value: value}
}

// fenceValue is a fence's value: the voucher's bucket count, so that a
// fence found alone can be lifted (clearFences), and the holder's token.
func fenceValue(nb int, token string) string { return strconv.Itoa(nb) + ":" + token }

func (m *Mover) quiesce(ctx context.Context, v int64, nb, lost int, value string) (voucher.Quiet, error) {
	began := time.Now()
	if err := m.fenceAll(ctx, v, nb, value); err != nil {
		return voucher.Quiet{}, err
	}
	if _, err := m.drain(ctx, v, nb); err != nil {
		return voucher.Quiet{}, err
	}
	if err := m.waitApply(ctx); err != nil {
		return voucher.Quiet{}, err
	}
	q, err := m.allocs(ctx, v, nb, lost)
	if err != nil {
		return voucher.Quiet{}, err
	}
	for b := range nb {
		if b == lost {
			continue
		}
		if err := m.lift(ctx, v, nb, b, value); err != nil {
			return voucher.Quiet{}, err
		}
	}
	paused := time.Since(began)
	m.log.Info("bucket rebuild counted the other buckets; they lend again", "voucher", v, "bucket", lost, "paused_ms", paused.Milliseconds())
	if m.cfg.Paused != nil {
		m.cfg.Paused(paused)
	}
	return q, nil
}

// fenceAll sets value as the fence of every bucket of v, over whatever
// fence was there (a takeover: the lease is this caller's, so the other
// holder's lease ended), each confirmed by WAIT.
func (m *Mover) fenceAll(ctx context.Context, v int64, nb int, value string) error {
	for b := range nb {
		prev, err := m.fenceOp(ctx, v, nb, b, "set", value)
		if err != nil {
			return fmt.Errorf("fence bucket %d: %w", b, err)
		}
		if prev != "" {
			m.log.Info("bucket fence taken over from an earlier rebuild", "voucher", v, "bucket", b, "earlier", prev)
		}
	}
	return nil
}

// lift drops bucket b's fence if it holds value; a fence holding another
// value (taken over) fails with ErrFenceLost.
func (m *Mover) lift(ctx context.Context, v int64, nb, b int, value string) error {
	if _, err := m.fenceOp(ctx, v, nb, b, "lift", value); err != nil {
		return fmt.Errorf("lift fence of bucket %d: %w", b, err)
	}
	return nil
}

// fenceOp runs fence.lua ("set" or "lift") on bucket b's shard. It
// returns the value found when it was not value (set: the one overwritten;
// lift: the one there, "" when none, as ErrFenceLost). A set is confirmed
// by the master's replicas (a failover must not lose a fence before the
// count it protects); a lift needs no confirming.
func (m *Mover) fenceOp(ctx context.Context, v int64, nb, b int, mode, value string) (string, error) {
	key := fencesKey(m.keys, m.keys.BucketShard(v, b, nb))
	res, err := m.r.run(ctx, m.s.fence, mode == "set", []string{key}, mode, v, value)
	if res == nil && err != nil {
		return "", err
	}
	held, other, derr := decodeFence(res)
	switch {
	case derr != nil:
		return "", derr
	case err != nil:
		return "", err
	case !held && mode != "set":
		return other, fmt.Errorf("fence holds %q: %w", other, ErrFenceLost)
	}
	return other, nil
}

// drain settles every journaled move of v, in every bucket's journal, the
// lost bucket's included (a move left there would be closed after the
// rebuild, and a refused one would give its units back to a bucket whose
// alloc already counts them), until a pass finds none; a journal that
// cannot be read, or a move that cannot be settled, fails the quiesce (the
// rebuild is tried again).
// It returns how many moves it settled.
func (m *Mover) drain(ctx context.Context, v int64, nb int) (settled int, err error) {
	for range drainRounds {
		found := 0
		err := m.eachMove(ctx, v, nb, func(j journaled, _ int) error {
			found++
			_, err := m.settle(ctx, j, &m.stats)
			return err
		})
		if err != nil {
			return settled, fmt.Errorf("drain: %w", err)
		}
		if found == 0 {
			return settled, nil
		}
		settled += found
	}
	return settled, fmt.Errorf("moves of voucher %d still journaled after %d passes", v, drainRounds)
}

// waitApply waits out the apply window: a move taken before it can no
// longer be applied.
func (m *Mover) waitApply(ctx context.Context) error {
	t := time.NewTimer(m.cfg.ApplyWindow)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
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

// release lifts every fence that still holds value, then gives the lease
// back if it is still the holder's. A fence it cannot reach is left to
// the Recoverer (clearFences).
func (m *Mover) release(ctx context.Context, l *lease.Lease, v int64, nb int, value string) {
	l.Stop()
	for b := range nb {
		if err := m.lift(ctx, v, nb, b, value); err != nil && !errors.Is(err, ErrFenceLost) {
			m.log.Warn("quiesce: lift fence", "voucher", v, "bucket", b, "err", err)
		}
	}
	if err := l.Release(ctx); err != nil {
		m.log.Warn("quiesce: release lease", "voucher", v, "err", err)
	}
}

// Hold holds voucher v (of nb buckets) still for the first load of its
// buckets: it takes the voucher's lease (kept by the watchdog) and fences
// every bucket; bucket b's state is to be written only while Guards[b]
// holds (load.lua checks it). A bucket without state gives and takes
// nothing, but buckets whose state was dropped (left out of a shard's
// rebuild: voucher.State.DropAt) may have left moves journaled: those are
// drained, and then the apply window waited out, before any bucket is
// written, so that none of them adds its units to a bucket loaded with
// its share. A voucher put on sale has none, and waits for nothing. It
// implements voucher.Holder. An error leaves nothing held.
func (m *Mover) Hold(ctx context.Context, v int64, nb int) (voucher.Held, error) {
	h, err := m.hold(ctx, v, nb)
	if err != nil {
		return voucher.Held{}, fmt.Errorf("hold voucher %d: %w", v, err)
	}
	if err := m.fenceAll(h.l.Context(), v, nb, h.value); err != nil {
		h.release(ctx)
		return voucher.Held{}, fmt.Errorf("hold voucher %d: %w", v, err)
	}
	settled, err := m.drain(h.l.Context(), v, nb)
	if err == nil && settled > 0 {
		err = m.waitApply(h.l.Context())
	}
	if err != nil {
		h.release(ctx)
		return voucher.Held{}, fmt.Errorf("hold voucher %d: %w", v, err)
	}
	out := voucher.Held{Ctx: h.l.Context(), Guards: make([]voucher.Guard, nb), Release: h.release}
	for b := range nb {
		out.Guards[b] = m.guard(v, b, nb, h.value)
	}
	return out, nil
}

// clearFences lifts the fences of voucher v (of nb) that a rebuild left
// behind (it died after its shard reopened, or could not reach a master
// to lift them): it takes the voucher's lease, so no rebuild runs, sets
// its own fence over every bucket's, and lifts them. A rebuild that
// stalled and still holds such a fence finds it gone and writes nothing
// live. held is true when another holds the lease (nothing done).
func (m *Mover) clearFences(ctx context.Context, v int64, nb int) (held bool, err error) {
	h, err := m.hold(ctx, v, nb)
	switch {
	case errors.Is(err, ErrLeaseHeld):
		return true, nil
	case err != nil:
		return false, err
	}
	err = m.fenceAll(h.l.Context(), v, nb, h.value)
	h.release(ctx)
	return false, err
}
