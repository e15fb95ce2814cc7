package voucher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/failing"
	"seckill/internal/lease"
)

// rebuildLease is the default time to live of a shard's rebuild lease:
// how long a crashed instance's rebuild blocks others. A live rebuild
// renews it (lease.Keep) and each voucher replaced extends it.
const rebuildLease = 30 * time.Second

// Ledger reads what the database knows of a voucher's sales; the order
// side supplies it.
type Ledger interface {
	// Reservations returns the buyers with an order (user id -> order id)
	// and the order ids that ended as live dead letters.
	Reservations(ctx context.Context, voucherID int64) (buyers map[int64]int64, dead map[int64]bool, err error)
}

// Warmer keeps the Redis sale state in line with the database. At start-up
// and then periodically it loads the state of vouchers on sale that have
// none, and when a shard's ready marker is gone (Redis lost its data) or
// names another master than the one serving the shard (a restart, a
// failover, a moved slot: see judge), it rebuilds the whole shard from the
// database plus the orders still in flight in Redis, and only then marks
// it ready again. Purchases in that shard answer not_ready meanwhile.
type Warmer struct {
	store  *Store
	state  *State
	ledger Ledger
	keys   Keys
	every  time.Duration
	log    *slog.Logger
	// onRebuild, when set, is told of each rebuild this instance did.
	onRebuild func(shard int, reason string)
	// replaceable, when set, says whether a shard whose Redis state is
	// still there may be rebuilt now (ReplaceWhen).
	replaceable func(shard int) bool
	// unknownOnce logs once that the master does not tell its run_id.
	unknownOnce sync.Once
	// afterPage, when set, runs after each page of the pending index is
	// read: tests move orders between the stream and the delay queue there.
	afterPage func()
	// afterBucket, when set, runs after each bucket a shard rebuild
	// wrote, before the shard reopens: tests run another rebuild there.
	afterBucket func(voucherID int64, bucket int)
	// events, when set, announces each shard rebuilt and voucher loaded.
	events *Events
	// quiescer stops a voucher's units moving while one of its buckets
	// is rebuilt (rebuild_buckets.go).
	quiescer Quiescer
	// lease is the shard rebuild lease's time to live.
	lease time.Duration
	// running is when the shard rebuild under way began (unix ns), 0 none.
	running atomic.Int64
	// seenReady[shard] is whether this Warmer has seen the shard ready
	// (its marker present, or reopened by its own rebuild): what tells a
	// first load from a loss (see rebuildLevel).
	seenReady []atomic.Bool
	// taught are told the live vouchers each round reads from the
	// database (Teach); lastLive is the last round's list.
	taughtMu sync.Mutex
	taught   []func([]Voucher)
	lastLive []Voucher
}

// Teach tells fn the live vouchers read from the database at every warm
// round, before any shard is touched, and at once the last round's when
// there was one. An instance learns so what a voucher is (its bucket
// count, whether it has a draw) from the database, not from bucket 0's
// state: a restarted instance sells the buyers of every other bucket
// while bucket 0's master is away (Reserver.Learn, draw's Router.Learn).
// fn must not keep the slice.
func (w *Warmer) Teach(fn func([]Voucher)) {
	w.taughtMu.Lock()
	defer w.taughtMu.Unlock()
	w.taught = append(w.taught, fn)
	if w.lastLive != nil {
		fn(w.lastLive)
	}
}

// teach tells every learner the round's live vouchers.
func (w *Warmer) teach(vs []Voucher) {
	w.taughtMu.Lock()
	defer w.taughtMu.Unlock()
	w.lastLive = vs
	for _, fn := range w.taught {
		fn(vs)
	}
}

// Running is how long the shard rebuild this Warmer is running has run,
// 0 when none.
func (w *Warmer) Running() time.Duration {
	at := w.running.Load()
	if at == 0 {
		return 0
	}
	return time.Since(time.Unix(0, at))
}

// NewWarmer returns a Warmer that checks every interval (default 5s).
func NewWarmer(store *Store, state *State, ledger Ledger, keys Keys, every time.Duration, log *slog.Logger) *Warmer {
	if every <= 0 {
		every = 5 * time.Second
	}
	return &Warmer{store: store, state: state, ledger: ledger, keys: keys, every: every, log: log, lease: rebuildLease,
		seenReady: make([]atomic.Bool, keys.Shards())}
}

// LeaseTTL sets the time to live of a shard's rebuild lease (default
// 30s, at least lease.Min), renewed every third of it while the rebuild
// goes on. Set it before Warm or Run is first called.
func (w *Warmer) LeaseTTL(d time.Duration) { w.lease = max(d, lease.Min) }

// Diff is one difference between Redis and what the database plus the
// in-flight orders say Redis should hold.
type Diff struct {
	VoucherID   int64  `json:"voucher_id"`
	What        string `json:"what"`
	Redis       string `json:"redis"`
	Expected    string `json:"expected"`
	InFlight    int    `json:"in_flight"`
	ShardMarked bool   `json:"shard_ready"`
	// Bucket is the bucket of a voucher of more than one bucket (0
	// otherwise; -1 for a difference of the whole voucher).
	Bucket int `json:"bucket"`
}

// expected is the sale state Redis should hold for one voucher.
type expected struct {
	stock  int64
	buyers map[int64]int64
	flying int
}

// inFlight is a shard's orders accepted but not yet settled in the
// database: on the stream, in the delay queue, or in a worker's hands.
// A buyer has more than one only in odd cases (bought again after Redis
// lost the first): all are kept, the first not dead-lettered counts.
type inFlight map[int64]map[int64][]int64 // voucher -> user -> orders

// inFlightPage is how many pending-index entries one HSCAN call asks for.
const inFlightPage = 1000

// readInFlight reads a shard's in-flight orders from its pending-order
// index, one HSCAN page at a time, so a backlog of any size never blocks
// Redis in one long command.
//
// The index, not the stream and delay queue, is read because paging is
// not atomic: while the pages are read, the worker's retry moves an order
// from the stream to the delay queue and the delay poller moves it back,
// so a paged read of the two could miss an order and the rebuild would
// drop its reservation. The index holds every accepted order from its
// purchase until the worker settles or releases it, wherever its message
// is, and none of its writers (purchase, settle, release) write while the
// shard's ready marker is missing: during a rebuild it does not change,
// and HSCAN returns every entry of a hash that does not change. (For a
// voucher loaded into a ready shard, entries only leave the index after
// their order or dead letter is committed, and the database is read after
// the index.) A message that does not decode was never accepted by the
// purchase script and is not in the index: it holds no reservation.
func (w *Warmer) readInFlight(ctx context.Context, shard int) (inFlight, error) {
	out := inFlight{}
	err := w.scanHash(ctx, w.keys.Pending(shard), func(field, value string) {
		order, err := strconv.ParseInt(field, 10, 64)
		u, v, ok := strings.Cut(value, ":")
		if err != nil || !ok {
			return // not an entry the purchase script wrote
		}
		user, err1 := strconv.ParseInt(u, 10, 64)
		vid, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil {
			return
		}
		if out[vid] == nil {
			out[vid] = map[int64][]int64{}
		}
		out[vid][user] = append(out[vid][user], order)
	}, w.afterPage)
	if err != nil {
		return nil, fmt.Errorf("read pending orders of shard %d: %w", shard, err)
	}
	return out, nil
}

// scanHash is State.scanHash.
func (w *Warmer) scanHash(ctx context.Context, key string, each func(field, value string), afterPage func()) error {
	return w.state.scanHash(ctx, key, each, afterPage)
}

// expect computes what Redis should hold for v: buyers are the database's
// orders plus the in-flight ones that are not dead letters; stock is the
// initial stock less those, and at least 0.
func (w *Warmer) expect(ctx context.Context, v Voucher, flying inFlight) (expected, error) {
	buyers, dead, err := w.ledger.Reservations(ctx, v.ID)
	if err != nil {
		return expected{}, err
	}
	e := expected{buyers: buyers}
	for user, orders := range flying[v.ID] {
		if _, ok := buyers[user]; ok {
			continue
		}
		for _, order := range orders {
			if !dead[order] {
				buyers[user] = order
				e.flying++
				break
			}
		}
	}
	// More buyers than units: after a failover lost some purchases, the
	// rebuilt shard sold their units again. The database will refuse the
	// extra orders as out of stock, giving nothing back: the stock is 0,
	// never below.
	e.stock = max(int64(v.TotalStock)-int64(len(buyers)), 0)
	return e, nil
}

// Why a shard is rebuilt, as OnRebuild is told.
const (
	// RebuildMissing: the shard's ready marker is gone. Redis lost its
	// data (restarted without persistence, flushed), or the shard was
	// never loaded.
	RebuildMissing = "missing"
	// RebuildMasterChanged: the marker names another master than the one
	// serving the shard now. The master restarted with its data (AOF or
	// RDB: whatever it did not persist is lost), a replica took over
	// (asynchronous replication may have lost acknowledged writes), or the
	// shard's slot moved to another master.
	RebuildMasterChanged = "master_changed"
)

// OnRebuild sets a function called once for each shard rebuild this
// Warmer completes, with the shard and why (RebuildMissing,
// RebuildMasterChanged); a rebuild left to another instance is not
// counted. Set it before Warm or Run is first called.
func (w *Warmer) OnRebuild(fn func(shard int, reason string)) { w.onRebuild = fn }

// ReplaceWhen makes a shard whose Redis state is still there (its marker
// names another master: a restart or a failover) wait to be rebuilt while
// ok(shard) is false: the database failed over too, and what it lost is
// written back from that state first (package failover); a rebuild from
// the database would replace it. A shard with no state is rebuilt at
// once: it holds nothing to lose. Set it before Warm or Run is first
// called.
func (w *Warmer) ReplaceWhen(ok func(shard int) bool) { w.replaceable = ok }

// Announce makes the Warmer publish, on e, each shard it rebuilds and
// each voucher state it loads, so that instances drop the local refusals
// (Refusals) those may have made wrong. Set it before Warm or Run is first
// called.
func (w *Warmer) Announce(e *Events) { w.events = e }

// shardCheck is what a Warm round reads of a shard before touching it.
type shardCheck struct {
	marker  string // the ready marker's value
	present bool   // whether the ready marker exists
	master  string // run_id of the master serving the shard; "" when it does not tell
}

// shardVerdict is what a Warm round does with a shard.
type shardVerdict int

const (
	// shardCurrent: the state was loaded into the master serving the
	// shard; only vouchers without state are loaded.
	shardCurrent shardVerdict = iota
	// shardLost: no ready marker; rebuild the shard.
	shardLost
	// shardStale: the marker names another master; drop it (if nobody
	// changed it meanwhile) and rebuild the shard.
	shardStale
)

// judge decides a shard's verdict from Redis alone, with no memory of
// earlier rounds, so every instance reaches the same verdict and the
// rebuild lease lets one of them rebuild. A shard's verdict does not
// depend on any other shard's: on a cluster a failover or a moved slot
// rebuilds only the shards it touched.
//
//	marker missing                        -> lost    (rebuild: missing)
//	master's run_id unknown               -> current (existence only)
//	marker == master's run_id             -> current
//	marker names another master           -> stale   (rebuild: master_changed)
//
// A marker written before markers held the master's run_id holds an
// RFC3339 time: it is stale once, and the shard is rebuilt once.
func judge(c shardCheck) shardVerdict {
	switch {
	case !c.present:
		return shardLost
	case c.master == "" || c.marker == c.master:
		return shardCurrent
	default:
		return shardStale
	}
}

// reason names a rebuild's verdict for OnRebuild and the log.
func (v shardVerdict) reason() string {
	if v == shardStale {
		return RebuildMasterChanged
	}
	return RebuildMissing
}

// rebuildLevel is the level a shard rebuild is logged at. Redis alone
// cannot tell a fresh Redis from one that lost its data (both hold no
// marker); what tells them apart is whether this instance saw the shard
// ready before:
//
//	master_changed                     -> warn (a restart or failover may have lost acknowledged writes)
//	missing, shard seen ready before   -> warn (Redis lost the data while the service ran: restart
//	                                            without persistence, flush, eviction)
//	missing, shard never seen ready    -> info (the first load: a fresh Redis, the embedded one,
//	                                            which starts empty, or one emptied while no instance ran)
//
// The last row is also a start after Redis lost its data while every
// instance was stopped: the log still names the reason, and
// SeckillShardRebuilt does not count an instance's first rebuilds either.
func rebuildLevel(v shardVerdict, seenReady bool) slog.Level {
	if v == shardLost && !seenReady {
		return slog.LevelInfo
	}
	return slog.LevelWarn
}

// Warm checks every shard once: rebuilds the shards whose ready marker is
// gone or names another master than the one serving the shard, and loads
// missing voucher state in the others.
func (w *Warmer) Warm(ctx context.Context) (loaded int, err error) {
	vs, err := w.store.Live(ctx, time.Now())
	if err != nil {
		return 0, err
	}
	w.teach(vs)
	byShard, buckets := w.placeAll(vs)
	// Each master's identity is read once per round.
	ms := w.state.masters()
	// A shard that cannot be warmed does not keep the others closed.
	var errs []error
	for shard := range w.keys.Shards() {
		n, err := w.warmShard(ctx, ms, shard, byShard[shard], buckets[shard])
		loaded += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return loaded, errors.Join(errs...)
}

// warmShard rebuilds the shard when judge says so, else loads the state
// of its vouchers that have none.
func (w *Warmer) warmShard(ctx context.Context, ms *masters, shard int, vs []Voucher, ps []placed) (int, error) {
	c, err := w.check(ctx, ms, shard)
	if err != nil {
		return 0, err
	}
	if c.present {
		w.seenReady[shard].Store(true)
	}
	var (
		v     = judge(c)
		token = lease.NewToken()
		took  bool
		sent  = time.Now() // before the lease is taken, for its watchdog
	)
	switch v {
	case shardCurrent:
		return w.loadMissing(ctx, shard, vs, ps)
	case shardStale:
		if w.replaceable != nil && !w.replaceable(shard) {
			return 0, nil // the next round, once the database's loss is written back
		}
		// The round's identity of this master may be older than the
		// marker: the master restarted during the round and another
		// instance rebuilt the shard with its new identity. Ask again
		// before dropping a marker that may be the current one.
		if c.master, err = ms.reread(ctx, w.keys.Ready(shard)); err != nil {
			return 0, fmt.Errorf("check shard %d: %w", shard, err)
		}
		if judge(c) == shardCurrent {
			return w.loadMissing(ctx, shard, vs, ps)
		}
		// Dropped only if it still holds what was read (an instance that
		// rebuilt the shard meanwhile wrote a new one), with the lease
		// taken in the same step.
		took, err = w.state.dropMarker(ctx, shard, c.marker, token, w.lease)
	default:
		took, err = w.takeRebuildLease(ctx, shard, token)
	}
	if err != nil || !took {
		return 0, err // another instance is at it, or has rebuilt it
	}
	// The identity the shard reopens with is read now, under the lease,
	// before the rebuild reads anything: not one from earlier in the
	// round, which a restart meanwhile would make stale at once. If it
	// cannot be read, the round's serves: at worst one more rebuild.
	if id, err := ms.reread(ctx, w.keys.Ready(shard)); err == nil {
		c.master = id
	}
	// The lease is renewed while the rebuild goes on; lost, the rebuild
	// stops (its writes check the token anyway).
	l := lease.Keep(ctx, w.state.rdb, w.keys.Rebuilding(shard), token, w.lease, sent)
	// A rebuild that hangs (a database that never answers) would keep its
	// leases for ever: it gives up after ten of their lives, and the next
	// round starts over.
	rctx, cancel := context.WithTimeout(l.Context(), 10*w.lease)
	w.running.Store(time.Now().UnixNano())
	n, err := w.rebuildShard(rctx, shard, vs, ps, c, v, token)
	w.running.Store(0)
	cancel()
	l.Stop()
	// A lease lost (the shard's, or a voucher's under Quiesce) or a fence
	// taken over: this rebuild stalled, and one of another instance took
	// its place.
	if err != nil && (errors.Is(l.Err(), lease.ErrLost) || errors.Is(err, lease.ErrLost) || errors.Is(err, ErrTakenOver)) {
		// Stalled past a lease (this process paused, a slow database):
		// another instance's rebuild took over and this one wrote nothing
		// live. Not this round's failure: the next round checks again.
		w.log.Warn("shard rebuild outlived its lease; nothing it counted was made live", "shard", shard,
			"err", err, "lease", context.Cause(l.Context()))
		_ = l.Release(context.WithoutCancel(ctx))
		return 0, nil
	}
	if err != nil {
		// Tried again next round, by whichever instance comes first: not
		// after the lease's life (a bucket's rebuild fails while another
		// bucket of its voucher is rebuilt, and must not wait that long).
		_ = l.Release(context.WithoutCancel(ctx))
	}
	return n, err
}

// check reads the identity of the shard's master, then its ready marker:
// in that order, so a marker written by a rebuild that read the same
// identity matches.
func (w *Warmer) check(ctx context.Context, ms *masters, shard int) (shardCheck, error) {
	id, err := ms.identity(ctx, w.keys.Ready(shard))
	if err != nil {
		return shardCheck{}, fmt.Errorf("check shard %d: %w", shard, err)
	}
	if id == "" {
		w.unknownOnce.Do(func() {
			w.log.Info("redis does not tell its run_id; a shard is rebuilt when its ready marker is gone, not after a restart that kept the data")
		})
	}
	marker, err := w.state.rdb.Get(ctx, w.keys.Ready(shard)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return shardCheck{master: id}, nil
	case err != nil:
		return shardCheck{}, fmt.Errorf("check shard %d: %w", shard, err)
	}
	return shardCheck{marker: marker, present: true, master: id}, nil
}

// loadMissing loads the state of the shard's vouchers, and buckets, that
// have none.
// A bucket that cannot be loaded does not keep the shard's other vouchers
// from theirs.
func (w *Warmer) loadMissing(ctx context.Context, shard int, vs []Voucher, ps []placed) (int, error) {
	n, berr := w.loadMissingBuckets(ctx, shard, ps)
	todo, err := w.missingState(ctx, vs)
	if err != nil || len(todo) == 0 {
		return n, errors.Join(berr, err)
	}
	if err := w.loadAll(ctx, shard, todo, ""); err != nil {
		return n, errors.Join(berr, err)
	}
	return n + len(todo), berr
}

// rebuildShard writes the state of every voucher of the shard under the
// shard's rebuild lease, which token holds, then reopens the shard with
// the master identity read before the rebuild began.
func (w *Warmer) rebuildShard(ctx context.Context, shard int, vs []Voucher, ps []placed, c shardCheck, v shardVerdict, token string) (int, error) {
	w.log.Log(ctx, rebuildLevel(v, w.seenReady[shard].Load()), "rebuilding shard state from the database",
		"shard", shard, "reason", v.reason(), "old_master", c.marker, "new_master", markerOf(c.master),
		"vouchers", len(vs), "buckets", len(ps))
	if len(vs) > 0 {
		if err := w.loadAll(ctx, shard, vs, token); err != nil {
			return 0, err
		}
	}
	guards, release, err := w.rebuildBuckets(ctx, shard, ps, token)
	if err != nil {
		return 0, err
	}
	// The rebuilt buckets' vouchers stay quiet until the shard is open,
	// and it opens only while their guards hold: see rebuildBuckets.
	defer release(context.WithoutCancel(ctx))
	if err := w.state.Reopen(ctx, token, shard, c.master, guards...); err != nil {
		return 0, err
	}
	w.seenReady[shard].Store(true)
	w.log.Info("shard state rebuilt from the database", "shard", shard, "vouchers", len(vs), "buckets", len(ps))
	w.events.Rebuilt(ctx, shard)
	for _, p := range ps {
		// Instances forget a shard's vouchers by Keys.Shard: a bucket
		// elsewhere is announced by its voucher.
		w.events.Loaded(ctx, p.v.ID)
	}
	if w.onRebuild != nil {
		w.onRebuild(shard, v.reason())
	}
	return len(vs) + len(ps), nil
}

// takeRebuildLease makes this instance the one that rebuilds the shard, and
// only while the marker is still missing: a second rebuild after the first
// reopened the shard would overwrite live purchases. took is false when
// another instance is at it or has rebuilt it meanwhile.
func (w *Warmer) takeRebuildLease(ctx context.Context, shard int, token string) (took bool, err error) {
	rdb := w.state.rdb
	took, err = rdb.SetNX(ctx, w.keys.Rebuilding(shard), token, w.lease).Result()
	if err != nil {
		return false, fmt.Errorf("take shard %d rebuild lease: %w", shard, err)
	}
	if !took {
		return false, nil // another instance is at it
	}
	if ready, err := rdb.Exists(ctx, w.keys.Ready(shard)).Result(); err != nil || ready == 1 {
		w.state.releaseRebuild(context.WithoutCancel(ctx), shard, token)
		return false, err // rebuilt meanwhile
	}
	return true, nil
}

// missingState returns the vouchers whose state Redis does not hold.
func (w *Warmer) missingState(ctx context.Context, vs []Voucher) ([]Voucher, error) {
	if len(vs) == 0 {
		return nil, nil
	}
	pipe := w.state.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(vs))
	for i, v := range vs {
		exists[i] = pipe.Exists(ctx, w.keys.State(v.ID))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("check voucher state: %w", err)
	}
	var todo []Voucher
	for i, v := range vs {
		if exists[i].Val() == 0 {
			todo = append(todo, v)
		}
	}
	return todo, nil
}

// loadAll writes what Redis should hold for each voucher: under the
// rebuild lease token (replacing whatever is there), or, with no token,
// only where the state is missing.
func (w *Warmer) loadAll(ctx context.Context, shard int, todo []Voucher, token string) error {
	flying, err := w.readInFlight(ctx, shard)
	if err != nil {
		return err
	}
	rebuild := token != ""
	for _, v := range todo {
		e, err := w.expect(ctx, v, flying)
		if err != nil {
			return err
		}
		if rebuild {
			err = w.state.Replace(ctx, token, w.lease, v, e.stock, e.buyers)
		} else {
			v.Stock = int(e.stock)
			_, err = w.state.Load(ctx, v, e.buyers)
		}
		if err != nil {
			return err
		}
		if !rebuild {
			w.events.Loaded(ctx, v.ID) // a rebuild announces its whole shard when it reopens it
		}
		w.log.Info("voucher state loaded from database", "voucher_id", v.ID, "stock", e.stock,
			"buyers", len(e.buyers), "in_flight", e.flying, "shard_rebuilt", rebuild)
	}
	return nil
}

// Reconcile compares, for every voucher on sale, Redis's stock and buyers
// with what the database plus the in-flight orders say, and reports every
// difference. It changes nothing.
func (w *Warmer) Reconcile(ctx context.Context) ([]Diff, error) {
	vs, err := w.store.Live(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	rdb := w.state.rdb
	diffs := []Diff{}
	flying := map[int]inFlight{}
	for _, v := range vs {
		if v.BucketCount() > 1 {
			d, err := w.reconcileBuckets(ctx, v)
			if err != nil {
				return nil, err
			}
			diffs = append(diffs, d...)
			continue
		}
		shard := w.keys.Shard(v.ID)
		if flying[shard] == nil {
			if flying[shard], err = w.readInFlight(ctx, shard); err != nil {
				return nil, err
			}
		}
		ready, err := rdb.Exists(ctx, w.keys.Ready(shard)).Result()
		if err != nil {
			return nil, err
		}
		e, err := w.expect(ctx, v, flying[shard])
		if err != nil {
			return nil, err
		}
		d := Diff{VoucherID: v.ID, InFlight: e.flying, ShardMarked: ready == 1}
		stock, err := rdb.HGet(ctx, w.keys.State(v.ID), "stock").Result()
		switch {
		case errors.Is(err, redis.Nil):
			d.What, d.Redis, d.Expected = "state", "missing", fmt.Sprint(e.stock)
			diffs = append(diffs, d)
			continue
		case err != nil:
			return nil, err
		case stock != fmt.Sprint(e.stock):
			d.What, d.Redis, d.Expected = "stock", stock, fmt.Sprint(e.stock)
			diffs = append(diffs, d)
		}
		got, err := w.buyers(ctx, v.ID)
		if err != nil {
			return nil, err
		}
		if inRedis, expected, differ := compareBuyers(got, e.buyers); differ {
			d.What, d.Redis, d.Expected = "buyers", inRedis, expected
			diffs = append(diffs, d)
		}
	}
	return diffs, nil
}

// compareBuyers says how Redis's buyers (user -> order, as strings) differ
// from the expected ones, if they do.
func compareBuyers(got map[string]string, want map[int64]int64) (inRedis, expected string, differ bool) {
	missing, extra := 0, 0
	for u, o := range want {
		if got[fmt.Sprint(u)] != fmt.Sprint(o) {
			missing++
		}
	}
	for u := range got {
		var id int64
		if _, err := fmt.Sscan(u, &id); err != nil || want[id] == 0 {
			extra++
		}
	}
	return fmt.Sprintf("%d entries, %d unexpected", len(got), extra),
		fmt.Sprintf("%d entries, %d missing", len(want), missing), missing+extra > 0
}

// buyers reads a voucher's buyers hash in pages (scanHash).
func (w *Warmer) buyers(ctx context.Context, voucherID int64) (map[string]string, error) {
	return w.buyersAt(ctx, w.keys.Shard(voucherID), voucherID)
}

// buyersAt reads the buyers hash of a voucher's bucket in shard.
func (w *Warmer) buyersAt(ctx context.Context, shard int, voucherID int64) (map[string]string, error) {
	out := map[string]string{}
	if err := w.scanHash(ctx, w.keys.BuyersAt(shard, voucherID), func(user, order string) { out[user] = order }, nil); err != nil {
		return nil, fmt.Errorf("read buyers of voucher %d: %w", voucherID, err)
	}
	return out, nil
}

// Run warms periodically until ctx is done.
func (w *Warmer) Run(ctx context.Context) error {
	t := time.NewTicker(w.every)
	defer t.Stop()
	rounds := failing.Log{Log: w.log, What: "warming voucher state"}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, err := w.Warm(ctx)
		rounds.Round(ctx, err)
	}
}
