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
// Redis checks the buyer's order before the voucher's state, the window
// and the stock, so a buyer who holds one is answered already_purchased
// even when the voucher is sold out or ended. Locally the same holds for
// the buyers this instance knows: those it sold to or heard Redis name,
// and those every other instance announces. Each accepted purchase is
// announced on the Events channel, batched (one PUBLISH per flush, at most
// announceBatch purchases or announceAfter after the first of them, from
// Run), and every instance keeps them as if Redis had answered it, under
// the same cap. A buyer whose answer expired, or whose order was written
// (Events.Written), is asked of Redis again on their next purchase, never
// answered sold_out or ended from memory.
//
// What remains different from Redis's answers: a buyer still unknown to
// this instance is answered sold_out or ended while it keeps that refusal
// of the voucher. That is so for the few milliseconds an announcement is
// in flight after the purchase's 202 (queued, then published), and,
// until the buyer's order is written and announced, for a buyer whose
// announcement was lost: dropped because the queue was full (logged at
// most once a second), a publish that failed, a subscription cut, an
// instance started after it, or a buyer forgotten past the cap. An
// announced answer is kept for what is left of its bound, counted on the
// announcing instance from when the purchase was sent to Redis; only the
// PUBLISH's own transit is not counted.
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
	// refreshing holds, per voucher, the expiry of the answer one purchase
	// was sent to Redis to renew, ahead of that expiry (see Lookup).
	refreshing sync.Map // voucher id -> int64

	perShard int
	buyers   [buyerShards]buyerShard

	// out queues the purchases accepted here, to announce.
	out      chan accepted
	events   *Events
	lastDrop atomic.Int64 // unix ns of the last logged drop
}

// accepted is a purchase accepted by Redis, queued to be announced.
type accepted struct {
	voucher, user, order int64
	at                   int64 // when sent to Redis, on the Refusals' clock
}

// Announcements are flushed when announceBatch are queued, or
// announceAfter after the first of them.
const (
	announceBatch = 256
	announceAfter = 20 * time.Millisecond
)

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
	// Events announces the purchases accepted here; nil: its own on the
	// same client.
	Events *Events
	// Queue bounds the accepted purchases waiting to be announced
	// (default 4096); past it, one is dropped for each one accepted.
	Queue int
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
	// gone: this order's reservation was given back. Until expiry its
	// buyer is asked of Redis, and an announcement of the order that
	// arrives late (it was queued before the give-back) is ignored.
	gone bool
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
	if cfg.Events == nil {
		cfg.Events = NewEvents(rdb, keys, log)
	}
	if cfg.Queue <= 0 {
		cfg.Queue = 4096
	}
	r := &Refusals{
		ttl: int64(cfg.TTL), now: cfg.Now, keys: keys, rdb: rdb, log: log, backoff: cfg.Backoff,
		perShard: max(cfg.Buyers/buyerShards, 1),
		out:      make(chan accepted, cfg.Queue), events: cfg.Events,
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
// buyer's own order comes first, as in the purchase script: a buyer known
// to have held one, whose answer is no longer fresh, is asked of Redis.
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
	if ok {
		if now < h.until && !h.gone {
			return &PurchasedError{OrderID: h.order}
		}
		return nil
	}
	v, ok := (*r.vouchers.Load())[voucherID]
	if !ok || now >= v.until {
		return nil
	}
	// In the last quarter of its bound, one purchase (the first to come)
	// goes to Redis and renews a sold-out or ended answer, while the
	// others are still answered from it: without that, every press in
	// flight at the moment it expires would go to Redis at once. (A
	// not-started answer ends before the opening, not to be renewed.)
	if v.code != refusedNotStarted && now >= v.until-r.ttl/4 && r.claimRefresh(voucherID, v.until) {
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

// claimRefresh reports whether the caller is the one purchase sent to
// Redis to renew the voucher's answer that expires at until.
func (r *Refusals) claimRefresh(voucherID, until int64) bool {
	prev, ok := r.refreshing.Load(voucherID)
	if ok && prev.(int64) == until {
		return false // another purchase renews it
	}
	if !ok {
		_, loaded := r.refreshing.LoadOrStore(voucherID, until)
		return !loaded
	}
	return r.refreshing.CompareAndSwap(voucherID, prev, until)
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
// event was applied since m. An accepted purchase is also queued to be
// announced to every instance; it never waits for room.
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
		r.announce(accepted{voucher: voucherID, user: userID, order: res.OrderID, at: m.at})
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
	r.hold(s, k, h)
}

// hold keeps h for k in s, whose lock the caller holds, within the cap:
// the expired answers go first, then an arbitrary one.
func (r *Refusals) hold(s *buyerShard, k buyerKey, h held) {
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
// voucher is true, and the buyers for which buyer is true. A buyer's
// answer is not dropped but expired: their next purchase is asked of
// Redis, never answered sold_out or ended from memory. The epoch moves
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
		for k, h := range s.m {
			// A given-back order stays given back: a late announcement
			// of it is still ignored.
			if h.until != 0 && !h.gone && buyer(k) {
				s.m[k] = held{order: h.order}
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
	switch kind {
	case eventAccepted:
		r.applyAccepted(rest)
		return
	case eventWritten:
		r.applyWritten(rest)
		return
	}
	a, b, _ := strings.Cut(rest, " ")
	x, errA := strconv.ParseInt(a, 10, 64)
	switch {
	case errA != nil:
		r.forgetAll() // not an event this version writes: be safe
	case kind == eventGivenBack:
		u, o, _ := strings.Cut(b, " ")
		user, err := strconv.ParseInt(u, 10, 64)
		if err != nil {
			r.forgetAll()
			return
		}
		order, _ := strconv.ParseInt(o, 10, 64) // 0: not named
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
		if order != 0 {
			r.hold(s, k, held{order: order, until: r.clock() + r.ttl, gone: true})
		} else {
			delete(s.m, k)
		}
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

// applyAccepted keeps the purchases another instance (or this one)
// announced: "<age us> (<voucher id> <user id> <order id>)...", each for
// what is left of its bound. One too old to be kept is expired at once, so
// the buyer is asked of Redis.
func (r *Refusals) applyAccepted(rest string) {
	age, rest, _ := strings.Cut(rest, " ")
	us, err := strconv.ParseInt(age, 10, 64)
	if err != nil {
		r.forgetAll()
		return
	}
	now := r.clock()
	until := now + r.ttl - us*int64(time.Microsecond)
	if until <= now {
		until = 0
	}
	if !r.eachOrder(rest, func(k buyerKey, order int64) {
		h := held{order: order, until: until}
		s := r.shard(k)
		s.Lock()
		// An order given back since it was accepted stays given back.
		if e, ok := s.m[k]; !ok || !e.gone || e.order != order || now >= e.until {
			r.hold(s, k, h)
		}
		s.Unlock()
	}) {
		r.forgetAll()
	}
}

// applyWritten expires the answers of the buyers of written orders, and
// marks those not known: their next purchase is asked of Redis, which
// names the order it holds for them now.
func (r *Refusals) applyWritten(rest string) {
	r.epoch.Add(1)
	if !r.eachOrder(rest, func(k buyerKey, order int64) {
		s := r.shard(k)
		s.Lock()
		r.hold(s, k, held{order: order})
		s.Unlock()
	}) {
		r.forgetAll()
	}
}

// eachOrder calls f for each "<voucher id> <user id> <order id>" of rest;
// false when rest is not made of them.
func (r *Refusals) eachOrder(rest string, f func(buyerKey, int64)) bool {
	for rest != "" {
		var n [3]int64
		for i := range n {
			var field string
			field, rest, _ = strings.Cut(rest, " ")
			x, err := strconv.ParseInt(field, 10, 64)
			if err != nil {
				return false
			}
			n[i] = x
		}
		f(buyerKey{n[0], n[1]}, n[2])
	}
	return true
}

// announce queues an accepted purchase to announce, or drops it when the
// queue is full: the other instances then learn of it from Redis when its
// buyer's purchase reaches Redis there.
func (r *Refusals) announce(a accepted) {
	select {
	case r.out <- a:
		return
	default:
	}
	now := time.Now().UnixNano()
	last := r.lastDrop.Load()
	if now-last < int64(time.Second) || !r.lastDrop.CompareAndSwap(last, now) {
		return
	}
	r.log.Warn("announcement queue full; accepted purchases are not announced to the other instances", "queue", cap(r.out))
}

// announceLoop publishes the queued purchases until ctx is done: one
// PUBLISH per announceBatch, or per announceAfter after the first queued.
func (r *Refusals) announceLoop(ctx context.Context) {
	batch := make([]accepted, 0, announceBatch)
	buf := make([]byte, 0, 64*announceBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-r.out:
			batch = append(batch[:0], a)
		}
		t := time.NewTimer(announceAfter)
	fill:
		for len(batch) < announceBatch {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				break fill
			case a := <-r.out:
				batch = append(batch, a)
			}
		}
		t.Stop()
		buf = r.encodeAccepted(buf[:0], batch)
		r.events.publish(ctx, string(buf))
	}
}

// encodeAccepted appends the accepted event of batch, aged by its oldest
// purchase: the queue is in the order Redis answered, not the order the
// purchases were sent, so that is not always the first.
func (r *Refusals) encodeAccepted(b []byte, batch []accepted) []byte {
	oldest := batch[0].at
	for _, a := range batch[1:] {
		oldest = min(oldest, a.at)
	}
	age := max(r.clock()-oldest, 0) / int64(time.Microsecond)
	b = append(b, eventAccepted...)
	b = appendInts(b, age)
	for _, a := range batch {
		b = appendInts(b, a.voucher, a.user, a.order)
	}
	return b
}

// Run applies the events published on the events channel until ctx is
// done, and announces the purchases accepted here. It expires everything
// kept each time it (re)subscribes, since events may have been missed
// meanwhile, and after a failure it waits (doubling, up to 5s) before it
// reads again; the client then subscribes again.
func (r *Refusals) Run(ctx context.Context) error {
	actx, cancel := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() { defer close(announced); r.announceLoop(actx) }()
	defer func() { cancel(); <-announced }()

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
