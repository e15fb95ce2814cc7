package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
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
	// issuesCode: the order gets its voucher code (code.go) in the move.
	issuesCode bool
}

// transitions is the lifecycle, one row per action:
//
//	action  from              to         records       unit back  only when due
//	pay     awaiting_payment  paid       paid_at, code -          -
//	cancel  awaiting_payment  cancelled  cancelled_at  yes        -        (reason buyer)
//	expire  awaiting_payment  cancelled  cancelled_at  yes        yes      (reason expired)
//	redeem  paid              used       used_at       -          -
//	refund  paid              refunded   refunded_at   yes        -
//
// An action on an order already in its target state (with the same
// reason) changes nothing and succeeds: every action is idempotent. From
// any other state it is refused (ErrWrongState).
var transitions = [...]transition{
	Pay:    {name: "pay", from: StatusAwaitingPayment, to: StatusPaid, stamp: "paid_at", issuesCode: true},
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
	db   *gorm.DB
	rdb  redis.UniversalClient
	keys voucher.Keys
	// buckets caches each voucher's bucket count (voucher id -> int).
	buckets sync.Map
	events  *voucher.Events
	obs     LifecycleObserver
	log     *slog.Logger
	now     func() time.Time
	release *redis.Script
	// verified holds moves back while it reports false (LifecycleConfig).
	verified func() bool
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
	// Verified, when set, holds every move back (ErrUnverified) while it
	// reports false: the database failed over and what it lost is not
	// written back yet (package failover). A payment or a cancellation
	// made on the new primary before that could meet an order whose end
	// it lost, and leave a unit counted twice.
	Verified func() bool
}

// ErrUnverified means the database's primary changed and is not checked
// yet: a move waits (seconds) and is answered unavailable meanwhile.
var ErrUnverified = errors.New("the database's new primary is not checked yet")

// NewLifecycle returns a Lifecycle; it owns none of its clients.
func NewLifecycle(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, cfg LifecycleConfig, log *slog.Logger) *Lifecycle {
	l := &Lifecycle{db: db, rdb: rdb, keys: keys, events: cfg.Events, obs: cfg.Observer, log: log, now: cfg.Now, release: lua.Release(), verified: cfg.Verified}
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
		// A missing order or a stock at its total is the data's state, not
		// a failed call: the caller logs it, and the sweeper meets it again.
		if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrStockFull) && !errors.Is(err, ErrUnverified) {
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

// check is what an action does to an order as it is, before the move.
type check uint8

const (
	checkMove   check = iota // in the action's from state, due if it must be: moved
	checkRepeat              // in its target state (with the same reason): nothing changes, no error
	checkWrong               // in another state: ErrWrongState
	checkNotDue              // its pay deadline has not passed: ErrNotDue
)

// judge is the one place an action's check of an order is made, from the
// order as it is and the time now:
//
//	order in the action's target state, same reason  -> repeat
//	order in another state than the action's from    -> wrong
//	due-only action, deadline missing or ahead       -> not due
//	otherwise                                        -> move
func (t transition) judge(o Order, now time.Time) check {
	switch {
	case o.Status == t.to && (t.reason == "" || o.CancelReason != nil && *o.CancelReason == t.reason):
		return checkRepeat
	case o.Status != t.from:
		return checkWrong
	case t.due && (o.PayDeadline == nil || o.PayDeadline.After(now)):
		return checkNotDue
	}
	return checkMove
}

// DoTx makes the action inside tx, a transaction of the caller's (a
// payment's): the order row is locked, its state checked, then the
// guarded update made, and for a move that gives the unit back the
// voucher's stock raised by one. It returns the order as it is after the
// move. The caller must give the unit back to Redis after the commit
// (Lifecycle.GiveBack) when the move gave one.
func (l *Lifecycle) DoTx(tx *gorm.DB, a Action, id int64) (Order, bool, error) {
	t := transitions[a]
	if l.verified != nil && !l.verified() {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, ErrUnverified)
	}
	o, err := LockOrder(tx, id)
	if err != nil {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, err)
	}
	now := l.now().UTC()
	switch t.judge(o, now) {
	case checkRepeat:
		return o, false, nil // done before: a repeat changes nothing
	case checkWrong:
		return o, false, fmt.Errorf("%s order %d: %w", t.name, id, &StateError{Action: a, Status: o.Status})
	case checkNotDue:
		return o, false, fmt.Errorf("%s order %d: %w", t.name, id, ErrNotDue)
	}
	if err := t.move(tx, []int64{id}, now); err != nil {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, err)
	}
	if t.givesBack {
		if err := returnUnits(tx, o.VoucherID, 1, now); err != nil {
			return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, err)
		}
	}
	moved := counts{}
	moved.moved(t, &o)
	if err := moved.save(tx, slotOf(id)); err != nil {
		return Order{}, false, fmt.Errorf("%s order %d: %w", t.name, id, err)
	}
	if err := tx.Where("id = ?", id).Take(&o).Error; err != nil {
		return Order{}, false, fmt.Errorf("read order %d after %s: %w", id, t.name, err)
	}
	return o, true, nil
}

// Locking makes q a locking read on MySQL: the rows it reads stay locked
// until the transaction ends. SQLite needs nothing: its transaction holds
// the one write lock already (it begins immediate).
func Locking(q *gorm.DB) *gorm.DB {
	if q.Dialector.Name() == "mysql" {
		return q.Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate})
	}
	return q
}

// LockOrder reads order id and locks its row for the transaction;
// ErrNotFound when there is none. The lifecycle and the payments lock an
// order this one way, before anything else of it.
func LockOrder(tx *gorm.DB, id int64) (Order, error) {
	var o Order
	err := Locking(tx).Where("id = ?", id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, ErrNotFound
	}
	return o, err
}

// move is the guarded update of the transition: the orders of ids, each
// still in the from state (their rows are locked), go to the target state
// with the time recorded, and stop being live when the move gives the unit
// back. Every one of them must change.
func (t transition) move(tx *gorm.DB, ids []int64, now time.Time) error {
	sets := map[string]any{"status": t.to, t.stamp: now}
	if t.reason != "" {
		sets["cancel_reason"] = t.reason
	}
	if t.givesBack {
		sets["live"] = nil
	}
	if !t.issuesCode {
		return t.update(tx, ids, sets)
	}
	// A code each: one order at a time.
	for _, id := range ids {
		err := withCode(tx, func(code string) error {
			sets["code"] = code
			return t.update(tx, []int64{id}, sets)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// update sets the orders of ids, each still in the from state.
func (t transition) update(tx *gorm.DB, ids []int64, sets map[string]any) error {
	res := tx.Model(&Order{}).Where("id IN ? AND status = ?", ids, t.from).Updates(sets)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected != int64(len(ids)) {
		// The rows are locked (or SQLite has one writer): only a broken
		// database lands here.
		return fmt.Errorf("%d of %d orders changed under their locks", int64(len(ids))-res.RowsAffected, len(ids))
	}
	return nil
}

// ErrStockFull means giving units back would lift a voucher's stock above
// its total: the stock was edited by hand, or a unit was given back twice.
// The move is refused; the order stays as it was.
var ErrStockFull = errors.New("stock would pass the voucher's total")

// returnUnits raises a voucher's stock by n units given back, never above
// its total (the schema's CHECK says so too, but MySQL before 8.0.16
// ignores it).
func returnUnits(tx *gorm.DB, voucherID int64, n int, now time.Time) error {
	up := tx.Exec("UPDATE vouchers SET stock = stock + ?, updated_at = ? WHERE id = ? AND stock + ? <= total_stock", n, now, voucherID, n)
	if up.Error != nil {
		return fmt.Errorf("return %d units to voucher %d: %w", n, voucherID, up.Error)
	}
	if up.RowsAffected != 1 {
		return fmt.Errorf("return %d units to voucher %d: %w", n, voucherID, ErrStockFull)
	}
	return nil
}

// ErrUnitNotBack means an order gave its unit back in the database but
// Redis has not taken it yet; the sweeper tries again.
var ErrUnitNotBack = errors.New("unit not back on sale in redis yet")

// LeftError lists the orders a batch left to the sweeper, each with why:
// it could not be moved (ErrStockFull), or Redis did not take its unit
// back (ErrUnitNotBack). The batch's other orders are done: one bad order
// holds up only itself.
type LeftError struct {
	Orders map[int64]error
}

func (e *LeftError) add(id int64, err error) {
	if e.Orders == nil {
		e.Orders = map[int64]error{}
	}
	e.Orders[id] = err
}

// err is e, or nil when no order was left.
func (e *LeftError) err() error {
	if len(e.Orders) == 0 {
		return nil
	}
	return e
}

func (e *LeftError) Error() string {
	errs := e.Unwrap()
	if len(errs) == 1 {
		return errs[0].Error()
	}
	return fmt.Sprintf("%d orders left to the sweeper: %v", len(errs), errors.Join(errs...))
}

// Unwrap returns the orders' errors, in id order.
func (e *LeftError) Unwrap() []error {
	errs := make([]error, 0, len(e.Orders))
	for _, id := range slices.Sorted(maps.Keys(e.Orders)) {
		errs = append(errs, e.Orders[id])
	}
	return errs
}

// GiveBack returns an ended order's unit to the live sale in Redis, once:
// the script removes the buyer entry and adds the unit only while the
// entry still names this order, and records how the order ended beside the
// voucher's buyers (voucher.EndedAt: if the database loses the end, Redis
// still knows it). Then it records when (unit_back_at) and tells every
// instance's local refusals.
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
// whose call failed, whose shard is being rebuilt (a rebuild that read the
// database before the move may hold the unit: try again after it), or
// whose voucher's keys cannot be read, is left for the sweeper: the error
// is a *LeftError naming it, and the others go on.
func (l *Lifecycle) giveBackAll(ctx context.Context, orders []*Order) error {
	if len(orders) == 0 {
		return nil
	}
	layouts, err := l.layouts(ctx, orders)
	if err != nil {
		var left LeftError
		for _, o := range orders {
			left.add(o.ID, fmt.Errorf("give back unit of order %d: %w: %w", o.ID, ErrUnitNotBack, err))
		}
		return left.err()
	}
	pipe := l.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(orders))
	for i, o := range orders {
		nb := layouts[o.VoucherID]
		shard := l.keys.BucketShard(o.VoucherID, voucher.Home(o.UserID, nb), nb)
		keys := append(releaseKeys(l.keys, shard, o.VoucherID), l.keys.EndedAt(shard, o.VoucherID))
		cmds[i] = l.release.Eval(ctx, pipe, keys, o.UserID, o.ID, "1", endedHow(o))
	}
	_, _ = pipe.Exec(ctx) // each command's answer is read below
	var (
		back []*Order
		left LeftError
	)
	now := l.now().UTC()
	for i, c := range cmds {
		o := orders[i]
		given, err := released(c)
		if err != nil {
			if !errors.Is(err, errNotReady) {
				l.obs.RedisError("unit_back")
			}
			left.add(o.ID, fmt.Errorf("give back unit of order %d: %w: %w", o.ID, ErrUnitNotBack, err))
			continue
		}
		// Not given now: not held any more (given back by another caller,
		// or the shard was rebuilt from the database without it).
		back = append(back, o)
		if given {
			l.tellBack(ctx, o, now)
		}
	}
	if err := l.recordBack(ctx, back, now); err != nil {
		for _, o := range back {
			left.add(o.ID, err)
		}
	}
	return left.err()
}

// endedHow is how an ended order ended, as Redis records it beside the
// voucher's buyers (voucher.EndedAt).
func endedHow(o *Order) string {
	switch {
	case o.Status == StatusRefunded:
		return voucher.EndedRefunded
	case o.CancelReason != nil && *o.CancelReason == CancelExpired:
		return voucher.EndedExpired
	default:
		return voucher.EndedCancelled
	}
}

// layouts returns the bucket count of the orders' vouchers: a unit goes
// back to the bucket its order was taken in, the buyer's home bucket. The
// count never changes, so each voucher's is read from the database once.
func (l *Lifecycle) layouts(ctx context.Context, orders []*Order) (map[int64]int, error) {
	out := make(map[int64]int, len(orders))
	var missing []int64
	for _, o := range orders {
		if nb, ok := l.buckets.Load(o.VoucherID); ok {
			out[o.VoucherID] = nb.(int)
		} else if _, ok := out[o.VoucherID]; !ok {
			out[o.VoucherID] = 1
			missing = append(missing, o.VoucherID)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	var rows []struct {
		ID      int64
		Buckets int
	}
	if err := l.db.WithContext(ctx).Raw("SELECT id, buckets FROM vouchers WHERE id IN ?", missing).Scan(&rows).Error; err != nil {
		l.obs.MySQLError("unit_back")
		return nil, fmt.Errorf("read the bucket count of %d vouchers: %w", len(missing), err)
	}
	for _, r := range rows {
		nb := max(r.Buckets, 1)
		out[r.ID] = nb
		l.buckets.Store(r.ID, nb)
	}
	return out, nil
}

// tellBack tells the observer and every instance of a unit Redis took back
// now.
func (l *Lifecycle) tellBack(ctx context.Context, o *Order, now time.Time) {
	if o.Status == StatusCancelled && o.CancelReason != nil && *o.CancelReason == CancelExpired && o.PayDeadline != nil {
		l.obs.UnitBack(now.Sub(*o.PayDeadline))
	}
	l.events.GivenBack(ctx, o.VoucherID, o.UserID, o.ID)
}

// recordBack records in one statement when Redis took the orders' units.
func (l *Lifecycle) recordBack(ctx context.Context, back []*Order, now time.Time) error {
	if len(back) == 0 {
		return nil
	}
	ids := make([]int64, len(back))
	for i, o := range back {
		ids[i] = o.ID
	}
	if err := l.db.WithContext(ctx).Model(&Order{}).Where("id IN ? AND unit_back_at IS NULL", ids).Update("unit_back_at", now).Error; err != nil {
		// The units are on sale; the sweeper records it (a no-op give-back).
		l.obs.MySQLError("unit_back")
		return fmt.Errorf("record units of %d orders back: %w: %w", len(ids), ErrUnitNotBack, err)
	}
	for _, o := range back {
		o.UnitBackAt = &now
	}
	return nil
}

// ShardReady reports whether a shard's Redis state is ready to take units
// back (its ready marker is there): the Sweeper's readiness.
func (l *Lifecycle) ShardReady(ctx context.Context, shard int) bool {
	n, err := l.rdb.Exists(ctx, l.keys.Ready(shard)).Result()
	return err == nil && n == 1
}

// ExpireAll is Do(Expire) for many orders in one transaction, the way a
// burst of deadlines falls due: the orders are locked in id order, those
// still awaiting payment past their deadline are cancelled (expired) by one
// statement, and each voucher's stock goes up by its count. Then their
// units, and those of any order of ids that ended before without its unit
// reaching Redis, go back to the live sale in one pipeline. It returns
// every order of ids the database holds, as it is now. An order that
// cannot be moved (its voucher's stock edited by hand) or whose unit Redis
// does not take holds up only itself: the others are done, and the error
// is a *LeftError naming it. Any other error is the whole batch's, and
// nothing is returned.
func (l *Lifecycle) ExpireAll(ctx context.Context, ids []int64) (map[int64]*Order, error) {
	t := transitions[Expire]
	if l.verified != nil && !l.verified() {
		return nil, fmt.Errorf("%s %d orders: %w", t.name, len(ids), ErrUnverified)
	}
	rows, moved, err := l.expireBatch(ctx, ids)
	if err != nil && ctx.Err() == nil && (errors.Is(err, ErrStockFull) || len(ids) > 1 && !db.IsRetryable(err)) {
		// One order the batch cannot move must not hold up the others: one
		// at a time, each in its own transaction.
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

// expireBatch runs expireTx, tried again after a deadlock or lock wait
// timeout (a writer's batch or a payment meeting these rows).
func (l *Lifecycle) expireBatch(ctx context.Context, ids []int64) (rows []Order, moved int, err error) {
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
	return rows, moved, err
}

// expireEach is ExpireAll one order at a time: the orders that can be
// moved are; one that cannot (ErrStockFull) or whose unit Redis did not
// take is left to the sweeper (a *LeftError). Any other failure is the
// batch's: the database is failing, and the batch is tried again.
func (l *Lifecycle) expireEach(ctx context.Context, ids []int64) (map[int64]*Order, error) {
	out := make(map[int64]*Order, len(ids))
	var (
		left LeftError
		errs []error
	)
	for _, id := range ids {
		o, _, err := l.Do(ctx, Expire, id)
		switch {
		case err == nil, errors.Is(err, ErrWrongState), errors.Is(err, ErrNotDue):
			out[id] = &o
		case errors.Is(err, ErrUnitNotBack):
			out[id] = &o
			left.add(id, err)
		case errors.Is(err, ErrStockFull):
			if o, err := NewStore(l.db).Get(ctx, id); err == nil {
				out[id] = &o
			}
			left.add(id, err)
		case errors.Is(err, ErrNotFound):
		default:
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		// Not a *LeftError: the whole batch is tried again.
		return nil, errors.Join(errs...)
	}
	return out, left.err()
}

// expireTx is ExpireAll's transaction: the Expire row of transitions
// applied to every order of ids it fits. It returns the orders as they are
// after it, and how many it moved.
func (l *Lifecycle) expireTx(tx *gorm.DB, ids []int64) ([]Order, int, error) {
	t := transitions[Expire]
	if l.verified != nil && !l.verified() {
		return nil, 0, fmt.Errorf("%s %d orders: %w", t.name, len(ids), ErrUnverified)
	}
	var rows []Order
	if err := Locking(tx).Where("id IN ?", ids).Order("id").Find(&rows).Error; err != nil {
		return nil, 0, fmt.Errorf("%s %d orders: %w", t.name, len(ids), err)
	}
	now := l.now().UTC()
	var due []*Order
	for i := range rows {
		if t.judge(rows[i], now) == checkMove {
			due = append(due, &rows[i])
		}
	}
	if len(due) == 0 {
		return rows, 0, nil
	}
	if err := t.moveAll(tx, due, now); err != nil {
		return nil, 0, fmt.Errorf("%s %d orders: %w", t.name, len(due), err)
	}
	reason := t.reason
	for _, o := range due {
		o.Status, o.CancelledAt, o.CancelReason, o.Live = t.to, &now, &reason, nil
	}
	return rows, len(due), nil
}

// moveAll makes a transition that gives the unit back on orders already
// judged to move (as they are before it), and gives back their units:
// each voucher's in one update, in voucher id order (so concurrent batches
// lock the vouchers in one order). Last, it counts the moves, in the slot
// of the first order.
func (t transition) moveAll(tx *gorm.DB, orders []*Order, now time.Time) error {
	ids := make([]int64, len(orders))
	perVoucher := map[int64]int{}
	moved := counts{}
	for i, o := range orders {
		ids[i] = o.ID
		perVoucher[o.VoucherID]++
		moved.moved(t, o)
	}
	if err := t.move(tx, ids, now); err != nil {
		return err
	}
	for _, v := range slices.Sorted(maps.Keys(perVoucher)) {
		if err := returnUnits(tx, v, perVoucher[v], now); err != nil {
			return err
		}
	}
	return moved.save(tx, slotOf(ids[0]))
}
