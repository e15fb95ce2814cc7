package order

import (
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/voucher"
)

// write decides every item from what MySQL holds and records it as an
// order or a dead letter. Items already written or dead-lettered (a
// redelivery) change nothing.
func (w *Writer) write(tx *gorm.DB, items []*item) error {
	// Checked on the transaction's own connection, once it is made: a
	// connection to a new primary unverifies the pool as it is made. The
	// next server may keep no binary log: its GTIDs are asked anew.
	if w.cfg.Verified != nil {
		checked := -1 // a batch's items are mostly of one shard
		for _, it := range items {
			if shard := shardOf(w.keys, it.ord); shard != checked {
				if !w.cfg.Verified(shard) {
					w.gtids.Store(gtidsUnknown)
					return errUnverified
				}
				checked = shard
			}
		}
	}
	if err := w.decideFromMySQL(tx, items); err != nil {
		return err
	}
	if err := w.recordLetters(tx, items); err != nil {
		return err
	}
	var orders []*item
	for _, it := range items {
		if it.v.effects().record == recordOrder {
			orders = append(orders, it)
		}
	}
	return w.recordOrders(tx, orders)
}

// recordLetters records the dead letters the items were decided to get:
// those of decodable messages first, then of undecodable ones.
func (w *Writer) recordLetters(tx *gorm.DB, items []*item) error {
	for _, f := range []fate{lettered, poisoned} {
		for _, it := range items {
			if it.v.fate != f {
				continue
			}
			if err := w.deadLetter(tx, it); err != nil {
				return err
			}
		}
	}
	return nil
}

// recordOrders inserts the orders in bulk (insertAll) and, when any guard
// trips (a duplicate, a stock guard), rolls them back and goes the careful
// way, one savepoint each (insertOrLetter). Last, it adds the orders it
// wrote to the order counters (counts.go).
func (w *Writer) recordOrders(tx *gorm.DB, orders []*item) error {
	if len(orders) == 0 {
		return nil
	}
	if err := tx.SavePoint("fast").Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	written := counts{}
	ok, err := w.insertAll(tx, orders, written)
	if err != nil {
		return err
	}
	if ok {
		return written.save(tx, writerSlot)
	}
	if err := tx.RollbackTo("fast").Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	return w.recordEach(tx, orders)
}

// recordEach writes the items the careful way, one savepoint each
// (insertOrLetter), and adds the orders it wrote to the order counters.
func (w *Writer) recordEach(tx *gorm.DB, items []*item) error {
	written := counts{}
	for i, it := range items {
		if err := w.insertOrLetter(tx, it, "m"+strconv.Itoa(i), written); err != nil {
			return err
		}
	}
	return written.save(tx, writerSlot)
}

// insertAll decrements each voucher's stock by its count in the batch, in voucher
// id order so concurrent batches lock rows in one order, then inserts every
// order in one statement, counted in written. It reports false, with no
// error, when a guard tripped and the batch must go the careful way (then
// written is unchanged).
func (w *Writer) insertAll(tx *gorm.DB, items []*item, written counts) (bool, error) {
	perVoucher := map[int64]int{}
	for _, it := range items {
		perVoucher[it.ord.VoucherID]++
	}
	vids := make([]int64, 0, len(perVoucher))
	for id := range perVoucher {
		vids = append(vids, id)
	}
	slices.Sort(vids)
	now := time.Now().UTC()
	prices, err := w.prices(tx, vids)
	if err != nil {
		return false, err
	}
	for _, id := range vids {
		n := perVoucher[id]
		res := tx.Exec("UPDATE vouchers SET stock = stock - ?, updated_at = ? WHERE id = ? AND stock >= ?", n, now, id, n)
		if res.Error != nil {
			return false, fmt.Errorf("take stock of voucher %d: %w", id, res.Error)
		}
		if res.RowsAffected != 1 {
			return false, nil
		}
	}
	rows := make([]Order, len(items))
	for i, it := range items {
		rows[i] = w.newOrder(it, prices[it.ord.VoucherID], now)
	}
	err = w.insertOrders(tx, rows)
	if db.IsDuplicate(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert %d orders: %w", len(rows), err)
	}
	// A worker that took one of these messages over may have dead-lettered
	// it meanwhile: then the careful way decides each.
	if found, err := w.anyLiveLetter(tx, items); err != nil || found {
		return false, err
	}
	for i := range rows {
		written.added(&rows[i])
	}
	return true, nil
}

// anyLiveLetter reports whether one of the items has a live dead letter,
// under its order id or its message (locking reads, as in liveLetter): a
// query for the batch on the order ids, and one on the message ids of the
// items whose order id another buyer holds (only those get letters kept
// by their message; usually none).
func (w *Writer) anyLiveLetter(tx *gorm.DB, items []*item) (bool, error) {
	ids := make([]int64, len(items))
	byStream := map[string][]string{}
	for i, it := range items {
		ids[i] = it.ord.OrderID
		if it.idTaken {
			byStream[it.msg.Stream] = append(byStream[it.msg.Stream], it.msg.ID)
		}
	}
	var keyed []orderOwner
	err := queryRows(tx, w.locking("SELECT order_id, user_id, voucher_id FROM dead_letters WHERE order_id IN "+inList(ids)+" AND replayed_at IS NULL"), func(r *sql.Rows) error {
		var user, voucherID sql.NullInt64 // NULL (an undecodable message's) reads as 0
		var k orderOwner
		if err := r.Scan(&k.ID, &user, &voucherID); err != nil {
			return err
		}
		k.UserID, k.VoucherID = user.Int64, voucherID.Int64
		keyed = append(keyed, k)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("find dead letters of orders: %w", err)
	}
	for _, k := range keyed {
		for _, it := range items {
			if k == it.owner() {
				return true, nil
			}
		}
	}
	for stream, msgs := range byStream {
		var n int64
		if err := tx.Raw(w.locking("SELECT COUNT(*) FROM dead_letters WHERE stream = ? AND message_id IN ? AND replayed_at IS NULL"), stream, msgs).
			Scan(&n).Error; err != nil {
			return false, fmt.Errorf("find dead letters of messages: %w", err)
		}
		if n > 0 {
			return true, nil
		}
	}
	return false, nil
}

// liveLetter returns the reason of this item's live dead letter, under its
// order id or its message, or "" when it has none. A letter is found when
// committed, or waited for (a locking read) while another worker is
// recording it.
func (w *Writer) liveLetter(tx *gorm.DB, it *item) (string, error) {
	var reasons []string
	if err := tx.Raw(w.locking("SELECT reason FROM dead_letters WHERE (order_id = ? OR (stream = ? AND message_id = ?)) AND user_id = ? AND voucher_id = ? AND replayed_at IS NULL"),
		it.ord.OrderID, it.msg.Stream, it.msg.ID, it.ord.UserID, it.ord.VoucherID).Scan(&reasons).Error; err != nil {
		return "", fmt.Errorf("find dead letter of order %d: %w", it.ord.OrderID, err)
	}
	if len(reasons) == 0 {
		return "", nil
	}
	return reasons[0], nil
}

// insertOrLetter writes a single item under its own savepoint: the
// order (counted in written), or the dead letter that says why it cannot
// be one.
func (w *Writer) insertOrLetter(tx *gorm.DB, it *item, sp string, written counts) error {
	if err := tx.SavePoint(sp).Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	now := time.Now().UTC()
	refused, err := w.takeUnit(tx, it, now)
	if err != nil {
		return err
	}
	if refused.holds != holdsNothing {
		// (The last unit may have gone to this very order, written by a
		// worker that took the message over: recordDeadLetter finds it.)
		it.v = decide(it.read, refused)
		return w.deadLetter(tx, it)
	}
	o := it.ord
	prices, err := w.prices(tx, []int64{o.VoucherID})
	if err != nil {
		return err
	}
	row := w.newOrder(it, prices[o.VoucherID], now)
	err = w.create(tx, &row)
	if err == nil {
		kept, err := w.insertedOrLettered(tx, it, sp)
		if kept {
			written.added(&row)
		}
		return err
	}
	if !db.IsDuplicate(err) {
		return fmt.Errorf("insert order %d: %w", o.OrderID, err)
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	return w.duplicateOrder(tx, it)
}

// takeUnit takes one unit of the item's voucher, or says why the stock
// guard refused (holdsNoStock, holdsNoVoucher).
func (w *Writer) takeUnit(tx *gorm.DB, it *item, now time.Time) (found, error) {
	id := it.ord.VoucherID
	res := tx.Exec("UPDATE vouchers SET stock = stock - 1, updated_at = ? WHERE id = ? AND stock > 0", now, id)
	if res.Error != nil {
		return found{}, fmt.Errorf("take stock of voucher %d: %w", id, res.Error)
	}
	if res.RowsAffected == 1 {
		return found{}, nil
	}
	var n int64
	if err := tx.Raw("SELECT COUNT(*) FROM vouchers WHERE id = ?", id).Scan(&n).Error; err != nil {
		return found{}, fmt.Errorf("find voucher %d: %w", id, err)
	}
	if n == 0 {
		return found{holds: holdsNoVoucher}, nil
	}
	return found{holds: holdsNoStock}, nil
}

// insertedOrLettered follows an order inserted under savepoint sp: a
// worker that took the message over may have dead-lettered it meanwhile,
// and then that letter is what it is. It reports whether the order is
// kept.
func (w *Writer) insertedOrLettered(tx *gorm.DB, it *item, sp string) (bool, error) {
	letter, err := w.liveLetter(tx, it)
	if err != nil || letter == "" {
		return err == nil, err
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return false, fmt.Errorf("rollback to savepoint: %w", err)
	}
	it.v = decide(it.read, found{holdsLetter, letter})
	return false, nil
}

// orderOfIDQuery reads who owns an order id, and whether the order ended,
// through the primary key.
const orderOfIDQuery = "SELECT id, user_id, voucher_id, live IS NULL AS ended FROM orders WHERE id = ?"

// duplicateOrder decides an item whose insert met a duplicate key: its
// order written by a concurrent batch (done, counted there), another
// buyer's order on the id (a collision), or the buyer's other order of
// the voucher.
func (w *Writer) duplicateOrder(tx *gorm.DB, it *item) error {
	var rows []struct {
		ID, UserID, VoucherID int64
		Ended                 bool
	}
	if err := tx.Raw(w.locking(orderOfIDQuery), it.ord.OrderID).Scan(&rows).Error; err != nil {
		return fmt.Errorf("find order %d: %w", it.ord.OrderID, err)
	}
	f := found{holds: holdsBuyersOrder}
	if len(rows) == 1 {
		r := rows[0]
		f = holdingOf(it, &orderOwner{r.ID, r.UserID, r.VoucherID}, nil) // this buyer's order, or another's
		if f.holds == holdsOrder && r.Ended {
			f.holds = holdsEndedOrder // written by another worker, and ended since
		}
	}
	it.v = decide(it.read, f)
	if it.v.fate == written || it.v.fate == ended {
		return nil
	}
	it.idTaken = it.idTaken || f.idTaken()
	return w.deadLetter(tx, it)
}

// orderWritten reports whether this item's order is in the table, written
// by a concurrent batch (then it is done, and counted there).
func (w *Writer) orderWritten(tx *gorm.DB, it *item) (bool, error) {
	var rows []orderOwner
	if err := tx.Raw(w.locking("SELECT id, user_id, voucher_id FROM orders WHERE id = ?"), it.ord.OrderID).Scan(&rows).Error; err != nil {
		return false, fmt.Errorf("find order %d: %w", it.ord.OrderID, err)
	}
	return len(rows) == 1 && rows[0] == it.owner(), nil
}

// prices reads the price of each voucher.
func (w *Writer) prices(tx *gorm.DB, vids []int64) (map[int64]int64, error) {
	out := make(map[int64]int64, len(vids))
	err := queryRows(tx, "SELECT id, price FROM vouchers WHERE id IN "+inList(vids), func(r *sql.Rows) error {
		var id, price int64
		if err := r.Scan(&id, &price); err != nil {
			return err
		}
		out[id] = price
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read prices of %d vouchers: %w", len(vids), err)
	}
	return out, nil
}

// newOrder is the row of an item's order written now: awaiting payment
// until a deadline when its voucher has a price, paid at once when it has
// none.
func (w *Writer) newOrder(it *item, price int64, now time.Time) Order {
	one := 1
	o := Order{
		ID: it.ord.OrderID, UserID: it.ord.UserID, VoucherID: it.ord.VoucherID, AcceptedAt: it.ord.AcceptedAt, CreatedAt: now,
		Status: StatusPaid, Live: &one, Amount: price, PaidAt: &now,
	}
	it.deadline = nil
	if price > 0 {
		d := w.deadlineOf(it.ord, now)
		o.Status, o.PaidAt, o.PayDeadline = StatusAwaitingPayment, nil, &d
		it.deadline = &d
		return o
	}
	code := newCode()
	o.Code = &code
	return o
}

// deadlineOf is the pay deadline of an order written now: the pay window
// from now. A healed order keeps the deadline it had when first written
// (as Redis still holds it), or else gets the window from its acceptance:
// the buyer had that long from the first writing, a few milliseconds
// later.
func (w *Writer) deadlineOf(m voucher.Message, now time.Time) time.Time {
	switch {
	case !m.Healed:
		return now.Add(w.cfg.PayWindow)
	case !m.Due.IsZero():
		return m.Due
	default:
		return m.AcceptedAt.Add(w.cfg.PayWindow)
	}
}

// create inserts one order; a paid one's code that another order holds
// (the bulk insert met it, or this insert) is drawn again (withCode). A
// duplicate of another key is the answer.
func (w *Writer) create(tx *gorm.DB, row *Order) error {
	if row.Code == nil {
		return tx.Create(row).Error
	}
	return withCode(tx, func(code string) error {
		row.Code = &code
		return tx.Create(row).Error
	})
}

// orderColumns are the columns a new order sets (newOrder); the others
// start NULL.
const orderColumns = "INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live, amount, pay_deadline, paid_at, code) VALUES "

// insertRows bounds one insert: 300 rows are 3,300 placeholders, under
// SQLite's limit of 32,766 variables.
const insertRows = 300

// insertOrders inserts new orders in multi-row statements of insertRows,
// straight on the transaction's connection: what gorm's CreateInBatches
// wrote, without its reflection and callbacks (a fifth of the worker's
// CPU per order). A duplicate key fails the statement, as it did.
func (w *Writer) insertOrders(tx *gorm.DB, rows []Order) error {
	ctx := tx.Statement.Context
	args := make([]any, 0, 11*min(len(rows), insertRows))
	// The rows of a batch share their creation time, and mostly their
	// voucher, status, amount, deadline and payment time: each such value
	// is boxed once, not once a row.
	var (
		vid, amount             reused[int64]
		created, deadline, paid reused[time.Time]
		status                  reused[string]
	)
	for len(rows) > 0 {
		n := min(len(rows), insertRows)
		args = args[:0]
		for i := range rows[:n] {
			o := &rows[i]
			args = append(args, o.ID, o.UserID, vid.box(o.VoucherID), o.AcceptedAt, created.box(o.CreatedAt), status.box(o.Status),
				nullInt(o.Live), amount.box(o.Amount), deadline.boxSet(o.PayDeadline), paid.boxSet(o.PaidAt), nullString(o.Code))
		}
		if _, err := tx.Statement.ConnPool.ExecContext(ctx, w.insertSQL(n), args...); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// insertSQL is the insert statement of n rows, built once per count
// (batches come in a few sizes).
func (w *Writer) insertSQL(n int) string {
	if s, ok := w.inserts.Load(n); ok {
		return s.(string)
	}
	var b strings.Builder
	b.Grow(len(orderColumns) + n*24)
	b.WriteString(orderColumns)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?)")
	}
	s, _ := w.inserts.LoadOrStore(n, b.String())
	return s.(string)
}

// reused boxes a value as a statement argument, reusing the last box
// made when the value is the same.
type reused[T comparable] struct {
	v     T
	boxed any
}

func (r *reused[T]) box(v T) any {
	if r.boxed == nil || v != r.v {
		r.v, r.boxed = v, v
	}
	return r.boxed
}

// boxSet is box of *p, NULL (nil) when p is nil, as gorm passed it.
func (r *reused[T]) boxSet(p *T) any {
	if p == nil {
		return nil
	}
	return r.box(*p)
}

// nullInt and nullString pass a nil pointer as NULL and a set one as its
// value, as gorm did.
func nullInt(p *int) any {
	if p == nil {
		return nil
	}
	return int64(*p)
}

func nullString(p *string) any {
	if p == nil {
		return nil
	}
	return *p
}
