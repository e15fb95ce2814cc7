package order

import (
	"database/sql"
	"fmt"
	"strconv"

	"gorm.io/gorm"
)

// decideFromMySQL reads what MySQL holds for every item and decides each
// afresh (a transaction tried again starts from what Handle read, not
// from what the failed attempt found).
func (w *Writer) decideFromMySQL(tx *gorm.DB, items []*item) error {
	if err := w.loadHoldings(tx, items); err != nil {
		return err
	}
	return w.loadUndecodable(tx, items)
}

// letterRow is a dead letter as the writer reads it.
type letterRow struct {
	owner           orderOwner
	reason          string
	replayed        bool
	stream, message string
}

// loadHoldings reads the orders and dead letters under the decodable
// items' order ids (locking reads) and decides each item by what is
// there. An item whose order id another buyer holds is looked up by its
// message too (byMessage): its letter, if any, is kept there.
func (w *Writer) loadHoldings(tx *gorm.DB, items []*item) error {
	var ids []int64
	for _, it := range items {
		if it.read != readUndecodable {
			ids = append(ids, it.ord.OrderID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	orders, letters, ended, err := w.rowsOf(tx, ids)
	if err != nil {
		return err
	}
	for _, it := range items {
		if it.read == readUndecodable {
			continue
		}
		f := holdingOf(it, orders[it.ord.OrderID], letters[it.ord.OrderID])
		if f.holds == holdsOrder && ended[it.ord.OrderID] {
			f.holds = holdsEndedOrder
		}
		if f.idTaken() {
			mine, ok, err := w.byMessage(tx, it)
			if err != nil {
				return err
			}
			if ok {
				f = mine
			}
		}
		it.v, it.idTaken = decide(it.read, f), f.idTaken()
	}
	return nil
}

// rowsOf reads the orders and dead letters under these order ids, and
// which of the orders ended (gave their unit back). The reads go straight
// to the transaction's connection (queryRows): gorm's scan into structs
// was a tenth of the worker's time in the transaction.
func (w *Writer) rowsOf(tx *gorm.DB, ids []int64) (map[int64]*orderOwner, map[int64]*letterRow, map[int64]bool, error) {
	list := inList(ids)
	orders := make(map[int64]*orderOwner)
	ended := map[int64]bool{}
	err := queryRows(tx, w.locking("SELECT id, user_id, voucher_id, live IS NULL AS ended FROM orders WHERE id IN "+list), func(r *sql.Rows) error {
		var o orderOwner
		var isEnded bool
		if err := r.Scan(&o.ID, &o.UserID, &o.VoucherID, &isEnded); err != nil {
			return err
		}
		orders[o.ID] = &o
		if isEnded {
			ended[o.ID] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find written orders: %w", err)
	}
	letters := make(map[int64]*letterRow)
	err = queryRows(tx, w.locking("SELECT order_id, user_id, voucher_id, reason, replayed_at IS NOT NULL AS replayed, stream, message_id FROM dead_letters WHERE order_id IN "+list), func(r *sql.Rows) error {
		var user, voucherID sql.NullInt64 // NULL (an undecodable message's) reads as 0
		var l letterRow
		if err := r.Scan(&l.owner.ID, &user, &voucherID, &l.reason, &l.replayed, &l.stream, &l.message); err != nil {
			return err
		}
		l.owner.UserID, l.owner.VoucherID = user.Int64, voucherID.Int64
		letters[l.owner.ID] = &l
		return nil
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find dead letters: %w", err)
	}
	return orders, letters, ended, nil
}

// queryRows runs query, which has no arguments, on the transaction's
// connection and calls scan for each row.
func queryRows(tx *gorm.DB, query string, scan func(*sql.Rows) error) error {
	rows, err := tx.Statement.ConnPool.QueryContext(tx.Statement.Context, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// holdingOf says what the order and the dead letter under an item's order
// id (nil when none) hold for it. This buyer's order or live letter, or
// this message's replayed letter, decide it; another buyer's order is a
// collision; another buyer's letter leaves the id free for an order.
func holdingOf(it *item, order *orderOwner, letter *letterRow) found {
	mineOrder := order != nil && *order == it.owner()
	mineLetter := letter != nil && letter.owner == it.owner()
	switch {
	case mineOrder:
		return found{holds: holdsOrder}
	case mineLetter && !letter.replayed:
		return found{holdsLetter, letter.reason}
	case mineLetter && letter.stream == it.msg.Stream && letter.message == it.msg.ID:
		return found{holds: holdsReplayed}
	case order != nil:
		return found{holds: holdsOthersOrder}
	case letter != nil && !mineLetter:
		return found{holds: holdsOthersLetter}
	}
	return found{}
}

// letterOfMessageQuery reads the dead letter of a stream message, on the
// unique key on (stream, message_id).
const letterOfMessageQuery = "SELECT reason, replayed_at IS NOT NULL AS replayed, user_id, voucher_id FROM dead_letters WHERE stream = ? AND message_id = ?"

// byMessage looks for the dead letter of this very stream message (kept
// by its message: another buyer holds the order id) and reports what it
// holds: a live letter (given back again, a no-op) or a replayed one (the
// item is a stale copy).
func (w *Writer) byMessage(tx *gorm.DB, it *item) (found, bool, error) {
	var rows []struct {
		Reason            string
		Replayed          bool
		UserID, VoucherID *int64
	}
	if err := tx.Raw(w.locking(letterOfMessageQuery),
		it.msg.Stream, it.msg.ID).Scan(&rows).Error; err != nil {
		return found{}, false, fmt.Errorf("find dead letter of message %s: %w", it.msg.ID, err)
	}
	if len(rows) == 0 || rows[0].UserID == nil || rows[0].VoucherID == nil ||
		*rows[0].UserID != it.ord.UserID || *rows[0].VoucherID != it.ord.VoucherID {
		return found{}, false, nil // none, or another message's under the same id
	}
	if rows[0].Replayed {
		return found{holds: holdsReplayed}, true, nil
	}
	return found{holdsLetter, rows[0].Reason}, true, nil
}

// loadUndecodable decides the undecodable items: those whose message has
// a dead letter already are done.
func (w *Writer) loadUndecodable(tx *gorm.DB, items []*item) error {
	for _, it := range items {
		if it.read != readUndecodable {
			continue
		}
		var n int64
		if err := tx.Raw("SELECT COUNT(*) FROM dead_letters WHERE stream = ? AND message_id = ?", it.msg.Stream, it.msg.ID).Scan(&n).Error; err != nil {
			return fmt.Errorf("find dead letter: %w", err)
		}
		f := found{}
		if n > 0 {
			f.holds = holdsLetter
		}
		it.v = decide(it.read, f)
	}
	return nil
}

// orderOwner is an order id with the buyer and voucher it was accepted for.
type orderOwner struct {
	ID        int64
	UserID    int64
	VoucherID int64
}

func (it *item) owner() orderOwner {
	return orderOwner{ID: it.ord.OrderID, UserID: it.ord.UserID, VoucherID: it.ord.VoucherID}
}

// inList is ids as an SQL list, "(1,2,3)", written into the statement:
// a statement without arguments goes to MySQL as one query, where one
// with arguments is prepared, executed and closed (three calls, and the
// server parses hundreds of placeholders). ids are numbers, so nothing
// needs quoting. No ids is "(NULL)", which matches nothing.
func inList(ids []int64) string {
	if len(ids) == 0 {
		return "(NULL)"
	}
	b := make([]byte, 0, 2+len(ids)*20)
	b = append(b, '(')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(append(b, ')'))
}
