package bucket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"seckill/internal/failing"
	"seckill/internal/lease"
)

// rebalanceEvery is how often a Rebalancer looks at every live voucher.
const rebalanceEvery = 250 * time.Millisecond

// turnTTL bounds a rebalancing turn left by an instance that died in it.
const turnTTL = 5 * time.Second

// Live is a voucher on sale whose buckets a Rebalancer evens out.
type Live struct {
	ID int64
	NB int
}

// Rebalancer evens out the stock of each live voucher's buckets ahead of
// the buyers, so that fewer of them find their home bucket empty and
// wait for a Borrow: each pass moves, per voucher, half the gap between
// the richest and the poorest bucket when the poorest holds less than
// half of the richest.
type Rebalancer struct {
	m    *Mover
	live func(ctx context.Context) ([]Live, error)
	// seen, when set, is told each pass what it read (Pass).
	seen func(Pass)
}

// Pass is what one pass of a Rebalancer read.
type Pass struct {
	// Stocks is the stock of every live voucher's buckets (-1: a bucket
	// not ready or not read).
	Stocks map[int64][]int64
	// Unaccounted sums, over the vouchers whose buckets could be
	// compared with their total (unaccounted in borrow.go), the units
	// their allocs miss or count twice, both counted positive.
	Unaccounted int64
}

// NewRebalancer returns a Rebalancer of the vouchers live lists (those
// of more than one bucket on sale now), moving with m.
func NewRebalancer(m *Mover, live func(ctx context.Context) ([]Live, error)) *Rebalancer {
	return &Rebalancer{m: m, live: live}
}

// Report makes every pass tell seen what it read (metrics). Set it
// before Run.
func (r *Rebalancer) Report(seen func(Pass)) { r.seen = seen }

// Run rebalances every 250ms until ctx ends.
func (r *Rebalancer) Run(ctx context.Context) error {
	t := time.NewTicker(rebalanceEvery)
	defer t.Stop()
	f := failing.Log{Log: r.m.log, What: "bucket rebalance"}
	for {
		f.Round(ctx, r.Once(ctx))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Once makes one pass over the live vouchers; one voucher's failure
// does not stop the others.
func (r *Rebalancer) Once(ctx context.Context) error {
	vs, err := r.live(ctx)
	if err != nil {
		return fmt.Errorf("rebalance: list live vouchers: %w", err)
	}
	var errs []error
	p := Pass{Stocks: make(map[int64][]int64, len(vs))}
	for _, v := range vs {
		if v.NB < 2 {
			continue
		}
		bs := r.m.view(ctx, v.ID, v.NB)
		p.Stocks[v.ID] = make([]int64, len(bs))
		for b, x := range bs {
			p.Stocks[v.ID][b] = -1
			if x.ready {
				p.Stocks[v.ID][b] = x.stock
			}
		}
		if off, ok := unaccounted(bs); ok && off != 0 {
			p.Unaccounted += max(off, -off)
		}
		if !uneven(bs) {
			continue
		}
		if err := r.balance(ctx, v); err != nil {
			errs = append(errs, fmt.Errorf("rebalance voucher %d: %w", v.ID, err))
		}
	}
	if r.seen != nil {
		r.seen(p)
	}
	return errors.Join(errs...)
}

// balance makes at most one move for v, if this instance has the
// voucher's turn: one instance a pass rebalances a voucher. A donor
// emptied or fenced meanwhile is no failure: the next pass looks again.
func (r *Rebalancer) balance(ctx context.Context, v Live) error {
	turn, token := turnKey(r.m.keys, v.ID, v.NB), lease.NewToken()
	mine, err := r.m.rdb.SetNX(ctx, turn, token, turnTTL).Result()
	if err != nil || !mine {
		return err
	}
	// Another instance looking after this one sees the move done; a turn
	// that outlived its TTL and went to another stays theirs.
	defer r.m.s.releaseLease.Run(context.WithoutCancel(ctx), r.m.rdb, []string{turn}, token)
	bs := r.m.view(ctx, v.ID, v.NB) // again: the turn's holder before may have moved
	if !uneven(bs) {
		return nil
	}
	poor, rich := pair(bs)
	k := min(int64(r.m.cfg.BorrowMax), (bs[rich].stock-bs[poor].stock)/2)
	_, err = r.m.Move(ctx, v.ID, rich, poor, int(k), v.NB)
	if errors.Is(err, ErrEmpty) || errors.Is(err, ErrFenced) {
		return nil
	}
	return err
}

// pair picks the poorest ready bucket and the donor for it (-1: none).
func pair(bs []bucketView) (poor, rich int) {
	poor = -1
	for b, x := range bs {
		if x.ready && (poor < 0 || x.stock < bs[poor].stock) {
			poor = b
		}
	}
	if poor < 0 {
		return -1, -1
	}
	return poor, donor(bs, poor, time.Now().UnixMilli())
}

// uneven reports whether a move is due: the poorest ready bucket holds
// less than half of its donor's stock, and half the gap is a unit or
// more (1 against 0 is left to a borrow: moving it moves the gap).
func uneven(bs []bucketView) bool {
	poor, rich := pair(bs)
	return poor >= 0 && rich >= 0 && bs[poor].stock*2 < bs[rich].stock && (bs[rich].stock-bs[poor].stock)/2 >= 1
}
