// Package order turns accepted purchases into rows: the worker's handler
// that writes stream messages to the database, and the order status routes.
package order

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Order is a purchase written to the database, and where it is in its
// lifecycle (lifecycle.go).
type Order struct {
	ID         int64     `gorm:"primaryKey;autoIncrement:false"`
	UserID     int64     `gorm:"column:user_id"`
	VoucherID  int64     `gorm:"column:voucher_id"`
	AcceptedAt time.Time `gorm:"column:accepted_at"`
	CreatedAt  time.Time `gorm:"column:created_at"`
	Status     string    `gorm:"column:status"`
	// Live is 1 while the order holds a unit, nil once it gave it back.
	Live   *int  `gorm:"column:live"`
	Amount int64 `gorm:"column:amount"`
	// PayDeadline is nil when there is nothing to pay.
	PayDeadline  *time.Time `gorm:"column:pay_deadline"`
	PaidAt       *time.Time `gorm:"column:paid_at"`
	UsedAt       *time.Time `gorm:"column:used_at"`
	CancelledAt  *time.Time `gorm:"column:cancelled_at"`
	CancelReason *string    `gorm:"column:cancel_reason"`
	RefundedAt   *time.Time `gorm:"column:refunded_at"`
	// UnitBackAt is when Redis took back the unit of an ended order.
	UnitBackAt *time.Time `gorm:"column:unit_back_at"`
	// Code is the voucher code of an order paid (code.go); nil before,
	// and on orders paid before codes were given.
	Code *string `gorm:"column:code"`
}

// TableName is the table of sql/*/0001_init.sql.
func (Order) TableName() string { return "orders" }

// DeadLetter is a stream message that could not become an order.
type DeadLetter struct {
	ID        int64  `gorm:"primaryKey" json:"id"`
	Stream    string `gorm:"column:stream" json:"stream"`
	MessageID string `gorm:"column:message_id" json:"message_id"`
	// Order ids are strings in JSON, like everywhere in the API.
	OrderID   *int64    `gorm:"column:order_id" json:"order_id,string"`
	UserID    *int64    `gorm:"column:user_id" json:"user_id"`
	VoucherID *int64    `gorm:"column:voucher_id" json:"voucher_id"`
	Reason    string    `gorm:"column:reason" json:"reason"`
	Payload   string    `gorm:"column:payload" json:"payload"`
	CreatedAt time.Time `json:"created_at"`
	// ReplayedAt is set when an operator sent the order through again.
	ReplayedAt *time.Time `gorm:"column:replayed_at" json:"replayed_at"`
}

// TableName is the table of sql/*/0001_init.sql.
func (DeadLetter) TableName() string { return "dead_letters" }

// ErrNotFound means no order has the id.
var ErrNotFound = errors.New("order not found")

// Store reads orders and dead letters.
type Store struct {
	db *gorm.DB
}

// NewStore returns a Store on db; it does not own db.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Buyers maps each buyer of a voucher to their live order's id (cancelled
// and refunded orders gave their unit back); the voucher warmer loads it
// into Redis.
func (s *Store) Buyers(ctx context.Context, voucherID int64) (map[int64]int64, error) {
	var rows []Order
	if err := liveOrdersOf(s.db.WithContext(ctx), voucherID).Find(&rows).Error; err != nil {
		return nil, fmt.Errorf("list buyers of voucher %d: %w", voucherID, err)
	}
	out := make(map[int64]int64, len(rows))
	for _, o := range rows {
		out[o.UserID] = o.ID
	}
	return out, nil
}

// liveOrdersOf selects the id and buyer of a voucher's live orders, on the
// index on (voucher_id, accepted_at).
func liveOrdersOf(tx *gorm.DB, voucherID int64) *gorm.DB {
	return tx.Select("id", "user_id").Where("voucher_id = ? AND live = 1", voucherID)
}

// Reservations returns a voucher's buyers with a live order (user id ->
// order id) and the order ids that will never hold a unit: live dead
// letters, and orders that were written and gave their unit back since
// (one may still be in the pending index). What the voucher warmer needs
// to rebuild Redis.
func (s *Store) Reservations(ctx context.Context, voucherID int64) (map[int64]int64, map[int64]bool, error) {
	buyers, err := s.Buyers(ctx, voucherID)
	if err != nil {
		return nil, nil, err
	}
	var ids []int64
	if err := s.db.WithContext(ctx).Raw("SELECT order_id FROM dead_letters WHERE voucher_id = ? AND replayed_at IS NULL AND order_id IS NOT NULL", voucherID).Scan(&ids).Error; err != nil {
		return nil, nil, fmt.Errorf("dead letters of voucher %d: %w", voucherID, err)
	}
	var ended []int64
	if err := s.db.WithContext(ctx).Raw("SELECT id FROM orders WHERE voucher_id = ? AND live IS NULL", voucherID).Scan(&ended).Error; err != nil {
		return nil, nil, fmt.Errorf("ended orders of voucher %d: %w", voucherID, err)
	}
	ids = append(ids, ended...)
	dead := make(map[int64]bool, len(ids))
	for _, id := range ids {
		dead[id] = true
	}
	return buyers, dead, nil
}

// Get returns the order with the id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id int64) (Order, error) {
	var o Order
	err := s.db.WithContext(ctx).Where("id = ?", id).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, fmt.Errorf("get order %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Order{}, fmt.Errorf("get order %d: %w", id, err)
	}
	return o, nil
}

// DeadLetterOf returns the dead letter of an order id, or ErrNotFound.
func (s *Store) DeadLetterOf(ctx context.Context, orderID int64) (DeadLetter, error) {
	var d DeadLetter
	err := s.db.WithContext(ctx).Where("order_id = ?", orderID).Take(&d).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return DeadLetter{}, fmt.Errorf("dead letter of order %d: %w", orderID, ErrNotFound)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter of order %d: %w", orderID, err)
	}
	return d, nil
}

// ByUser returns a user's orders, newest first, at most limit, and the dead
// letters of their failed purchases.
func (s *Store) ByUser(ctx context.Context, userID int64, limit int) ([]Order, []DeadLetter, error) {
	var os []Order
	if err := newestOfBuyer(s.db.WithContext(ctx), userID, limit).Find(&os).Error; err != nil {
		return nil, nil, fmt.Errorf("orders of user %d: %w", userID, err)
	}
	var ds []DeadLetter
	if err := newestOfBuyer(s.db.WithContext(ctx), userID, limit).Find(&ds).Error; err != nil {
		return nil, nil, fmt.Errorf("failed orders of user %d: %w", userID, err)
	}
	return os, ds, nil
}

// newestOfBuyer selects a buyer's rows, newest first, at most limit: of
// the orders, on the unique key on (user_id, voucher_id, live); of the
// dead letters, which have no index on user_id, by a scan of them (they
// are few).
func newestOfBuyer(tx *gorm.DB, userID int64, limit int) *gorm.DB {
	return tx.Where("user_id = ?", userID).Order("id DESC").Limit(limit)
}

// NeedsRefund reports whether a payment of the order is waiting for its
// money to go back (it arrived after the order was cancelled, it paid the
// order a second time, or the order was refunded).
func (s *Store) NeedsRefund(ctx context.Context, orderID int64) (bool, error) {
	var n int64
	if err := s.db.WithContext(ctx).Raw("SELECT COUNT(*) FROM payments WHERE order_id = ? AND status = 'needs_refund'", orderID).Scan(&n).Error; err != nil {
		return false, fmt.Errorf("payments of order %d: %w", orderID, err)
	}
	return n > 0, nil
}
