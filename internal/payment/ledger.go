package payment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/order"
)

// ledger keeps the payments table, and moves orders to paid through the
// lifecycle in the same transaction as the payment.
type ledger struct {
	db   *gorm.DB
	life *order.Lifecycle
	now  func() time.Time
}

// stamp is now as the database keeps it (DATETIME(3)): what an answer
// shows is what a later read shows.
func (l *ledger) stamp() time.Time { return l.now().UTC().Truncate(time.Millisecond) }

// attempts bounds the tries of a transaction that hit a deadlock or a lock
// wait timeout (rolled back whole, tried again).
const attempts = 5

// inTx runs fn in a transaction, again after a deadlock or a lock wait
// timeout. fn must set what it reports afresh on each run.
func (l *ledger) inTx(ctx context.Context, fn func(tx *gorm.DB) error) error {
	for try := 1; ; try++ {
		err := l.db.WithContext(ctx).Transaction(fn)
		if err == nil || !db.IsRetryable(err) || try == attempts || ctx.Err() != nil {
			return err
		}
	}
}

// lockOrder locks the order's row for the transaction, as the lifecycle
// does.
func lockOrder(tx *gorm.DB, id int64) (order.Order, error) {
	o, err := order.LockOrder(tx, id)
	if err != nil {
		return o, fmt.Errorf("lock order %d: %w", id, err)
	}
	return o, nil
}

// open returns the order's open payment with this provider, creating it
// when there is none: one open payment per order, so paying twice before
// the gateway notified reuses it (the order's row lock makes two at once
// take turns). The order must await payment, within its deadline
// (order.StateError, ErrDeadlinePassed). created says whether the
// payment is new.
func (l *ledger) open(ctx context.Context, provider string, orderID int64) (p Payment, created bool, err error) {
	err = l.inTx(ctx, func(tx *gorm.DB) error {
		p, created = Payment{}, false
		o, err := lockOrder(tx, orderID)
		if err != nil {
			return err
		}
		now := l.stamp()
		if o.Status != order.StatusAwaitingPayment {
			return fmt.Errorf("pay order %d: %w", orderID, &order.StateError{Action: order.Pay, Status: o.Status})
		}
		if o.PayDeadline != nil && !now.Before(*o.PayDeadline) {
			return fmt.Errorf("pay order %d: %w", orderID, ErrDeadlinePassed)
		}
		err = tx.Where("order_id = ? AND provider = ? AND status = ?", orderID, provider, StatusCreated).Order("id").Take(&p).Error
		if err == nil {
			return nil
		}
		if !errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("open payment of order %d: %w", orderID, err)
		}
		ref, err := newReference()
		if err != nil {
			return err
		}
		p = Payment{OrderID: orderID, Provider: provider, Reference: ref, Amount: o.Amount, Status: StatusCreated, CreatedAt: now, UpdatedAt: now}
		if err := tx.Create(&p).Error; err != nil {
			return fmt.Errorf("create payment of order %d: %w", orderID, err)
		}
		created = true
		return nil
	})
	return p, created, err
}

// notice is money arriving for a payment: a gateway's notification, or
// the dev provider's success.
type notice struct {
	provider, id, reference string
	amount                  int64
}

// errDuplicate rolls back a notification seen before.
var errDuplicate = errors.New("notification seen before")

// settle records the notice and decides, in one transaction, what the
// money does (decisions): the order paid and the payment succeeded, or
// the payment needing a refund, or nothing when it was settled before. A
// notice whose id was seen before changes nothing (duplicate): the
// primary key of payment_notifications decides between two deliveries at
// once. It returns the verdict and the payment and order as they are
// after it.
func (l *ledger) settle(ctx context.Context, n notice) (verdict, Payment, order.Order, error) {
	var (
		v verdict
		p Payment
		o order.Order
	)
	err := l.inTx(ctx, func(tx *gorm.DB) error {
		v, p, o = 0, Payment{}, order.Order{}
		now := l.stamp()
		err := tx.Create(&notification{Provider: n.provider, NotificationID: n.id, Reference: n.reference, ReceivedAt: now}).Error
		if db.IsDuplicate(err) {
			return errDuplicate
		}
		if err != nil {
			return fmt.Errorf("record notification %s: %w", n.id, err)
		}
		err = order.Locking(tx).Where("provider = ? AND reference = ?", n.provider, n.reference).Take(&p).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("payment %s: %w", n.reference, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock payment %s: %w", n.reference, err)
		}
		if n.amount != p.Amount {
			return fmt.Errorf("payment %s: %w (%d, the payment %d)", n.reference, ErrAmountMismatch, n.amount, p.Amount)
		}
		if o, err = lockOrder(tx, p.OrderID); err != nil {
			return fmt.Errorf("payment %s: %w", n.reference, err)
		}
		var reason string
		v, reason = decide(p.Status, o.Status)
		return l.apply(tx, v, reason, &p, &o, now)
	})
	if errors.Is(err, errDuplicate) {
		return settled, Payment{}, order.Order{}, nil
	}
	return v, p, o, err
}

// apply makes a verdict's effects inside the transaction: pays moves the
// order to paid and the payment to succeeded; refunds records the money
// as owed (reason says why).
func (l *ledger) apply(tx *gorm.DB, v verdict, reason string, p *Payment, o *order.Order, now time.Time) error {
	switch v {
	case settled:
		return nil
	case pays:
		moved, ok, err := l.life.DoTx(tx, order.Pay, o.ID)
		if err != nil {
			return fmt.Errorf("payment %s: %w", p.Reference, err)
		}
		if !ok {
			return fmt.Errorf("payment %s: order %d was %s under its lock", p.Reference, o.ID, moved.Status)
		}
		*o = moved
		return succeed.do(tx, p, now, "")
	case refunds:
		return owe.do(tx, p, now, reason)
	}
	return fmt.Errorf("payment %s is %s, its order %d %s: no decision for this", p.Reference, p.Status, o.ID, o.Status)
}

// move is one guarded change of a payment's status, a row of the table in
// payment.go: the update names the status it moves from, so a payment
// that changed under its lock is caught, never overwritten.
type move struct {
	from, to string
	// stamps are the columns set to the time of the move.
	stamps []string
}

var (
	// succeed: the money came and paid its order.
	succeed = move{from: StatusCreated, to: StatusSucceeded, stamps: []string{"succeeded_at"}}
	// owe: the money came and its order cannot take it (late, duplicate).
	owe = move{from: StatusCreated, to: StatusNeedsRefund, stamps: []string{"succeeded_at", "refund_requested_at"}}
	// oweBack: an admin refunded the order the payment paid.
	oweBack = move{from: StatusSucceeded, to: StatusNeedsRefund, stamps: []string{"refund_requested_at"}}
	// returned: an admin gave the money back.
	returned = move{from: StatusNeedsRefund, to: StatusRefunded, stamps: []string{"refunded_at"}}
)

// do moves p inside tx at now, recording reason when there is one, and
// reads p back as it is after the move.
func (m move) do(tx *gorm.DB, p *Payment, now time.Time, reason string) error {
	sets := map[string]any{"status": m.to, "updated_at": now}
	for _, col := range m.stamps {
		sets[col] = now
	}
	if reason != "" {
		sets["refund_reason"] = reason
	}
	res := tx.Model(&Payment{}).Where("id = ? AND status = ?", p.ID, m.from).Updates(sets)
	if res.Error != nil {
		return fmt.Errorf("payment %d to %s: %w", p.ID, m.to, res.Error)
	}
	if res.RowsAffected != 1 {
		return fmt.Errorf("payment %d to %s: changed under its lock", p.ID, m.to)
	}
	if err := tx.Where("id = ?", p.ID).Take(p).Error; err != nil {
		return fmt.Errorf("read payment %d after it moved to %s: %w", p.ID, m.to, err)
	}
	return nil
}

// refund refunds order id (order.Refund) and, in the same transaction,
// moves the payment that paid it to needs_refund (order_refunded): the
// shop owes the buyer the money until an admin marks it returned. A
// repeat changes nothing; an order with nothing to pay has no payment and
// owes nothing. The unit goes back on sale after the commit (an error
// wrapping order.ErrUnitNotBack when Redis cannot take it now: the
// sweeper does it later). It returns the order as it is after the refund,
// whether this call moved it, and whether a payment of it is owed back.
func (l *ledger) refund(ctx context.Context, id int64) (o order.Order, moved, owed bool, err error) {
	err = l.inTx(ctx, func(tx *gorm.DB) error {
		o, moved, owed = order.Order{}, false, false
		// The payments first, then the order: the order settle locks
		// them in.
		var ps []Payment
		if err := order.Locking(tx).Where("order_id = ?", id).Order("id").Find(&ps).Error; err != nil {
			return fmt.Errorf("lock payments of order %d: %w", id, err)
		}
		var err error
		if o, moved, err = l.life.DoTx(tx, order.Refund, id); err != nil {
			return err
		}
		now := l.stamp()
		for i := range ps {
			if ps[i].Status == StatusSucceeded {
				if err := oweBack.do(tx, &ps[i], now, ReasonOrderRefunded); err != nil {
					return fmt.Errorf("refund order %d: %w", id, err)
				}
			}
			owed = owed || ps[i].Status == StatusNeedsRefund
		}
		return nil
	})
	if err != nil {
		return o, false, false, err
	}
	return o, moved, owed, l.life.GiveBack(ctx, &o)
}

// markRefunded records that an admin gave back the money of a payment
// needing a refund; a repeat changes nothing. From any other status it
// fails with a StateError.
func (l *ledger) markRefunded(ctx context.Context, id int64) (Payment, error) {
	var p Payment
	err := l.inTx(ctx, func(tx *gorm.DB) error {
		p = Payment{}
		err := order.Locking(tx).Where("id = ?", id).Take(&p).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("payment %d: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock payment %d: %w", id, err)
		}
		switch p.Status {
		case StatusRefunded:
			return nil
		case StatusNeedsRefund:
			return returned.do(tx, &p, l.stamp(), "")
		}
		return fmt.Errorf("mark payment %d refunded: %w", id, &StateError{Status: p.Status})
	})
	return p, err
}

// needingRefund lists the payments whose money must go back to the buyer
// (late, duplicate, or of a refunded order), the longest owed first.
func (l *ledger) needingRefund(ctx context.Context, limit int) ([]Payment, error) {
	var ps []Payment
	if err := l.db.WithContext(ctx).Where("status = ?", StatusNeedsRefund).Order("refund_requested_at, id").Limit(limit).Find(&ps).Error; err != nil {
		return nil, fmt.Errorf("payments needing a refund: %w", err)
	}
	return ps, nil
}

// get reads a payment by id.
func (l *ledger) get(ctx context.Context, id int64) (Payment, error) {
	var p Payment
	err := l.db.WithContext(ctx).Where("id = ?", id).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return p, fmt.Errorf("payment %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return p, fmt.Errorf("get payment %d: %w", id, err)
	}
	return p, nil
}

// Refunder refunds paid orders outside a request, as an admin's refund
// does (the order refunded and its unit back on sale, the payment that
// paid it owed back): package failover writes again a refund the database
// lost.
type Refunder struct{ l *ledger }

// NewRefunder returns a Refunder; it owns none of its arguments.
func NewRefunder(db *gorm.DB, life *order.Lifecycle) *Refunder {
	return &Refunder{l: &ledger{db: db, life: life, now: time.Now}}
}

// Refund refunds order id; moved is false when it was refunded already.
// An order in another state than paid is an order.StateError.
func (r *Refunder) Refund(ctx context.Context, id int64) (moved bool, err error) {
	_, moved, _, err = r.l.refund(ctx, id)
	return moved, err
}
