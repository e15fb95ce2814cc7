package bucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/voucher"
)

// borrowTries bounds the donors one Borrow tries: another borrower may
// empty the donor it picked between the read and the take.
const borrowTries = 3

// borrowTimeout bounds one shared borrow.
const borrowTimeout = 5 * time.Second

// Borrow moves units into bucket to of voucher v (of nb) from the bucket
// with the most stock: up to BorrowMax, half the donor's stock rounded
// up. Concurrent calls of this instance for the same (v, to) share one
// borrow, which no single caller's cancellation interrupts half-way (a
// move cut after its take leaves its units in transit until the
// Recoverer returns them); it has a bound of its own instead. It
// implements voucher.Borrower.
func (m *Mover) Borrow(ctx context.Context, v int64, to, nb int) error {
	key := strconv.FormatInt(v, 10) + ":" + strconv.Itoa(to)
	ch := m.group.DoChan(key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), borrowTimeout)
		defer cancel()
		return nil, m.borrow(ctx, v, to, nb)
	})
	select {
	case <-ctx.Done():
		return fmt.Errorf("borrow voucher %d bucket %d: %w", v, to, ctx.Err())
	case r := <-ch:
		return r.Err
	}
}

func (m *Mover) borrow(ctx context.Context, v int64, to, nb int) error {
	if nb < 2 || to < 0 || to >= nb {
		return fmt.Errorf("borrow voucher %d bucket %d of %d: out of range", v, to, nb)
	}
	var last error
	for range borrowTries {
		bs := m.view(ctx, v, nb)
		if bs[to].ready && bs[to].stock > 0 {
			return nil
		}
		if !bs[to].ready {
			return fmt.Errorf("borrow voucher %d bucket %d: receiver %w", v, to, voucher.ErrInTransit)
		}
		d := donor(bs, to, time.Now().UnixMilli())
		if d < 0 {
			return m.confirmVerdict(ctx, v, nb, bs)
		}
		k := min(m.cfg.BorrowMax, int((bs[d].stock+1)/2))
		moved, err := m.Move(ctx, v, d, to, k, nb)
		switch {
		case moved > 0:
			return nil
		case err == nil, errors.Is(err, ErrEmpty), errors.Is(err, ErrFenced):
			last = err // refused or emptied meanwhile: read again
		default:
			return fmt.Errorf("borrow voucher %d bucket %d: %w: %w", v, to, voucher.ErrInTransit, err)
		}
	}
	return fmt.Errorf("borrow voucher %d bucket %d: %d tries (last: %v): %w", v, to, borrowTries, last, voucher.ErrInTransit)
}

// bucketView is one bucket's state as Borrow reads it.
type bucketView struct {
	ready                             bool // ready marker there, state read
	fenced                            bool // a rebuild's fence (quiesce.go)
	stock, alloc, out, total, fenceMs int64
}

// view reads every bucket of v in one pipeline. A bucket whose shard did
// not answer, is not ready, or has no state reads as not ready.
func (m *Mover) view(ctx context.Context, v int64, nb int) []bucketView {
	pipe := m.rdb.Pipeline()
	states := make([]*redis.SliceCmd, nb)
	ready := make([]*redis.IntCmd, nb)
	fenced := make([]*redis.BoolCmd, nb)
	field := strconv.FormatInt(v, 10)
	for b := range nb {
		s := m.keys.BucketShard(v, b, nb)
		states[b] = pipe.HMGet(ctx, m.keys.StateAt(s, v), "stock", voucher.FieldAlloc, voucher.FieldOut, voucher.FieldTotal, voucher.FieldFenceUntil)
		ready[b] = pipe.Exists(ctx, m.keys.Ready(s))
		fenced[b] = pipe.HExists(ctx, fencesKey(m.keys, s), field)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	bs := make([]bucketView, nb)
	for b := range nb {
		vals, err := states[b].Result()
		n, rerr := ready[b].Result()
		if err != nil || rerr != nil || n == 0 {
			continue
		}
		var f [5]int64
		ok := true
		for i, x := range vals {
			s, _ := x.(string)
			if x == nil && (i == 2 || i == 4) { // out and fence_until may be absent
				continue
			}
			if f[i], err = strconv.ParseInt(s, 10, 64); err != nil {
				ok = false
			}
		}
		// A fence that cannot be read counts as one: the take would say.
		isFenced, ferr := fenced[b].Result()
		bs[b] = bucketView{ready: ok, fenced: isFenced || ferr != nil, stock: f[0], alloc: f[1], out: f[2], total: f[3], fenceMs: f[4]}
	}
	return bs
}

// donor is the ready, unfenced bucket other than to with the most stock,
// -1 when none has any.
func donor(bs []bucketView, to int, nowMs int64) int {
	best := -1
	for b, x := range bs {
		if b == to || !x.ready || x.stock <= 0 || x.fenced || x.fenceMs > nowMs {
			continue
		}
		if best < 0 || x.stock > bs[best].stock {
			best = b
		}
	}
	return best
}

// verdict is Borrow's answer when no bucket can lend (donor found none),
// the first row that matches:
//
//	the buckets read                          | answer     | what ends it
//	------------------------------------------+------------+------------------------------------
//	one not ready (not answering, rebuilt),   | in transit | its rebuild (SeckillShardNotReady);
//	or their totals disagree                  | (busy)     | its units cannot be counted now
//	one holds stock (fenced by a rebuild)     | in transit | the rebuild lifts its fences
//	a move journaled (out not 0 in one)       | in transit | the move's close: its mover, or the
//	                                          |            | recovery loop after StaleAfter
//	every one ready, empty, nothing journaled | sold out   | - (units given back by a cancel or
//	                                          |            | an expiry sell again)
//
// The last row holds whatever the allocs add up to: no unit is in any
// bucket or in any move, so none can be sold. Allocs that do not add up
// to the total then name units lost (a move closed as applied that never
// was: fewer) or counted twice (more): unaccounted reports them, for the
// SeckillBucketUnitsUnaccounted alert and api reconcile, and they do not
// keep the voucher's buyers waiting on a sold out that never comes. Borrow
// reads the buckets a second time before it says so (confirmVerdict).
func verdict(v int64, bs []bucketView) error {
	for b, x := range bs {
		if !x.ready || x.total != bs[0].total {
			return fmt.Errorf("voucher %d bucket %d not ready or disagreeing: %w", v, b, voucher.ErrInTransit)
		}
		if x.stock > 0 {
			return fmt.Errorf("voucher %d bucket %d fenced with %d units: %w", v, b, x.stock, voucher.ErrInTransit)
		}
		if x.out != 0 {
			return fmt.Errorf("voucher %d bucket %d: %d units journaled in moves: %w", v, b, x.out, voucher.ErrInTransit)
		}
	}
	return fmt.Errorf("voucher %d: %w", v, voucher.ErrSoldOut)
}

// confirmVerdict is verdict, with a sold out whose allocs do not add up
// read again: the buckets are read in one pipeline but on several
// masters, not at one instant, so a move closed between two reads shows
// its units nowhere (the receiver read before the apply, the donor after
// the close). Sold out stands only when a second read finds every bucket
// as the first did.
func (m *Mover) confirmVerdict(ctx context.Context, v int64, nb int, bs []bucketView) error {
	err := verdict(v, bs)
	if off, _ := unaccounted(bs); off == 0 || !errors.Is(err, voucher.ErrSoldOut) {
		return err
	}
	t := time.NewTimer(rereadAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("voucher %d: %w", v, voucher.ErrInTransit)
	case <-t.C:
	}
	again := m.view(ctx, v, nb)
	for b := range bs {
		if again[b] != bs[b] {
			return fmt.Errorf("voucher %d: buckets changed between two reads: %w", v, voucher.ErrInTransit)
		}
	}
	return err
}

// rereadAfter is how long confirmVerdict waits before its second read.
const rereadAfter = 20 * time.Millisecond

// unaccounted is how far the allocs of v's buckets are from its total
// when every bucket is ready and agrees on it and no move is journaled
// (when they must add up to it): positive for units lost, negative for
// units counted twice. ok is false when they cannot be compared now.
func unaccounted(bs []bucketView) (units int64, ok bool) {
	if len(bs) == 0 {
		return 0, false
	}
	var sum int64
	for _, x := range bs {
		if !x.ready || x.total != bs[0].total || x.out != 0 {
			return 0, false
		}
		sum += x.alloc
	}
	return bs[0].total - sum, true
}
