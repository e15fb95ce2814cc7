package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// ExpiryGroup is the consumer group of the expiry streams.
const ExpiryGroup = "expirers"

// Expiries holds every shard's pay deadlines: a delay queue per shard
// whose due members move onto the shard's expiry stream, which the
// expirers read. An order's deadline is in the shard of the bucket its
// unit was taken from (its voucher's shard for a voucher of one bucket),
// where its unit goes back: a master that is down holds up only the
// deadlines of its own buckets' orders.
type Expiries struct {
	rdb    redis.UniversalClient
	keys   voucher.Keys
	queues []*mq.DelayQueue
}

// NewExpiries returns the pay-deadline queues of every shard.
func NewExpiries(rdb redis.UniversalClient, keys voucher.Keys) *Expiries {
	e := &Expiries{rdb: rdb, keys: keys, queues: make([]*mq.DelayQueue, keys.Shards())}
	for shard := range e.queues {
		e.queues[shard] = mq.NewDelayQueue(rdb, expiryQueue(keys, shard), expiryStream(keys, shard))
	}
	return e
}

// Queue is one shard's delay queue of pay deadlines.
func (e *Expiries) Queue(shard int) *mq.DelayQueue { return e.queues[shard] }

// deadline is one order's pay deadline to schedule, in shard.
type deadline struct {
	order, user, voucher int64
	due                  time.Time
	shard                int
}

// deadlineOf is the deadline of an order of voucher v, bucket count nb,
// due then: in the shard of the buyer's home bucket, which its purchase
// took the unit from and its give-back returns it to.
func deadlineOf(keys voucher.Keys, order, user, v int64, nb int, due time.Time) deadline {
	return deadline{order, user, v, due, keys.BucketShard(v, voucher.Home(user, nb), nb)}
}

// member is the delay-queue member of an order's deadline: equal for one
// order, so scheduling again moves its time.
func (d deadline) member() string {
	return mq.Payload(map[string]string{
		"order_id": strconv.FormatInt(d.order, 10), "user_id": strconv.FormatInt(d.user, 10),
		"voucher_id": strconv.FormatInt(d.voucher, 10),
	})
}

// Due is the pay deadline Redis holds for an order of voucher v (bucket
// count nb): its queue's score, while the deadline has not fired; false
// when the queue holds none.
func (e *Expiries) Due(ctx context.Context, order, user, v int64, nb int) (time.Time, bool, error) {
	d := deadlineOf(e.keys, order, user, v, nb, time.Time{})
	ms, err := e.rdb.ZScore(ctx, e.queues[d.shard].Key(), d.member()).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read the pay deadline of order %d: %w", order, err)
	}
	return time.UnixMilli(int64(ms)).UTC(), true, nil
}

// schedule adds the deadlines to their shards' queues in one pipeline.
func (e *Expiries) schedule(ctx context.Context, ds []deadline) error {
	if len(ds) == 0 {
		return nil
	}
	pipe := e.rdb.Pipeline()
	for _, d := range ds {
		q := e.queues[d.shard]
		pipe.ZAdd(ctx, q.Key(), redis.Z{Score: float64(d.due.UnixMilli()), Member: d.member()})
	}
	_, err := pipe.Exec(ctx)
	// This instance's pollers sleep while idle: each is told when its
	// first deadline is due, whatever became of the writes.
	soonest := make(map[int]time.Time, 1)
	for _, d := range ds {
		if s, ok := soonest[d.shard]; !ok || d.due.Before(s) {
			soonest[d.shard] = d.due
		}
	}
	for shard, due := range soonest {
		e.queues[shard].Nudge(due)
	}
	if err != nil {
		return fmt.Errorf("schedule %d pay deadlines: %w", len(ds), err)
	}
	return nil
}

// scheduleWritten schedules the pay deadline of each order the batch
// inserted awaiting payment, and, due at once, of each it found written
// before (a redelivery: its first run may have stopped before
// scheduling); the expirer reads the real deadline and state from the
// database. Before the ack: after a crash the redelivery schedules again.
func (w *Writer) scheduleWritten(ctx context.Context, items []*item) error {
	if w.cfg.Expiries == nil {
		return nil
	}
	var ds []deadline
	now := time.Now()
	for _, it := range items {
		o := it.ord
		nb := max(o.Buckets, 1)
		switch {
		case it.v.fate == inserted && it.deadline != nil:
			ds = append(ds, deadlineOf(w.keys, o.OrderID, o.UserID, o.VoucherID, nb, *it.deadline))
		case it.v.fate == written:
			ds = append(ds, deadlineOf(w.keys, o.OrderID, o.UserID, o.VoucherID, nb, now))
		}
	}
	if err := w.cfg.Expiries.schedule(ctx, ds); err != nil {
		w.cfg.Observer.RedisError("schedule_expiry")
		return err
	}
	return nil
}

// Expirer is the expiry streams' handler: at an order's pay deadline it
// cancels the order if it is still unpaid, and its unit goes back on sale.
type Expirer struct {
	life *Lifecycle
	exp  *Expiries
	log  *slog.Logger
}

// NewExpirer returns the handler of the expiry streams.
func NewExpirer(life *Lifecycle, exp *Expiries, log *slog.Logger) *Expirer {
	return &Expirer{life: life, exp: exp, log: log}
}

// Handle expires the orders of the batch whose deadline passed, in one
// transaction (Lifecycle.ExpireAll). An order paid, used or refunded
// meanwhile is left as it is; one cancelled by its buyer has its unit
// given back if that did not happen yet; one whose deadline is still ahead
// (the deadline moved, or clocks differ) is scheduled again for it. An
// order that cannot be moved, or whose unit Redis does not take, is left
// to the sweeper (logged here, not scheduled again) and its expiry acked
// with the others. A
// failure of the whole batch to read or write leaves it pending: every
// step is idempotent.
func (e *Expirer) Handle(ctx context.Context, batch []mq.Message) ([]mq.Outcome, error) {
	outcomes := make([]mq.Outcome, len(batch))
	ids := make([]int64, 0, len(batch))
	for i, m := range batch {
		outcomes[i] = mq.Ack
		id, err := strconv.ParseInt(fmt.Sprint(m.Values["order_id"]), 10, 64)
		if err != nil {
			e.log.Warn("expiry without an order id dropped", "message_id", m.ID)
			continue
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return outcomes, nil
	}
	orders, err := e.life.ExpireAll(ctx, ids)
	left, isLeft := err.(*LeftError) // only this error says the others are done
	switch {
	case err != nil && !isLeft:
		return nil, err
	case err == nil:
		left = &LeftError{}
	}
	// The others are done: an order that could not be moved, or whose
	// unit Redis did not take, holds up only itself.
	for id, why := range left.Orders {
		e.log.Warn("expiry left to the sweeper", "order_id", id, "err", why)
	}
	if err := e.scheduleEarly(ctx, ids, orders, left); err != nil {
		return nil, err
	}
	return outcomes, nil
}

// scheduleEarly schedules again, at its deadline, each order of ids still
// awaiting payment: it was not due when the transaction looked (early, or
// clocks differ), and the poller hands it back at once if it has passed
// since. An order left to the sweeper is not: it would come straight back
// round the delay queue and fail again, for ever.
func (e *Expirer) scheduleEarly(ctx context.Context, ids []int64, orders map[int64]*Order, left *LeftError) error {
	var (
		early   []deadline
		waiting []*Order
	)
	for _, id := range ids {
		o, ok := orders[id]
		_, isLeft := left.Orders[id]
		switch {
		case isLeft:
		case !ok:
			e.log.Warn("expiry of an order not in the database dropped", "order_id", id)
		case o.Status == StatusAwaitingPayment && o.PayDeadline == nil:
			e.log.Warn("expiry of an order with no pay deadline dropped", "order_id", id)
		case o.Status == StatusAwaitingPayment:
			waiting = append(waiting, o)
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	layouts, err := e.life.layouts(ctx, waiting)
	if err != nil {
		return err
	}
	for _, o := range waiting {
		early = append(early, deadlineOf(e.exp.keys, o.ID, o.UserID, o.VoucherID, layouts[o.VoucherID], *o.PayDeadline))
	}
	return e.exp.schedule(ctx, early)
}

// SweeperConfig tunes a Sweeper.
type SweeperConfig struct {
	// Every is how often it looks, default 30s. An unpaid order is
	// expired by it once its deadline is Every past (the delay queue
	// normally did at the deadline).
	Every time.Duration
	// Batch bounds the orders taken per look and kind, default 200.
	Batch int
	// Observer hears the count of orders by state on each look.
	Observer StateObserver
	// Ready says whether a shard's Redis state can take units back now
	// (Lifecycle.ShardReady reads its ready marker): a look gives back the
	// units of ready shards only, so those of a shard being rebuilt, or
	// whose master is down, take no place in its page. Nil takes every
	// shard for ready (the release script then refuses in a shard not
	// ready, one call per order).
	Ready func(ctx context.Context, shard int) bool
}

// StateObserver hears how many orders are in each state, and how many
// payments wait for a refund.
type StateObserver interface {
	States(counts map[string]int64)
	RefundsOwed(n int64)
}

// Sweeper is the safety net behind the expiry queues, run by every worker:
// it expires unpaid orders well past their deadline (a deadline lost with
// Redis's data, or never scheduled), and gives back to Redis the units of
// ended orders that did not reach it (Redis was down or being rebuilt at
// the move, or the mover crashed). Both are idempotent, so instances may
// sweep at once.
//
// Overdue orders and units not back are each taken a page at a time in id
// order, each look resuming after the last order of the previous one, and
// starting again from the first once a page comes back short: orders that
// cannot be moved, or units that cannot go back yet, never hide the others
// for more than the looks it takes to page past them.
type Sweeper struct {
	db   *gorm.DB
	life *Lifecycle
	cfg  SweeperConfig
	log  *slog.Logger
	// overdue and notBack are where the next pages start.
	overdue, notBack cursor
}

// cursor is where a sweep's next page starts: after the order id it holds.
type cursor struct{ after atomic.Int64 }

// advance moves past a page of orders, ids in id order: the next look
// resumes after the last, or starts again from the first once a page came
// back short (the end was reached).
func (c *cursor) advance(ids []int64, batch int) {
	if len(ids) < batch {
		c.after.Store(0)
		return
	}
	c.after.Store(ids[len(ids)-1])
}

// NewSweeper returns a Sweeper.
func NewSweeper(db *gorm.DB, life *Lifecycle, cfg SweeperConfig, log *slog.Logger) *Sweeper {
	cfg.Every = cmp.Or(cfg.Every, 30*time.Second)
	cfg.Batch = cmp.Or(cfg.Batch, 200)
	return &Sweeper{db: db, life: life, cfg: cfg, log: log}
}

// Run sweeps every cfg.Every until ctx is done.
func (s *Sweeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("order sweep failed; trying again next round", "err", err)
		}
	}
}

// Sweep makes one round: overdue orders expired, a page of units given
// back, states counted. A step that fails does not stop the others.
func (s *Sweeper) Sweep(ctx context.Context) error {
	return errors.Join(s.expireOverdue(ctx), s.giveBackPage(ctx), s.count(ctx))
}

// overdueQuery pages the orders in a state with a deadline at or before a
// cutoff, by id after a cursor: the range of the index on (status,
// pay_deadline).
const overdueQuery = "SELECT id FROM orders WHERE status = ? AND pay_deadline <= ? AND id > ? ORDER BY id LIMIT ?"

// expireOverdue expires the next page of orders unpaid longer than a
// period past their deadline.
func (s *Sweeper) expireOverdue(ctx context.Context) error {
	var overdue []int64
	cutoff := db.Millis(s.life.now().Add(-s.cfg.Every)) // the index's range, not every unpaid order
	if err := s.db.WithContext(ctx).Raw(overdueQuery,
		StatusAwaitingPayment, cutoff, s.overdue.after.Load(), s.cfg.Batch).Scan(&overdue).Error; err != nil {
		return fmt.Errorf("find overdue orders: %w", err)
	}
	s.overdue.advance(overdue, s.cfg.Batch)
	if len(overdue) == 0 {
		return nil
	}
	_, err := s.life.ExpireAll(ctx, overdue)
	s.log.Info("overdue unpaid orders expired by the sweeper", "orders", len(overdue))
	return err
}

// giveBackPage gives back the units of the next page of ended orders
// whose unit did not reach Redis, in the shards ready now: an order's
// unit goes back to its buyer's home bucket, so a bucketed voucher's
// orders are sorted by that bucket's shard, not by the voucher's.
func (s *Sweeper) giveBackPage(ctx context.Context) error {
	q := unitsNotBack(s.db.WithContext(ctx), s.notBack.after.Load(), s.cfg.Batch)
	ready, ok := s.readyShards(ctx)
	if !ok {
		return nil
	}
	if ready != nil {
		cond, args := s.life.keys.InShards("voucher_id", ready)
		q = q.Where("("+cond+" OR voucher_id IN (SELECT id FROM vouchers WHERE buckets > 1))", args...)
	}
	var page []Order
	if err := q.Find(&page).Error; err != nil {
		return fmt.Errorf("find units not back: %w", err)
	}
	orders := make([]*Order, 0, len(page))
	ids := make([]int64, len(page))
	for i := range page {
		orders, ids[i] = append(orders, &page[i]), page[i].ID
	}
	s.notBack.advance(ids, s.cfg.Batch)
	if ready != nil && len(orders) > 0 {
		var err error
		if orders, err = s.homesReady(ctx, orders, ready); err != nil {
			return err
		}
	}
	return s.life.giveBackAll(ctx, orders)
}

// unitsNotBack selects a page of the ended orders whose unit Redis has
// not taken back, by id after a cursor: the range of the index on (live,
// unit_back_at) where both are NULL, which holds them in id order.
func unitsNotBack(tx *gorm.DB, after int64, limit int) *gorm.DB {
	return tx.Where("live IS NULL AND unit_back_at IS NULL AND id > ?", after).Order("id").Limit(limit)
}

// readyShards lists the shards ready now to take units back: nil when
// every shard is (or readiness is not asked), ok false when none is.
func (s *Sweeper) readyShards(ctx context.Context) (ready []int, ok bool) {
	if s.cfg.Ready == nil {
		return nil, true
	}
	n := s.life.keys.Shards()
	for shard := range n {
		if s.cfg.Ready(ctx, shard) {
			ready = append(ready, shard)
		}
	}
	switch len(ready) {
	case n:
		return nil, true
	case 0:
		s.log.Debug("no shard ready to take units back; none given back this round")
		return nil, false
	}
	s.log.Debug("units of shards not ready left for a later round", "ready_shards", ready)
	return ready, true
}

// homesReady keeps the orders whose unit goes back to a ready shard: the
// shard of the buyer's home bucket.
func (s *Sweeper) homesReady(ctx context.Context, orders []*Order, ready []int) ([]*Order, error) {
	layouts, err := s.life.layouts(ctx, orders)
	if err != nil {
		return nil, err
	}
	keep := orders[:0]
	for _, o := range orders {
		nb := layouts[o.VoucherID]
		if slices.Contains(ready, s.life.keys.BucketShard(o.VoucherID, voucher.Home(o.UserID, nb), nb)) {
			keep = append(keep, o)
		}
	}
	return keep, nil
}

// count tells the observer how many orders are in each state, and how
// many payments wait for a refund.
func (s *Sweeper) count(ctx context.Context) error {
	if s.cfg.Observer == nil {
		return nil
	}
	counts, err := CountStates(ctx, s.db)
	if err == nil {
		s.cfg.Observer.States(counts)
	}
	var owed int64
	if owedErr := s.db.WithContext(ctx).Raw("SELECT COUNT(*) FROM payments WHERE status = 'needs_refund'").Scan(&owed).Error; owedErr != nil {
		return errors.Join(err, fmt.Errorf("count payments needing a refund: %w", owedErr))
	}
	s.cfg.Observer.RefundsOwed(owed)
	return err
}

// CountStates tells how many written orders are in each state, from the
// order counters (counts.go): a read of a few rows per voucher, however
// many orders there are.
func CountStates(ctx context.Context, db *gorm.DB) (map[string]int64, error) {
	kept, err := readCounts(ctx, db, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(States))
	for _, st := range States {
		out[st] = 0
	}
	for k, t := range kept {
		out[k.Status] += t.N
	}
	return out, nil
}
