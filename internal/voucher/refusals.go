package voucher

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Refusals lets an instance answer, without Redis, the purchases Redis has
// just refused in a way that cannot change soon: a voucher sold out or
// ended, one that begins later than the staleness bound from now, and a
// buyer who already holds an order (the order id Redis reported as
// theirs). In a flash sale nearly every request is such a refusal.
//
// Every answer it keeps expires after the bound (TTL), measured from when
// the purchase was sent to Redis, so it is never older than that. What can
// make one wrong sooner (a unit given back, a buyer entry removed, a shard
// rebuilt, a voucher's state loaded) is announced on the Events channel
// and applied by Run; an event missed (a cut subscription) costs at most
// the bound. A not_started answer is kept only while the sale's begin is
// more than the bound away on Redis's clock, so no buyer is refused by a
// stale one at the opening second.
//
// Local answers are today's answers with one difference: a buyer who
// holds an order for a sold-out or ended voucher, and whose order this
// instance has not heard of (bought through another instance, or
// forgotten: the per-buyer memory is bounded), is answered sold_out or
// ended where Redis would answer already_purchased.
//
// A nil *Refusals answers nothing and learns nothing. Its methods are safe
// for concurrent use.
type Refusals struct {
	ttl     int64 // nanoseconds
	now     func() time.Time
	base    time.Time
	keys    Keys
	rdb     redis.UniversalClient
	log     *slog.Logger
	backoff time.Duration

	// epoch grows with every event applied: an answer whose purchase was
	// sent before an event is not kept (it may be what the event undid).
	epoch atomic.Uint64
	// subscribed counts the subscriptions Run confirmed, for tests.
	subscribed atomic.Int64

	mu       sync.Mutex                        // writers of vouchers
	vouchers atomic.Pointer[map[int64]verdict] // copy on write: read on every purchase

	perShard int
	buyers   [buyerShards]buyerShard
}

// RefusalsConfig tunes Refusals.
type RefusalsConfig struct {
	// TTL bounds how old a local answer may be. Required, above 0.
	TTL time.Duration
	// Buyers caps the buyers remembered (default 100,000); past it, an
	// arbitrary one is forgotten for each one learnt.
	Buyers int
	// Now is the clock, time.Now when nil; injectable so tests need not
	// sleep. Only differences of its readings are used.
	Now func() time.Time
	// Backoff is the first wait before subscribing again after a failure
	// (default 100ms), doubled up to 5s.
	Backoff time.Duration
}

// buyerShards spreads the buyers over locks.
const buyerShards = 64

type buyerShard struct {
	sync.Mutex
	m map[buyerKey]held
}

type buyerKey struct{ voucher, user int64 }

type held struct {
	order int64
	until int64 // expiry, on the Refusals' clock
}

// refusal is a refusal kept for a whole voucher.
type refusal uint8

const (
	refusedSoldOut refusal = iota + 1
	refusedEnded
	refusedNotStarted
)

type verdict struct {
	code  refusal
	until int64
}

// NewRefusals returns the local refusals of an instance; rdb (which it does
// not own) and keys are what Run subscribes with.
func NewRefusals(rdb redis.UniversalClient, keys Keys, cfg RefusalsConfig, log *slog.Logger) *Refusals {
	if cfg.TTL <= 0 {
		panic("voucher.NewRefusals: TTL must be above 0")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Buyers <= 0 {
		cfg.Buyers = 100_000
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	r := &Refusals{
		ttl: int64(cfg.TTL), now: cfg.Now, keys: keys, rdb: rdb, log: log, backoff: cfg.Backoff,
		perShard: max(cfg.Buyers/buyerShards, 1),
	}
	r.base = r.now()
	empty := map[int64]verdict{}
	r.vouchers.Store(&empty)
	for i := range r.buyers {
		r.buyers[i].m = map[buyerKey]held{}
	}
	return r
}

// clock is the time on the Refusals' clock, in nanoseconds.
func (r *Refusals) clock() int64 { return int64(r.now().Sub(r.base)) }

func (r *Refusals) shard(k buyerKey) *buyerShard {
	h := uint64(k.voucher)*0x9e3779b97f4a7c15 ^ uint64(k.user)*0xc2b2ae3d27d4eb4f
	return &r.buyers[(h>>32)%buyerShards]
}

// Lookup returns the refusal Redis gave lately to a purchase of voucherID
// by userID, as Reserve returned it (a *PurchasedError, ErrSoldOut,
// ErrEnded or ErrNotStarted), if one is kept and fresh; nil otherwise. The
// buyer's own order comes first, as in the purchase script.
func (r *Refusals) Lookup(voucherID, userID int64) error {
	if r == nil {
		return nil
	}
	now := r.clock()
	k := buyerKey{voucherID, userID}
	s := r.shard(k)
	s.Lock()
	h, ok := s.m[k]
	s.Unlock()
	if ok && now < h.until {
		return &PurchasedError{OrderID: h.order}
	}
	v, ok := (*r.vouchers.Load())[voucherID]
	if !ok || now >= v.until {
		return nil
	}
	switch v.code {
	case refusedSoldOut:
		return ErrSoldOut
	case refusedEnded:
		return ErrEnded
	default:
		return ErrNotStarted
	}
}

// Mark is what Learn needs of the moment a purchase was sent to Redis.
type Mark struct {
	epoch uint64
	at    int64
}

// Mark notes the moment a purchase is sent to Redis: call it just before.
func (r *Refusals) Mark() Mark {
	if r == nil {
		return Mark{}
	}
	return Mark{epoch: r.epoch.Load(), at: r.clock()}
}

// Learn keeps what Redis answered to the purchase sent at m, when it is an
// answer worth keeping: an order of the buyer's (accepted, or already
// held), sold out, ended, or not started with its begin further away than
// two bounds (kept until one bound before it). Nothing is kept when an
// event was applied since m.
func (r *Refusals) Learn(m Mark, voucherID, userID int64, res Reservation, err error) {
	if r == nil {
		return
	}
	var (
		until = m.at + r.ttl
		owned *PurchasedError
		ns    *NotStartedError
	)
	switch {
	case err == nil:
		r.keepBuyer(m, buyerKey{voucherID, userID}, held{order: res.OrderID, until: until})
	case errors.As(err, &owned):
		r.keepBuyer(m, buyerKey{voucherID, userID}, held{order: owned.OrderID, until: until})
	case errors.Is(err, ErrSoldOut):
		r.keepVoucher(m, voucherID, verdict{code: refusedSoldOut, until: until})
	case errors.Is(err, ErrEnded):
		r.keepVoucher(m, voucherID, verdict{code: refusedEnded, until: until})
	case errors.As(err, &ns):
		// Redis read its clock after m: the sale begins no sooner than
		// m.at + Until on this clock. The answer is not given locally
		// from one bound before that.
		if last := m.at + int64(ns.Until) - r.ttl; last > m.at {
			r.keepVoucher(m, voucherID, verdict{code: refusedNotStarted, until: min(until, last)})
		}
	}
}

func (r *Refusals) keepBuyer(m Mark, k buyerKey, h held) {
	s := r.shard(k)
	s.Lock()
	defer s.Unlock()
	if r.epoch.Load() != m.epoch {
		return
	}
	if _, ok := s.m[k]; !ok && len(s.m) >= r.perShard {
		now := r.clock()
		evicted := false
		for old, e := range s.m {
			if e.until <= now {
				delete(s.m, old)
				evicted = true
			}
		}
		for old := range s.m {
			if evicted {
				break
			}
			delete(s.m, old) // an arbitrary one: the map's order is random
			evicted = true
		}
	}
	s.m[k] = h
}

func (r *Refusals) keepVoucher(m Mark, id int64, v verdict) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.epoch.Load() != m.epoch {
		return
	}
	old := *r.vouchers.Load()
	if e, ok := old[id]; ok && e == v {
		return
	}
	now := r.clock()
	next := make(map[int64]verdict, len(old)+1)
	for vid, e := range old {
		if now < e.until {
			next[vid] = e
		}
	}
	next[id] = v
	r.vouchers.Store(&next)
}

// Buyers is how many buyers are remembered.
func (r *Refusals) Buyers() int {
	n := 0
	for i := range r.buyers {
		s := &r.buyers[i]
		s.Lock()
		n += len(s.m)
		s.Unlock()
	}
	return n
}

// Subscriptions is how many times Run has subscribed to the events.
func (r *Refusals) Subscriptions() int64 { return r.subscribed.Load() }

// forget drops the kept answers that match: the vouchers for which
// voucher is true, and the buyers for which buyer is true. The epoch moves
// first, so a purchase in flight keeps none of what it learns.
func (r *Refusals) forget(voucher func(int64) bool, buyer func(buyerKey) bool) {
	r.epoch.Add(1)
	r.mu.Lock()
	old := *r.vouchers.Load()
	next := make(map[int64]verdict, len(old))
	for id, v := range old {
		if !voucher(id) {
			next[id] = v
		}
	}
	r.vouchers.Store(&next)
	r.mu.Unlock()
	for i := range r.buyers {
		s := &r.buyers[i]
		s.Lock()
		for k := range s.m {
			if buyer(k) {
				delete(s.m, k)
			}
		}
		s.Unlock()
	}
}

// forgetAll drops everything kept.
func (r *Refusals) forgetAll() {
	r.forget(func(int64) bool { return true }, func(buyerKey) bool { return true })
}

// apply applies one event (see Events for the forms).
func (r *Refusals) apply(payload string) {
	kind, rest, _ := strings.Cut(payload, " ")
	a, b, _ := strings.Cut(rest, " ")
	x, errA := strconv.ParseInt(a, 10, 64)
	switch {
	case errA != nil:
		r.forgetAll() // not an event this version writes: be safe
	case kind == eventGivenBack:
		user, err := strconv.ParseInt(b, 10, 64)
		if err != nil {
			r.forgetAll()
			return
		}
		// The voucher has a unit again, or the buyer may buy again: its
		// sold_out is wrong, and the buyer's order is gone.
		r.epoch.Add(1)
		r.mu.Lock()
		if _, ok := (*r.vouchers.Load())[x]; ok {
			old := *r.vouchers.Load()
			next := make(map[int64]verdict, len(old))
			for id, v := range old {
				if id != x {
					next[id] = v
				}
			}
			r.vouchers.Store(&next)
		}
		r.mu.Unlock()
		k := buyerKey{x, user}
		s := r.shard(k)
		s.Lock()
		delete(s.m, k)
		s.Unlock()
	case kind == eventLoaded:
		r.forget(func(id int64) bool { return id == x }, func(k buyerKey) bool { return k.voucher == x })
	case kind == eventRebuilt:
		shard := int(x)
		r.forget(func(id int64) bool { return r.keys.Shard(id) == shard },
			func(k buyerKey) bool { return r.keys.Shard(k.voucher) == shard })
	default:
		r.forgetAll()
	}
}

// Run applies the events published on the events channel until ctx is
// done. It drops everything kept each time it (re)subscribes, since events
// may have been missed meanwhile, and after a failure it waits (doubling,
// up to 5s) before it reads again; the client then subscribes again.
func (r *Refusals) Run(ctx context.Context) error {
	ps := r.rdb.Subscribe(ctx, r.keys.Events())
	// Receive does not end when ctx does; closing the subscription ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer func() {
		stop()
		_ = ps.Close()
	}()
	wait := backoff{first: r.backoff, max: 5 * time.Second}
	failing := false
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// Events may be lost until the subscription is back.
			r.forgetAll()
			if !failing {
				r.log.Warn("events subscription failed; local refusals are dropped and resubscribed", "err", err)
				failing = true
			}
			if !wait.wait(ctx) {
				return nil
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				r.forgetAll()
				r.subscribed.Add(1)
				wait.reset()
				if failing {
					r.log.Info("events subscription works again")
					failing = false
				}
			}
		case *redis.Message:
			r.apply(m.Payload)
		}
	}
}

// backoff is the wait between subscription attempts.
type backoff struct {
	first, max, next time.Duration
}

// wait sleeps the next backoff; false when ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	b.next = min(max(b.next*2, b.first), b.max)
	t := time.NewTimer(b.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (b *backoff) reset() { b.next = 0 }

// The events, as published: a kind and its numbers, space separated.
const (
	eventGivenBack = "g" // "g <voucher id> <user id>": a unit given back, a buyer entry removed
	eventLoaded    = "l" // "l <voucher id>": a voucher's state loaded
	eventRebuilt   = "r" // "r <shard>": a shard rebuilt
)

// Events publishes what can make a local refusal wrong on the events
// channel (Keys.Events), for every instance's Refusals. A publish that
// fails is logged at most once a second and otherwise ignored: each local
// answer expires after its bound anyway. A nil *Events publishes nothing.
type Events struct {
	rdb      redis.UniversalClient
	channel  string
	log      *slog.Logger
	lastWarn atomic.Int64
}

// NewEvents returns a publisher of events; it does not own rdb.
func NewEvents(rdb redis.UniversalClient, keys Keys, log *slog.Logger) *Events {
	return &Events{rdb: rdb, channel: keys.Events(), log: log}
}

// GivenBack announces that a reservation of userID for voucherID was
// given back: the unit returned to stock, or the buyer entry removed.
func (e *Events) GivenBack(ctx context.Context, voucherID, userID int64) {
	e.publish(ctx, eventGivenBack+" "+strconv.FormatInt(voucherID, 10)+" "+strconv.FormatInt(userID, 10))
}

// Loaded announces that a voucher's state was (re)loaded.
func (e *Events) Loaded(ctx context.Context, voucherID int64) {
	e.publish(ctx, eventLoaded+" "+strconv.FormatInt(voucherID, 10))
}

// Rebuilt announces that a shard's state was rebuilt.
func (e *Events) Rebuilt(ctx context.Context, shard int) {
	e.publish(ctx, eventRebuilt+" "+strconv.Itoa(shard))
}

func (e *Events) publish(ctx context.Context, payload string) {
	if e == nil {
		return
	}
	err := e.rdb.Publish(context.WithoutCancel(ctx), e.channel, payload).Err()
	if err == nil {
		return
	}
	now := time.Now().UnixNano()
	last := e.lastWarn.Load()
	if now-last < int64(time.Second) || !e.lastWarn.CompareAndSwap(last, now) {
		return
	}
	e.log.Warn("publish sale-state event failed; local refusals elsewhere stay stale up to their bound", "event", payload, "err", err)
}
