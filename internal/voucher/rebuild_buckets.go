package voucher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// placed is one bucket of a voucher of more than one bucket, as a Warm
// round sees it: the shard it lives in is Keys.BucketShard(v.ID, b, nb).
type placed struct {
	v Voucher
	b int
}

// Quiesce makes the Warmer rebuild one bucket of a voucher of more than
// one bucket: units moving between buckets stand still meanwhile. Without
// it such a bucket is never rebuilt (its shard stays closed, fail closed).
// Set it before Warm or Run is first called.
func (w *Warmer) Quiesce(q Quiescer) { w.quiescer = q }

// AfterBucket sets a hook a shard rebuild runs after each bucket it wrote,
// before the shard reopens: fault tests stall or race a rebuild there.
// Set it before Warm or Run is first called.
func (w *Warmer) AfterBucket(f func(voucherID int64, bucket int)) { w.afterBucket = f }

// errNoQuiescer means a bucket of a voucher of more than one bucket needs
// a rebuild and the Warmer has no Quiescer.
var errNoQuiescer = errors.New("no quiescer to rebuild a bucket")

// errUncounted means a bucket's units could not be counted now: the
// voucher could not be quiesced (a master of another bucket does not
// answer, another rebuild holds it) or the holders of its buckets not
// ready could not be read.
var errUncounted = errors.New("the voucher's other buckets could not be counted")

// ErrHeld means another instance holds the voucher (its rebuild or load
// of another bucket is under way): a Quiescer's answer to try the next
// round, not a bucket that cannot be counted. A shard rebuild that meets
// it fails and is tried again, as before buckets could be left out.
var ErrHeld = errors.New("voucher bucket lease held by another")

// errOverAllocated means a voucher's other buckets hold more units than
// its stock: a bucket rebuilt now would sell units twice.
var errOverAllocated = errors.New("buckets hold more than the voucher's stock")

// placeAll sorts the live vouchers by the shards their state lives in:
// vouchers of one bucket by Shard, the buckets of the others by their
// bucket's shard.
func (w *Warmer) placeAll(vs []Voucher) (one map[int][]Voucher, many map[int][]placed) {
	one, many = map[int][]Voucher{}, map[int][]placed{}
	for _, v := range vs {
		nb := v.BucketCount()
		if nb == 1 {
			one[w.keys.Shard(v.ID)] = append(one[w.keys.Shard(v.ID)], v)
			continue
		}
		for b := range nb {
			s := w.keys.BucketShard(v.ID, b, nb)
			many[s] = append(many[s], placed{v: v, b: b})
		}
	}
	return one, many
}

// loadMissingBuckets loads the buckets of a ready shard that have no
// state. A voucher none of whose buckets has state is loaded whole, by
// shares (State.LoadBuckets: nothing can have moved). A bucket missing
// beside others that have state gets the alloc the others leave
// (bucketAlloc).
func (w *Warmer) loadMissingBuckets(ctx context.Context, shard int, ps []placed) (int, error) {
	loaded := 0
	// One bucket that cannot be loaded holds up only itself.
	var errs []error
	for _, p := range ps {
		n, err := w.rdb().Exists(ctx, w.keys.StateAt(shard, p.v.ID)).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("check state of voucher %d bucket %d: %w", p.v.ID, p.b, err))
			continue
		}
		if n == 1 {
			continue
		}
		if err := w.loadBucket(ctx, shard, p); err != nil {
			errs = append(errs, err)
			continue
		}
		loaded++
	}
	return loaded, errors.Join(errs...)
}

// loadBucket writes one missing bucket's state (never over one there).
func (w *Warmer) loadBucket(ctx context.Context, shard int, p placed) error {
	nb := p.v.BucketCount()
	others, err := w.state.bucketsWithState(ctx, p.v)
	if err != nil {
		return err
	}
	if others == 0 {
		buyers, err := w.allHolders(ctx, p.v)
		if err != nil {
			return err
		}
		if _, err := w.state.LoadBuckets(ctx, p.v, buyers); err != nil {
			return err
		}
		w.events.Loaded(ctx, p.v.ID)
		w.log.Info("voucher buckets loaded from database", "voucher_id", p.v.ID, "buckets", nb, "buyers", len(buyers))
		return nil
	}
	alloc, q, err := w.bucketAlloc(ctx, p)
	if errors.Is(err, errOverAllocated) {
		flying, ferr := w.readInFlight(ctx, shard)
		if ferr != nil {
			return ferr
		}
		e, eerr := w.emptyBucket(ctx, p, flying, err)
		if eerr != nil {
			return eerr
		}
		_, err = w.state.loadAt(ctx, shard, p.v, 0, e.buyers, BucketFields(p.v, 0), nil)
		return err
	}
	if err != nil {
		return err
	}
	defer q.Release(context.WithoutCancel(ctx))
	// The rest runs while the voucher's lease is held, and the write
	// lands only while this rebuild's fence on the bucket holds.
	flying, err := w.readInFlight(q.Ctx, shard)
	if err != nil {
		return err
	}
	e, err := w.expectBucket(q.Ctx, p, flying, alloc)
	if err != nil {
		return err
	}
	if _, err := w.state.loadAt(q.Ctx, shard, p.v, e.stock, e.buyers, BucketFields(p.v, alloc), &q.Guard); err != nil {
		return err
	}
	w.events.Loaded(ctx, p.v.ID)
	w.log.Info("voucher bucket loaded from database", "voucher_id", p.v.ID, "bucket", p.b, "alloc", alloc, "stock", e.stock, "buyers", len(e.buyers))
	return nil
}

// emptyBucket is what bucket p gets when the voucher's other buckets
// already hold more than its stock (units were made twice: selling this
// bucket's share as well would sell more): no units, and its buyers, so
// that one purchase per user still holds. The bucket's shard opens with
// its other vouchers; the voucher's excess shows in reconcile's alloc line
// until an operator looks (api buckets). Writing no units needs no hold on
// the voucher: nothing it writes can be sold.
func (w *Warmer) emptyBucket(ctx context.Context, p placed, flying inFlight, cause error) (expected, error) {
	e, err := w.expectBucket(ctx, p, flying, 0)
	if err != nil {
		return expected{}, err
	}
	w.log.Error("voucher bucket written with no units: the other buckets hold more than the voucher's stock",
		"voucher_id", p.v.ID, "bucket", p.b, "buyers", len(e.buyers), "err", cause)
	return e, nil
}

// rebuildBuckets writes the state of the shard's buckets under the
// shard's rebuild lease (token), each with the alloc the voucher's other
// buckets leave it. A bucket that cannot be counted now (errUncounted: a
// master of the voucher's other buckets down; not ErrHeld, another
// instance at work on the voucher, which fails the rebuild for the next
// round to try again) does not keep the shard
// closed: its old state is dropped (State.DropAt) and the shard opens
// without it, its buyers answered not_ready and its moves refused or
// closed as its donor's "forgotten" ones, until a later round loads it
// from what the others hold (loadMissingBuckets). The voucher's other
// buckets count it by its holders meanwhile, as one not ready.
//
// The buckets (of different vouchers) are rebuilt side by side, at most bucketRebuilds at once: each waits out the transfer
// apply window (Quiescer), and one after the other they would keep the
// shard closed that many times as long. Each voucher stays quiet (its
// lease held) until the returned release is called, once the shard is
// reopened: until then the rebuilt bucket is not ready, and a rebuild of
// another bucket of the voucher would count it by its buyers alone,
// handing its units out twice. The shard must reopen only while every
// returned guard holds (State.Reopen): a rebuild that stalled past its
// voucher's lease was taken over, and the other rebuild counted without
// it. On an error, whatever was held is released.
func (w *Warmer) rebuildBuckets(ctx context.Context, shard int, ps []placed, token string) (guards []Guard, release func(context.Context), err error) {
	var (
		mu   sync.Mutex
		held []Quiet
	)
	// The buckets' holds live in bctx: one bucket failing ends it, so the
	// others stop instead of fencing, draining and counting for nothing;
	// otherwise it ends with the release.
	bctx, stop := context.WithCancel(ctx)
	release = func(ctx context.Context) {
		for _, q := range held {
			q.Release(ctx)
		}
		stop()
	}
	if len(ps) == 0 {
		return nil, release, nil
	}
	flying, err := w.readInFlight(ctx, shard)
	if err != nil {
		stop()
		return nil, func(context.Context) {}, err
	}
	var g errgroup.Group
	g.SetLimit(bucketRebuilds)
	for _, p := range ps {
		g.Go(func() error {
			q, err := w.rebuildBucket(bctx, shard, p, flying, token)
			if errors.Is(err, errUncounted) {
				if err = w.state.DropAt(bctx, token, w.lease, shard, p.v); err == nil {
					w.log.Warn("voucher bucket left out of its shard's rebuild: the other buckets could not be counted; loaded once they can",
						"voucher_id", p.v.ID, "bucket", p.b, "shard", shard)
					return nil
				}
			}
			if err != nil {
				stop()
			}
			if q.Release != nil {
				mu.Lock()
				held = append(held, q)
				mu.Unlock()
			}
			if err == nil && w.afterBucket != nil {
				w.afterBucket(p.v.ID, p.b)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		release(context.WithoutCancel(ctx))
		return nil, func(context.Context) {}, err
	}
	for _, q := range held {
		guards = append(guards, q.Guard)
	}
	return guards, release, nil
}

// bucketRebuilds bounds the buckets one shard rebuild writes at once.
const bucketRebuilds = 8

// rebuildBucket counts and writes one bucket; the Quiet it returns (with
// a Release once quiesced, even on an error) holds the voucher until the
// shard reopens. The database is read, and the state written, in the
// Quiet's context: a lease lost stops the rebuild there.
func (w *Warmer) rebuildBucket(ctx context.Context, shard int, p placed, flying inFlight, token string) (Quiet, error) {
	alloc, q, err := w.bucketAlloc(ctx, p)
	if errors.Is(err, errOverAllocated) {
		e, eerr := w.emptyBucket(ctx, p, flying, err)
		if eerr != nil {
			return Quiet{}, eerr
		}
		return Quiet{}, w.state.ReplaceAt(ctx, token, w.lease, shard, p.v, 0, BucketFields(p.v, 0), e.buyers)
	}
	if err != nil {
		return Quiet{}, err
	}
	e, err := w.expectBucket(q.Ctx, p, flying, alloc)
	if err != nil {
		return q, err
	}
	if err := w.state.ReplaceAt(q.Ctx, token, w.lease, shard, p.v, e.stock, BucketFields(p.v, alloc), e.buyers); err != nil {
		return q, err
	}
	w.log.Info("voucher bucket rebuilt from database", "voucher_id", p.v.ID, "bucket", p.b, "alloc", alloc,
		"stock", e.stock, "buyers", len(e.buyers), "in_flight", e.flying)
	return q, nil
}

// bucketAlloc is what bucket p.b of a voucher holds once the others are
// counted: total - the alloc of every other ready bucket - the holders of
// every other bucket not ready (such a bucket keeps only the units it sold;
// its own rebuild later gets what the others leave, never less than its
// holders). The other buckets are counted while their units stand still
// (Quiescer); the voucher stays quiet until q.Release is called, after the
// bucket's state is written and its shard reopened. On an error nothing is
// held.
func (w *Warmer) bucketAlloc(ctx context.Context, p placed) (alloc int64, q Quiet, err error) {
	if w.quiescer == nil {
		return 0, Quiet{}, fmt.Errorf("rebuild voucher %d bucket %d: %w", p.v.ID, p.b, errNoQuiescer)
	}
	nb := p.v.BucketCount()
	q, err = w.quiescer.Quiesce(ctx, p.v.ID, nb, p.b)
	switch {
	case errors.Is(err, ErrHeld) || errors.Is(err, ErrTakenOver) || ctx.Err() != nil:
		return 0, Quiet{}, fmt.Errorf("rebuild voucher %d bucket %d: %w", p.v.ID, p.b, err)
	case err != nil:
		return 0, Quiet{}, fmt.Errorf("rebuild voucher %d bucket %d: %w: %w", p.v.ID, p.b, errUncounted, err)
	}
	var others int64
	for _, a := range q.Alloc {
		others += a
	}
	holders, err := w.holdersOf(q.Ctx, p.v, q.NotReady)
	if err != nil {
		q.Release(context.WithoutCancel(ctx))
		return 0, Quiet{}, fmt.Errorf("rebuild voucher %d bucket %d: count buckets %v, not ready: %w: %w", p.v.ID, p.b, q.NotReady, errUncounted, err)
	}
	others += holders
	alloc = int64(p.v.TotalStock) - others
	if alloc < 0 {
		// Units exist twice already: selling this bucket's share too would
		// oversell. It gets none (emptyBucket).
		q.Release(context.WithoutCancel(ctx))
		return 0, Quiet{}, fmt.Errorf("rebuild voucher %d bucket %d: the other buckets hold %d units of %d: %w",
			p.v.ID, p.b, others, p.v.TotalStock, errOverAllocated)
	}
	return alloc, q, nil
}

// expectBucket is expect for one bucket: its buyers are the holders whose
// home it is (the database's and the shard's in-flight ones), its stock
// alloc less those.
func (w *Warmer) expectBucket(ctx context.Context, p placed, flying inFlight, alloc int64) (expected, error) {
	nb := p.v.BucketCount()
	all, err := w.expect(ctx, p.v, flying)
	if err != nil {
		return expected{}, err
	}
	e := expected{buyers: map[int64]int64{}}
	for u, o := range all.buyers {
		if Home(u, nb) == p.b {
			e.buyers[u] = o
		}
	}
	e.flying = all.flying
	e.stock = max(alloc-int64(len(e.buyers)), 0)
	return e, nil
}

// holdersOf counts the holders whose home is one of buckets bs of v (the
// database's orders and the in-flight ones of those buckets' shards), with
// one read of the voucher's orders whatever the number of buckets.
func (w *Warmer) holdersOf(ctx context.Context, v Voucher, bs []int) (int64, error) {
	if len(bs) == 0 {
		return 0, nil
	}
	nb := v.BucketCount()
	flying := inFlight{v.ID: {}}
	for _, b := range bs {
		f, err := w.readInFlight(ctx, w.keys.BucketShard(v.ID, b, nb))
		if err != nil {
			return 0, err
		}
		// A buyer's purchases run in its home bucket's shard only.
		maps.Copy(flying[v.ID], f[v.ID])
	}
	all, err := w.expect(ctx, v, flying)
	if err != nil {
		return 0, err
	}
	homes := SplitBuyers(all.buyers, nb)
	var n int64
	for _, b := range bs {
		n += int64(len(homes[b]))
	}
	return n, nil
}

// allHolders is every holder of a voucher's units: the database's and the
// in-flight orders of every bucket's shard.
func (w *Warmer) allHolders(ctx context.Context, v Voucher) (map[int64]int64, error) {
	nb := v.BucketCount()
	flying := inFlight{v.ID: {}}
	for b := range nb {
		f, err := w.readInFlight(ctx, w.keys.BucketShard(v.ID, b, nb))
		if err != nil {
			return nil, err
		}
		for u, os := range f[v.ID] {
			flying[v.ID][u] = append(flying[v.ID][u], os...)
		}
	}
	e, err := w.expect(ctx, v, flying)
	if err != nil {
		return nil, err
	}
	return e.buyers, nil
}

func (w *Warmer) rdb() redis.UniversalClient { return w.state.rdb }

// transitCounter counts the units of a voucher's moves applied by their
// receiver and not yet closed by their donor (the bucket package's Mover).
type transitCounter interface {
	Applied(ctx context.Context, voucherID int64, nb int) (int64, error)
}

// reconcileReads bounds the reads of a voucher's buckets by reconcile: a
// sum that differs on every read is a difference, one that differed while
// a move was under way between two reads is not.
const reconcileReads = 3

// reconcileBuckets is Reconcile for a voucher of more than one bucket: per
// bucket, the stock its alloc and holders say and the buyers whose home it
// is; per voucher, sum(alloc) + sum(out) - the units of applied moves not
// yet closed = total. The buckets are read one by one, so a move under way
// can make one read differ: the sum is read again, and reported only when
// it differs on every read.
func (w *Warmer) reconcileBuckets(ctx context.Context, v Voucher) ([]Diff, error) {
	for read := 1; ; read++ {
		diffs, sum, err := w.reconcileBucketsOnce(ctx, v)
		if err != nil || len(diffs) > 0 || sum.ok() {
			return diffs, err
		}
		if read == reconcileReads {
			return []Diff{{VoucherID: v.ID, Bucket: -1, What: "alloc",
				Redis:    fmt.Sprintf("alloc %d + in transit %d", sum.alloc, sum.out-sum.applied),
				Expected: fmt.Sprint(v.TotalStock)}}, nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// allocSum is a voucher's units over its buckets, as reconcile reads them.
type allocSum struct{ alloc, out, applied, total int64 }

func (s allocSum) ok() bool { return s.alloc+s.out-s.applied == s.total }

func (w *Warmer) reconcileBucketsOnce(ctx context.Context, v Voucher) ([]Diff, allocSum, error) {
	nb := v.BucketCount()
	var diffs []Diff
	sum := allocSum{total: int64(v.TotalStock)}
	for b := range nb {
		shard := w.keys.BucketShard(v.ID, b, nb)
		flying, err := w.readInFlight(ctx, shard)
		if err != nil {
			return nil, sum, err
		}
		f, err := w.rdb().HMGet(ctx, w.keys.StateAt(shard, v.ID), "stock", FieldAlloc, FieldOut).Result()
		if err != nil {
			return nil, sum, err
		}
		ready, err := w.rdb().Exists(ctx, w.keys.Ready(shard)).Result()
		if err != nil {
			return nil, sum, err
		}
		d := Diff{VoucherID: v.ID, Bucket: b, ShardMarked: ready == 1}
		stock, _ := f[0].(string)
		a, err1 := strconv.ParseInt(fmt.Sprint(f[1]), 10, 64)
		o, err2 := strconv.ParseInt(fmt.Sprint(f[2]), 10, 64)
		if stock == "" || err1 != nil || err2 != nil {
			d.What, d.Redis, d.Expected = "state", "missing", "a bucket"
			diffs = append(diffs, d)
			continue
		}
		sum.alloc, sum.out = sum.alloc+a, sum.out+o
		e, err := w.expectBucket(ctx, placed{v: v, b: b}, flying, a)
		if err != nil {
			return nil, sum, err
		}
		d.InFlight = e.flying
		if stock != fmt.Sprint(e.stock) {
			d.What, d.Redis, d.Expected = "stock", stock, fmt.Sprint(e.stock)
			diffs = append(diffs, d)
		}
		got, err := w.buyersAt(ctx, shard, v.ID)
		if err != nil {
			return nil, sum, err
		}
		if inRedis, expected, differ := compareBuyers(got, e.buyers); differ {
			d.What, d.Redis, d.Expected = "buyers", inRedis, expected
			diffs = append(diffs, d)
		}
	}
	if tc, ok := w.quiescer.(transitCounter); ok && sum.out > 0 {
		applied, err := tc.Applied(ctx, v.ID, nb)
		if err != nil {
			return nil, sum, err
		}
		sum.applied = applied
	}
	return diffs, sum, nil
}
