package order

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// deadLetter records why an item is not an order (recordDeadLetter says
// how, when a letter is there already). The caller's savepoint must have
// undone any write for the item. A dead letter is kept under its order id
// unless another buyer's order or dead letter has that id: then it is kept
// by its message alone.
func (w *Writer) deadLetter(tx *gorm.DB, it *item) error {
	payload, _ := json.Marshal(it.msg.Values)
	d := DeadLetter{
		Stream: it.msg.Stream, MessageID: it.msg.ID, Reason: it.v.reason, Payload: string(payload), CreatedAt: time.Now().UTC(),
	}
	if it.read != readUndecodable {
		o := it.ord
		d.OrderID, d.UserID, d.VoucherID = &o.OrderID, &o.UserID, &o.VoucherID
	}
	if err := w.recordDeadLetter(tx, it, &d); err != nil {
		return fmt.Errorf("dead-letter message %s: %w", it.msg.ID, err)
	}
	if it.v.effects().count != countLetter {
		return nil // an order after all, or recorded by another worker
	}
	level := slog.LevelWarn
	if it.v.reason == ReasonIDCollision {
		level = slog.LevelError // order ids were minted twice: a fault to look into
	}
	w.log.Log(context.Background(), level, "message dead-lettered", "message_id", it.msg.ID, "order_id", it.ord.OrderID, "reason", it.v.reason)
	return nil
}

// recordDeadLetter records d, unless a worker that took the message over
// wrote this very order meanwhile: then the item is that order (the
// locking read waits for that worker's commit; two inserts at once end in
// a deadlock, and the transaction tried again sees the other's).
func (w *Writer) recordDeadLetter(tx *gorm.DB, it *item, d *DeadLetter) error {
	const sp = "dead_letter"
	if err := tx.SavePoint(sp).Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	wrote, err := w.insertDeadLetter(tx, it, d)
	if err != nil || !wrote || it.read == readUndecodable {
		return err
	}
	if done, err := w.orderWritten(tx, it); err != nil || !done {
		return err
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	it.v = decide(it.read, found{holds: holdsOrder})
	return nil
}

// insertDeadLetter inserts d and reports whether it wrote a row. When a
// row holds its order id already, underOrderID says what follows; a
// letter kept by its message is inserted as such.
func (w *Writer) insertDeadLetter(tx *gorm.DB, it *item, d *DeadLetter) (bool, error) {
	if !it.idTaken && d.OrderID != nil {
		const sp = "dead_letter_insert"
		if err := tx.SavePoint(sp).Error; err != nil {
			return false, fmt.Errorf("savepoint: %w", err)
		}
		err := tx.Create(d).Error
		if err == nil || !db.IsDuplicate(err) {
			return err == nil, err
		}
		if err := tx.RollbackTo(sp).Error; err != nil {
			return false, fmt.Errorf("rollback to savepoint: %w", err)
		}
		if wrote, done, err := w.underOrderID(tx, it, d); done || err != nil {
			return wrote, err
		}
	}
	// Kept by its message. A replayed one is never revived: the stale copy
	// must find it as it was (byMessage), and a replay that fails again
	// gets a letter of its own.
	d.OrderID = nil
	err := tx.Create(d).Error
	if err == nil || !db.IsDuplicate(err) {
		return err == nil, err
	}
	return false, w.recordedByMessage(tx, it)
}

// letterOfOrderQuery reads the dead letter held under an order id, on the
// unique key on order_id.
const letterOfOrderQuery = "SELECT order_id AS id, user_id, voucher_id, reason, replayed_at IS NOT NULL AS replayed, stream, message_id FROM dead_letters WHERE order_id = ?"

// underOrderID handles a letter whose insert met a row under its order
// id, and reports whether it wrote d and whether it is done (not done: d
// is to be kept by its message). Another buyer's row leaves d to be kept
// by its message; this order's live letter (a concurrent worker recorded
// it meanwhile) stands, the item takes its reason and is not counted
// again; this order's replayed letter is live again when d is the
// replay's message failing again, and when d is the very message whose
// letter was replayed (a stale copy), the replay decides and d changes
// nothing.
func (w *Writer) underOrderID(tx *gorm.DB, it *item, d *DeadLetter) (wrote, done bool, err error) {
	var held []struct {
		ID, UserID, VoucherID int64
		Reason                string
		Replayed              bool
		Stream, MessageID     string
	}
	if err := tx.Raw(w.locking(letterOfOrderQuery),
		*d.OrderID).Scan(&held).Error; err != nil {
		return false, true, fmt.Errorf("find dead letter of order %d: %w", *d.OrderID, err)
	}
	if len(held) == 0 {
		return false, true, w.recordedByMessage(tx, it) // the message's key, not the order's
	}
	h := held[0]
	f := holdingOf(it, nil, &letterRow{orderOwner{h.ID, h.UserID, h.VoucherID}, h.Reason, h.Replayed, h.Stream, h.MessageID})
	switch f.holds {
	case holdsOthersLetter:
		it.idTaken = true
		return false, false, nil
	case holdsLetter, holdsReplayed:
		it.v = decide(it.read, f)
		return false, true, nil
	}
	err = tx.Model(&DeadLetter{}).Where("order_id = ?", *d.OrderID).Updates(map[string]any{
		"reason": d.Reason, "replayed_at": nil, "stream": d.Stream, "message_id": d.MessageID,
		"payload": d.Payload, "created_at": d.CreatedAt,
	}).Error
	if db.IsDuplicate(err) {
		return false, true, w.recordedByMessage(tx, it)
	}
	return err == nil, true, err
}

// recordedByMessage decides an item whose letter could not be inserted
// because its message has one already (a concurrent worker's).
func (w *Writer) recordedByMessage(tx *gorm.DB, it *item) error {
	f, ok, err := w.byMessage(tx, it)
	if err != nil {
		return err
	}
	if !ok {
		// The message's key holds another message's letter (stream ids
		// reused, or a worker that reads messages otherwise): nothing
		// more can be recorded for this one; it is not counted.
		w.log.Error("dead letter not recorded: its stream message id holds another message's letter",
			"message_id", it.msg.ID, "order_id", it.ord.OrderID, "reason", it.v.reason)
		f = found{holdsLetter, it.v.reason}
	}
	it.v = decide(it.read, f)
	return nil
}
