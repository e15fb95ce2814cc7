package order

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gorm.io/gorm"

	dbpkg "seckill/internal/db"
)

// Order counters (table order_counts): every transaction that writes an
// order or moves one adds what it changed to its voucher's count of orders
// in each state, and their amount, in the same transaction. The console's
// figures and the sweeper's state counts read these rows, a few per
// voucher, instead of counting the orders, which grow with the sale.
//
// A count is spread over countSlots rows (slot): the writer adds in
// writerSlot, which no lifecycle move writes (a recount does), and takes
// it only after the voucher's stock row, so its batches queue on nothing
// new; a lifecycle move adds in
// a slot of its order's id, so that buyers paying at once do not queue on
// one row. A count is the sum of its slots; one slot alone may be
// negative. Every transaction takes its counter rows last, after the
// orders' and the vouchers' rows, in key order.

// countSlots is how many rows one voucher's count in one state is spread
// over.
const countSlots = 16

// writerSlot is the slot the order writer adds to.
const writerSlot = 0

// slotOf is the slot a lifecycle move of order id adds to.
func slotOf(id int64) int {
	return 1 + int(uint64(id)%(countSlots-1))
}

// countKey names one count: a voucher's orders in one state, and for
// cancelled ones, cancelled for which reason ("" for none).
type countKey struct {
	VoucherID int64
	Status    string
	Reason    string
}

// tally is a count's orders and their amount.
type tally struct {
	N, Amount int64
}

// counts are changes to counts, or counts read.
type counts map[countKey]tally

// add counts n orders (n < 0 takes them away) in a state of a voucher,
// with their amount.
func (c counts) add(k countKey, n, amount int64) {
	t := c[k]
	t.N += n
	t.Amount += n * amount
	c[k] = t
}

// added counts a new order in its state.
func (c counts) added(o *Order) {
	c.add(countKey{o.VoucherID, o.Status, reasonOf(o.CancelReason)}, 1, o.Amount)
}

// moved counts an order, as it was before t, moved by t.
func (c counts) moved(t transition, o *Order) {
	c.add(countKey{o.VoucherID, o.Status, reasonOf(o.CancelReason)}, -1, o.Amount)
	c.add(countKey{o.VoucherID, t.to, t.reason}, 1, o.Amount)
}

func reasonOf(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// save adds the changes to the counter rows of slot, in key order, in one
// statement. Changes that cancel out are left out.
func (c counts) save(tx *gorm.DB, slot int) error {
	keys := slices.SortedFunc(maps.Keys(c), func(a, b countKey) int {
		return cmp.Or(cmp.Compare(a.VoucherID, b.VoucherID), strings.Compare(a.Status, b.Status), strings.Compare(a.Reason, b.Reason))
	})
	var b strings.Builder
	b.WriteString("INSERT INTO order_counts (voucher_id, status, cancel_reason, slot, n, amount) VALUES ")
	args := make([]any, 0, 6*len(keys))
	for _, k := range keys {
		t := c[k]
		if t == (tally{}) {
			continue
		}
		if len(args) > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?)")
		args = append(args, k.VoucherID, k.Status, k.Reason, slot, t.N, t.Amount)
	}
	if len(args) == 0 {
		return nil
	}
	if tx.Dialector.Name() == "mysql" {
		b.WriteString(" ON DUPLICATE KEY UPDATE n = n + VALUES(n), amount = amount + VALUES(amount)")
	} else {
		b.WriteString(" ON CONFLICT (voucher_id, status, cancel_reason, slot) DO UPDATE SET n = n + excluded.n, amount = amount + excluded.amount")
	}
	if _, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context, b.String(), args...); err != nil {
		return fmt.Errorf("count %d changes of orders: %w", len(keys), err)
	}
	return nil
}

// readCounts reads the counts of the vouchers of ids (every voucher's when
// ids is empty), slots summed.
func readCounts(ctx context.Context, db *gorm.DB, ids []int64) (counts, error) {
	var rows []struct {
		VoucherID    int64
		Status       string
		CancelReason string
		N, Amount    int64
	}
	if err := countsOf(db.WithContext(ctx), ids).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("read order counts: %w", err)
	}
	out := make(counts, len(rows))
	for _, r := range rows {
		if r.N != 0 || r.Amount != 0 {
			out[countKey{r.VoucherID, r.Status, r.CancelReason}] = tally{r.N, r.Amount}
		}
	}
	return out, nil
}

// countsOf selects the counts of the vouchers of ids (every voucher's
// when ids is empty), slots summed: each voucher's range of the primary
// key.
func countsOf(tx *gorm.DB, ids []int64) *gorm.DB {
	q := tx.Table("order_counts").
		Select("voucher_id, status, cancel_reason, SUM(n) AS n, SUM(amount) AS amount").
		Group("voucher_id, status, cancel_reason")
	if len(ids) > 0 {
		q = q.Where("voucher_id IN ?", ids)
	}
	return q
}

// countOrders counts a voucher's orders themselves, the way the counters
// do.
func countOrders(tx *gorm.DB, voucherID int64, lock bool) (counts, error) {
	var rows []struct {
		Status       string
		CancelReason string
		N, Amount    int64
	}
	from := "orders"
	if tx.Dialector.Name() == "mysql" {
		// The voucher's range of the index, never a scan of the table
		// (which would lock every voucher's orders).
		from = "orders FORCE INDEX (idx_orders_voucher_accepted)"
	}
	q := "SELECT status, COALESCE(cancel_reason, '') AS cancel_reason, COUNT(*) AS n, COALESCE(SUM(amount), 0) AS amount FROM " + from +
		" WHERE voucher_id = ? GROUP BY status, COALESCE(cancel_reason, '')"
	if lock && tx.Dialector.Name() == "mysql" {
		// Every order of the voucher, and the gaps between them, held
		// shared (in a transaction of REPEATABLE READ: recount): its moves
		// and new orders wait until the recount commits.
		q += " LOCK IN SHARE MODE"
	}
	if err := tx.Raw(q, voucherID).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("count orders of voucher %d: %w", voucherID, err)
	}
	out := make(counts, len(rows))
	for _, r := range rows {
		out[countKey{voucherID, r.Status, r.CancelReason}] = tally{r.N, r.Amount}
	}
	return out, nil
}

// Recount is one voucher's counters recounted: what they said, and what
// its orders say.
type Recount struct {
	VoucherID int64            `json:"voucher_id"`
	Before    map[string]int64 `json:"before"`
	After     map[string]int64 `json:"after"`
}

// RecountAll counts every voucher's orders again and sets its counters to
// what it found: after orders were edited by hand, or the counters were,
// and as the last step of an upgrade across the release that brought them
// (an instance of an older release stalled past its listing could write
// after the migration counted the orders). It returns the vouchers whose
// counters were wrong, those fixed before an error too. Each voucher is
// recounted in a transaction of its own, of REPEATABLE READ whatever the
// server's default, that holds the voucher's orders and the gaps between
// them shared meanwhile: its new orders and moves wait until it commits,
// for as long as reading the voucher's orders takes; nothing is refused.
// A deadlock with them is tried again.
func RecountAll(ctx context.Context, db *gorm.DB) ([]Recount, error) {
	var ids []int64
	if err := db.WithContext(ctx).Raw("SELECT id FROM vouchers ORDER BY id").Scan(&ids).Error; err != nil {
		return nil, fmt.Errorf("list vouchers: %w", err)
	}
	var out []Recount
	for _, id := range ids {
		r, err := recountRetried(ctx, db, id)
		if err != nil {
			return out, err
		}
		if r != nil {
			out = append(out, *r)
		}
	}
	return out, nil
}

// recountRetried is recount, tried again after a deadlock or a lock wait
// timeout (a writer's batch or a move meeting the voucher's orders).
func recountRetried(ctx context.Context, db *gorm.DB, voucherID int64) (r *Recount, err error) {
	for try := 1; try <= 5; try++ {
		r, err = recount(ctx, db, voucherID)
		if err == nil || !dbpkg.IsRetryable(err) || ctx.Err() != nil {
			break
		}
	}
	return r, err
}

// recount recounts one voucher; nil when its counters were right.
func recount(ctx context.Context, db *gorm.DB, voucherID int64) (*Recount, error) {
	var r *Recount
	var opts *sql.TxOptions
	if db.Dialector.Name() == "mysql" {
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}
	}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		r = nil
		actual, err := countOrders(tx, voucherID, true)
		if err != nil {
			return err
		}
		kept, err := readCounts(ctx, tx, []int64{voucherID})
		if err != nil {
			return err
		}
		if maps.Equal(actual, kept) {
			return nil
		}
		r = &Recount{VoucherID: voucherID, Before: kept.byName(), After: actual.byName()}
		if err := tx.Exec("DELETE FROM order_counts WHERE voucher_id = ?", voucherID).Error; err != nil {
			return fmt.Errorf("clear counters of voucher %d: %w", voucherID, err)
		}
		return actual.save(tx, writerSlot)
	}, opts)
	return r, err
}

// byName is the counts as state (or state:reason) -> orders, for a report.
func (c counts) byName() map[string]int64 {
	out := make(map[string]int64, len(c))
	for k, t := range c {
		name := k.Status
		if k.Reason != "" {
			name += ":" + k.Reason
		}
		out[name] += t.N
	}
	return out
}
