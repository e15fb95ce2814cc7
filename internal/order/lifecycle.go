package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"seckill/internal/db"
	"seckill/internal/voucher"
	"seckill/lua"
)

// States of a written order. An order of a voucher with a price waits for
// payment; one with nothing to pay is written paid.
const (
	StatusAwaitingPayment = "awaiting_payment"
	StatusPaid            = "paid"
	StatusUsed            = "used"
	StatusCancelled       = "cancelled"
	StatusRefunded        = "refunded"
)

// States lists the written states, in the order of the lifecycle.
var States = []string{StatusAwaitingPayment, StatusPaid, StatusUsed, StatusCancelled, StatusRefunded}

// Why an order was cancelled.
const (
	CancelByBuyer = "buyer"
	CancelExpired = "expired"
)

// Action is a move of a written order from one state to another.
type Action uint8

// The actions, each one row of transitions.
const (
	Pay Action = iota
	Cancel
	Expire
	Redeem
	Refund
)

// transition is one guarded move: from one state only, to another, with
// the time it happened recorded in stamp.
type transition struct {
	name     string
	from, to string
	stamp    string
	// reason is the cancel_reason the move records.
	reason string
	// givesBack: the order gives its unit back. In the same transaction it
	// stops being live and the voucher's stock goes up by one; then the
	// unit goes back to the live sale in Redis (giveBack).
	givesBack bool
	// due: only once the order's pay deadline has passed.
	due bool
}

// transitions is the lifecycle, one row per action:
//
//	action  from              to         records       unit back  only when due
//	pay     awaiting_payment  paid       paid_at       -          -
//	cancel  awaiting_payment  cancelled  cancelled_at  yes        -        (reason buyer)
//	expire  awaiting_payment  cancelled  cancelled_at  yes        yes      (reason expired)
//	redeem  paid              used       used_at       -          -
//	refund  paid              refunded   refunded_at   yes        -
//
// An action on an order already in its target state (with the same
// reason) changes nothing and succeeds: every action is idempotent. From
// any other state it is refused (ErrWrongState).
var transitions = [...]transition{
	Pay:    {name: "pay", from: StatusAwaitingPayment, to: StatusPaid, stamp: "paid_at"},
	Cancel: {name: "cancel", from: StatusAwaitingPayment, to: StatusCancelled, stamp: "cancelled_at", reason: CancelByBuyer, givesBack: true},
	Expire: {name: "expire", from: StatusAwaitingPayment, to: StatusCancelled, stamp: "cancelled_at", reason: CancelExpired, givesBack: true, due: true},
	Redeem: {name: "redeem", from: StatusPaid, to: StatusUsed, stamp: "used_at"},
	Refund: {name: "refund", from: StatusPaid, to: StatusRefunded, stamp: "refunded_at", givesBack: true},
}

func (a Action) String() string { return transitions[a].name }

// live says whether an order in this state holds a unit.
func live(status string) bool {
	return status == StatusAwaitingPayment || status == StatusPaid || status == StatusUsed
}

var (
	// ErrWrongState means the order is not in the state the action starts
	// from (StateError says which it is in).
	ErrWrongState = errors.New("order is not in the state this needs")
	// ErrNotDue means the order's pay deadline has not passed.
	ErrNotDue = errors.New("order's pay deadline has not passed")
)

// StateError is ErrWrongState with the state the order is in.
type StateError struct {
	Action Action
	Status string
}

func (e *StateError) Error() string {
	return fmt.Sprintf("cannot %s an order that is %s", e.Action, e.Status)
}

func (e *StateError) Unwrap() error { return ErrWrongState }

// LifecycleObserver hears what the lifecycle does, for metrics.
type LifecycleObserver interface {
	// Moved: an order made this move now (not a repeat), named as
	// Action.String says.
	Moved(move string)
	// UnitBack: an expired order's unit is back on sale in Redis, late
	// after its pay deadline.
	UnitBack(late time.Duration)
	// RedisError and MySQLError: a call failed.
	RedisError(op string)
	MySQLError(op string)
}

type nopLifecycleObserver struct{}

func (nopLifecycleObserver) Moved(string)           {}
func (nopLifecycleObserver) UnitBack(time.Duration) {}
func (nopLifecycleObserver) RedisError(string)      {}
func (nopLifecycleObserver) MySQLError(string)      {}

// Lifecycle moves written orders between states: each move a guarded
// update in one transaction, and for a move that gives the unit back, the
// unit returned to the live sale in Redis after the commit.
type Lifecycle struct {
	db      *gorm.DB
	rdb     redis.UniversalClient
	keys    voucher.Keys
	events  *voucher.Events
	obs     LifecycleObserver
	log     *slog.Logger
	now     func() time.Time
	release *redis.Script
}

// LifecycleConfig is what a Lifecycle needs beside its clients.
type LifecycleConfig struct {
	// Events, when set, tells every instance's local refusals of a unit
	// given back.
	Events *voucher.Events
	// Observer hears the moves (metrics); nil hears nothing.
	Observer LifecycleObserver
	// Now is the clock, default time.Now.
	Now func() time.Time
}

// NewLifecycle returns a Lifecycle; it owns none of its clients.
func NewLifecycle(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, cfg LifecycleConfig, log *slog.Logger) *Lifecycle {
	l := &Lifecycle{db: db, rdb: rdb, keys: keys, events: cfg.Events, obs: cfg.Observer, log: log, now: cfg.Now, release: lua.Release()}
	if l.obs == nil {
		l.obs = nopLifecycleObserver{}
	}
	if l.now == nil {
		l.now = time.Now
	}
	return l
}

// Do makes the action on order id and returns the order as it is now, and
// whether this call moved it (with ErrWrongState or ErrNotDue, the order
// as it is). A move that gives the unit back returns it to Redis too; when
// Redis cannot take it now (down, or the shard being rebuilt), the order
// is moved all the same and the error says so (errors.Is(err,
// ErrUnitNotBack)): the sweeper gives the unit back later.
func (l *Lifecycle) Do(ctx context.Context, a Action, id int64) (Order, bool, error) {
	var (
		o     Order
		moved bool
		err   error
	)
	// A deadlock or lock wait timeout (a writer's batch meeting this
	// order's row) rolled everything back: try again, a few times.
	for attempt := 0; attempt < 3; attempt++ {
		err = l.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var err error
			o, moved, err = l.DoTx(tx, a, id)
			return err
		})
		if err == nil || !db.IsRetryable(err) {
			break
		}
	}
	if errors.Is(err, ErrWrongState) || errors.Is(err, ErrNotDue) {
		return o, false, err // the order as it is: what the caller decides by
	}
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			l.obs.MySQLError(transitions[a].name)
		}
		return Order{}, false, err
	}
	if moved {
		l.obs.Moved(a.String())
	}
	if transitions[a].givesBack && o.UnitBackAt == nil {
		if err := l.giveBack(ctx, &o); err != nil {
			return o, moved, err
		}
	}
	return o, moved, nil
}

// DoTx makes the action inside tx, a transaction of the caller's (a
// payment's): the order row is locked, its state checked, then the
// guarded update made, and for a move that gives the unit back the
// voucher's stock raised by one. It returns the order as it is after the
// move. The caller must give the unit back to Redis after the commit
// (Lifecycle.GiveBack) when the move gave one.
func (l *Lifecycle) DoTx(tx *gorm.DB, a Action, id int64) (Order, bool, error) {
	t := transitions[a]
	var o Order
	q := tx
	if tx.Dialector.Name() == "mysql" {
		q = tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	err := q.Where("id = ?", id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, ErrNotFound)
	}
	if err != nil {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, err)
	}
	if o.Status == t.to && (t.reason == "" || o.CancelReason != nil && *o.CancelReason == t.reason) {
		return o, false, nil // done before: a repeat changes nothing
	}
	if o.Status != t.from {
		return o, false, fmt.Errorf("%s order %d: %w", t.name, id, &StateError{Action: a, Status: o.Status})
	}
	now := l.now().UTC()
	if t.due && (o.PayDeadline == nil || o.PayDeadline.After(now)) {
		return o, false, fmt.Errorf("%s order %d: %w", t.name, id, ErrNotDue)
	}
	sets := map[string]any{"status": t.to, t.stamp: now}
	if t.reason != "" {
		sets["cancel_reason"] = t.reason
	}
	if t.givesBack {
		sets["live"] = nil
	}
	res := tx.Model(&Order{}).Where("id = ? AND status = ?", id, t.from).Updates(sets)
	if res.Error != nil {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, res.Error)
	}
	if res.RowsAffected != 1 {
		// The row is locked (or SQLite has one writer): only a broken
		// database lands here.
		return Order{}, false, fmt.Errorf("%s order %d: state changed under its lock", t.name, id)
	}
	if t.givesBack {
		up := tx.Exec("UPDATE vouchers SET stock = stock + 1, updated_at = ? WHERE id = ? AND stock < total_stock", now, o.VoucherID)
		if up.Error != nil {
			return Order{}, false, fmt.Errorf("return unit of order %d to voucher %d: %w", id, o.VoucherID, up.Error)
		}
		if up.RowsAffected != 1 {
			return Order{}, false, fmt.Errorf("return unit of order %d to voucher %d: stock already full", id, o.VoucherID)
		}
	}
	if err := tx.Where("id = ?", id).Take(&o).Error; err != nil {
		return Order{}, false, fmt.Errorf("read order %d after %s: %w", id, t.name, err)
	}
	return o, true, nil
}

// ErrUnitNotBack means an order gave its unit back in the database but
// Redis has not taken it yet; the sweeper tries again.
var ErrUnitNotBack = errors.New("unit not back on sale in redis yet")

// GiveBack returns an ended order's unit to the live sale in Redis, once:
// the script removes the buyer entry and adds the unit only while the
// entry still names this order. Then it records when (unit_back_at) and
// tells every instance's local refusals.
func (l *Lifecycle) GiveBack(ctx context.Context, o *Order) error {
	if o.Live != nil || o.UnitBackAt != nil {
		return nil
	}
	return l.giveBack(ctx, o)
}

func (l *Lifecycle) giveBack(ctx context.Context, o *Order) error {
	return l.giveBackAll(ctx, []*Order{o})
}

// giveBackAll returns the units of ended orders to the live sale in Redis,
// one script call each in one pipeline, then records in one statement when
// (unit_back_at) for those Redis took, and tells every instance. An order
// whose call failed, or whose shard is being rebuilt (a rebuild that read
// the database before the move may hold the unit: try again after it), is
// left for the sweeper, and the error says so.
func (l *Lifecycle) giveBackAll(ctx context.Context, orders []*Order) error {
	if len(orders) == 0 {
		return nil
	}
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(orders))
	for i, o := range orders {
		shard := l.keys.Shard(o.VoucherID)
		keys := []string{l.keys.Ready(shard), l.keys.State(o.VoucherID), l.keys.Buyers(o.VoucherID), l.keys.Pending(shard)}
		cmds[i] = l.release.Eval(ctx, pipe, keys, o.UserID, o.ID, "1")
	}
	_, _ = pipe.Exec(ctx) // each command's answer is read below
	var (
		back   []*Order
		ids    []int64
		failed error
	)
	now := l.now().UTC()
	for i, c := range cmds {
		n, err := c.Int()
		o := orders[i]
		switch {
		case err != nil:
			l.obs.RedisError("unit_back")
			failed = cmp.Or(failed, fmt.Errorf("give back unit of order %d: %w: %w", o.ID, ErrUnitNotBack, err))
		case n < 0:
			failed = cmp.Or(failed, fmt.Errorf("give back unit of order %d: %w: %w", o.ID, ErrUnitNotBack, errNotReady))
		default:
			// 0: not held any more (given back by another caller, or the
			// shard was rebuilt from the database without it).
			back = append(back, o)
			ids = append(ids, o.ID)
			if n == 1 {
				if o.Status == StatusCancelled && o.CancelReason != nil && *o.CancelReason == CancelExpired && o.PayDeadline != nil {
					l.obs.UnitBack(now.Sub(*o.PayDeadline))
				}
				l.events.GivenBack(ctx, o.VoucherID, o.UserID, o.ID)
			}
		}
	}
	if len(back) == 0 {
		return failed
	}
	if err := l.db.WithContext(ctx).Model(&Order{}).Where("id IN ? AND unit_back_at IS NULL", ids).Update("unit_back_at", now).Error; err != nil {
		// The units are on sale; the sweeper records it (a no-op give-back).
		l.obs.MySQLError("unit_back")
		return cmp.Or(failed, fmt.Errorf("record units of %d orders back: %w: %w", len(ids), ErrUnitNotBack, err))
	}
	for _, o := range back {
		o.UnitBackAt = &now
	}
	return failed
}

// ExpireAll is Do(Expire) for many orders in one transaction, the way a
// burst of deadlines falls due: the orders are locked in id order, those
// still awaiting payment past their deadline are cancelled (expired) by one
// statement, and each voucher's stock goes up by its count. Then their
// units, and those of any order of ids that ended before without its unit
// reaching Redis, go back to the live sale in one pipeline. It returns
// every order of ids the database holds, as it is now.
func (l *Lifecycle) ExpireAll(ctx context.Context, ids []int64) (map[int64]*Order, error) {
	t := transitions[Expire]
	var (
		rows  []Order
		moved int
		err   error
	)
	for attempt := 0; attempt < 3; attempt++ {
		err = l.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var err error
			rows, moved, err = l.expireTx(tx, ids)
			return err
		})
		if err == nil || !db.IsRetryable(err) {
			break
		}
	}
	if err != nil && len(ids) > 1 && !db.IsRetryable(err) && ctx.Err() == nil {
		// One order the batch cannot move (its voucher's stock edited by
		// hand, say) must not hold up the others: one at a time, each in
		// its own transaction.
		l.log.Warn("expiring a batch failed; expiring its orders one by one", "orders", len(ids), "err", err)
		return l.expireEach(ctx, ids)
	}
	if err != nil {
		l.obs.MySQLError(t.name)
		return nil, err
	}
	for range moved {
		l.obs.Moved(t.name)
	}
	out := make(map[int64]*Order, len(rows))
	var ended []*Order
	for i := range rows {
		o := &rows[i]
		out[o.ID] = o
		if o.Live == nil && o.UnitBackAt == nil {
			ended = append(ended, o)
		}
	}
	return out, l.giveBackAll(ctx, ended)
}

// expireEach is ExpireAll one order at a time: the orders that can be
// moved are, and the error names those that could not.
func (l *Lifecycle) expireEach(ctx context.Context, ids []int64) (map[int64]*Order, error) {
	out := make(map[int64]*Order, len(ids))
	var errs []error
	for _, id := range ids {
		o, _, err := l.Do(ctx, Expire, id)
		switch {
		case err == nil, errors.Is(err, ErrWrongState), errors.Is(err, ErrNotDue), errors.Is(err, ErrUnitNotBack):
			out[id] = &o
			if errors.Is(err, ErrUnitNotBack) {
				errs = append(errs, err)
			}
		case errors.Is(err, ErrNotFound):
		default:
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// expireTx is ExpireAll's transaction: the Expire row of transitions
// applied to every order of ids it fits. It returns the orders as they are
// after it, and how many it moved.
func (l *Lifecycle) expireTx(tx *gorm.DB, ids []int64) ([]Order, int, error) {
	t := transitions[Expire]
	var rows []Order
	q := tx
	if tx.Dialector.Name() == "mysql" {
		q = tx.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	if err := q.Where("id IN ?", ids).Order("id").Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("%s %d orders: %w", t.name, len(ids), err)
	}
	now := l.now().UTC()
	var due []int64
	perVoucher := map[int64]int{}
	for _, o := range rows {
		if o.Status == t.from && o.PayDeadline != nil && !o.PayDeadline.After(now) {
			due = append(due, o.ID)
			perVoucher[o.VoucherID]++
		}
	}
	if len(due) == 0 {
		return rows, 0, nil
	}
	res := tx.Model(&Order{}).Where("id IN ? AND status = ?", due, t.from).
		Updates(map[string]any{"status": t.to, t.stamp: now, "cancel_reason": t.reason, "live": nil})
	if res.Error != nil {
		return nil, 0, fmt.Errorf("%s %d orders: %w", t.name, len(due), res.Error)
	}
	if res.RowsAffected != int64(len(due)) {
		return nil, 0, fmt.Errorf("%s %d orders: %d changed under their locks", t.name, len(due), int64(len(due))-res.RowsAffected)
	}
	vids := make([]int64, 0, len(perVoucher))
	for id := range perVoucher {
		vids = append(vids, id)
	}
	slices.Sort(vids)
	for _, id := range vids {
		n := perVoucher[id]
		up := tx.Exec("UPDATE vouchers SET stock = stock + ?, updated_at = ? WHERE id = ? AND stock + ? <= total_stock", n, now, id, n)
		if up.Error != nil {
			return nil, 0, fmt.Errorf("return %d units to voucher %d: %w", n, id, up.Error)
		}
		if up.RowsAffected != 1 {
			return nil, 0, fmt.Errorf("return %d units to voucher %d: stock would pass its total", n, id)
		}
	}
	reason := t.reason
	for i := range rows {
		o := &rows[i]
		if o.Status == t.from && o.PayDeadline != nil && !o.PayDeadline.After(now) {
			o.Status, o.CancelledAt, o.CancelReason, o.Live = t.to, &now, &reason, nil
		}
	}
	return rows, len(due), nil
}
