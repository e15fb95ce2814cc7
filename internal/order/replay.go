package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"seckill/internal/voucher"
)

// ErrNotReplayable means a dead letter holds no order to send again: its
// message did not decode, or its order id belongs to another order (its
// buyer got the reservation back and may simply buy again).
var ErrNotReplayable = errors.New("dead letter cannot be replayed")

// ErrInFlight means the dead letter's order still holds its reservation in
// Redis: its message is still being handled (a worker stopped between
// recording the letter and acknowledging it), and its redelivery decides;
// nothing was sent again.
var ErrInFlight = errors.New("dead letter's order is still in flight")

// DeadLetters lists dead letters and sends them through the pipeline again.
type DeadLetters struct {
	db       *gorm.DB
	reserver *voucher.Reserver
}

// NewDeadLetters returns the dead-letter operations.
func NewDeadLetters(db *gorm.DB, reserver *voucher.Reserver) *DeadLetters {
	return &DeadLetters{db: db, reserver: reserver}
}

// List returns up to limit dead letters, newest first, with ids below
// before (0 for the first page).
func (d *DeadLetters) List(ctx context.Context, limit int, before int64) ([]DeadLetter, error) {
	q := d.db.WithContext(ctx).Order("id DESC").Limit(limit)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var out []DeadLetter
	if err := q.Find(&out).Error; err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// Replay sends a dead-lettered order through the purchase script again
// with its own order id, so it is checked like any purchase (window,
// stock, buyer) and, when accepted, written by the worker. Marking the
// letter replayed and the purchase happen under the letter's row lock, in
// one transaction committed only once the purchase was accepted: the
// worker's locking reads of the letter wait for it, so a stale copy of the
// letter's message never sees a mark whose purchase is not done. A crash
// between the purchase and the commit leaves the letter live and the
// replay's message in the stream: that message ends as the same letter
// again, and the letter can be replayed again. Replaying a replayed letter
// is safe: the same order id never reserves twice.
func (d *DeadLetters) Replay(ctx context.Context, id int64) (DeadLetter, error) {
	var dl DeadLetter
	err := d.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		q := tx
		if tx.Dialector.Name() == "mysql" {
			q = q.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		err := q.Where("id = ?", id).Take(&dl).Error
		if errors.Is(err, gorm.ErrRecordNotFound) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("dead letter %d: %w", id, err)
		}
		orderID := orderOf(dl)
		if orderID == 0 || dl.Reason == ReasonIDCollision {
			return fmt.Errorf("dead letter %d: %w", id, ErrNotReplayable)
		}
		now := time.Now().UTC()
		if err := tx.Model(&DeadLetter{}).Where("id = ?", id).Update("replayed_at", now).Error; err != nil {
			return fmt.Errorf("mark dead letter %d replayed: %w", id, err)
		}
		res, err := d.reserver.Reserve(ctx, *dl.VoucherID, *dl.UserID, orderID)
		if err == nil && res.Replayed && dl.ReplayedAt == nil {
			// Nothing was sent: the buyer still holds this very order, from
			// its first message, whose redelivery decides. (Replayed
			// before, it is that replay's message: the same answer as then.)
			err = ErrInFlight
		}
		if err != nil {
			// Refused (sold out, ended, ...), in flight, or Redis failed:
			// the dead letter stands as it was.
			return fmt.Errorf("replay dead letter %d: %w", id, err)
		}
		dl.ReplayedAt = &now
		return nil
	})
	return dl, err
}

// orderOf is the order id of a dead letter's order, 0 when it holds none.
// A dead letter kept by its message alone (another buyer's dead letter has
// the id) has it only in its payload, the stream message it was.
func orderOf(dl DeadLetter) int64 {
	if dl.UserID == nil || dl.VoucherID == nil {
		return 0
	}
	if dl.OrderID != nil {
		return *dl.OrderID
	}
	var values map[string]any
	if json.Unmarshal([]byte(dl.Payload), &values) != nil {
		return 0
	}
	m, err := voucher.Decode(values)
	if err != nil || m.UserID != *dl.UserID || m.VoucherID != *dl.VoucherID {
		return 0
	}
	return m.OrderID
}
