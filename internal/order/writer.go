package order

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// Reasons a message becomes a dead letter instead of an order.
const (
	ReasonUnknownVoucher = "unknown_voucher"
	ReasonOutOfStock     = "out_of_stock"
	ReasonDuplicateBuyer = "duplicate_buyer"
)

// WriterConfig tunes the Writer.
type WriterConfig struct {
	// Attempts bounds how often a transaction that hit a deadlock or lock
	// wait timeout is tried again within one batch, default 3.
	Attempts int
	// AfterCommit, when set, runs after a batch committed and before it is
	// acknowledged: the hook fault tests use for a deterministic crash.
	AfterCommit func()
}

// Writer is the worker's handler: it writes a batch of stream messages as
// orders in one transaction. Every message is idempotent: an order already
// written, or already dead-lettered, counts as done and changes nothing.
type Writer struct {
	db   *gorm.DB
	rdb  redis.UniversalClient
	keys voucher.Keys
	cfg  WriterConfig
	log  *slog.Logger
}

// NewWriter returns a Writer; it owns none of its clients.
func NewWriter(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, cfg WriterConfig, log *slog.Logger) *Writer {
	cfg.Attempts = cmp.Or(cfg.Attempts, 3)
	return &Writer{db: db, rdb: rdb, keys: keys, cfg: cfg, log: log}
}

type item struct {
	msg mq.Message
	ord voucher.Message
}

// Handle writes the batch. Messages that do not decode are left pending.
func (w *Writer) Handle(ctx context.Context, batch []mq.Message) ([]mq.Outcome, error) {
	outcomes := make([]mq.Outcome, len(batch))
	items := make([]item, 0, len(batch))
	for i, m := range batch {
		o, err := voucher.Decode(m.Values)
		if err != nil {
			outcomes[i] = mq.LeavePending
			continue
		}
		items = append(items, item{msg: m, ord: o})
	}
	if len(items) == 0 {
		return outcomes, nil
	}
	var err error
	for attempt := 1; attempt <= w.cfg.Attempts; attempt++ {
		err = w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return w.write(tx, items) })
		if err == nil || !isRetryable(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("write %d orders: %w", len(items), err)
	}
	if w.cfg.AfterCommit != nil {
		w.cfg.AfterCommit()
	}
	w.forgetPending(ctx, items)
	return outcomes, nil // every decoded message is Ack (the zero Outcome)
}

// write records every item as an order or a dead letter. The fast path
// does the whole batch in a few statements; when any guard trips (a
// duplicate, a stock guard) it is rolled back and every item goes the
// careful way, one savepoint each.
func (w *Writer) write(tx *gorm.DB, items []item) error {
	fresh, err := w.unseen(tx, items)
	if err != nil || len(fresh) == 0 {
		return err
	}
	if err := tx.SavePoint("fast").Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	ok, err := w.fast(tx, fresh)
	if err != nil || ok {
		return err
	}
	if err := tx.RollbackTo("fast").Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	for i, it := range fresh {
		if err := w.one(tx, it, "m"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	return nil
}

// unseen drops the items whose order id is already an order or a dead
// letter: a redelivery after a crash between commit and ack.
func (w *Writer) unseen(tx *gorm.DB, items []item) ([]item, error) {
	ids := make([]int64, len(items))
	for i, it := range items {
		ids[i] = it.ord.OrderID
	}
	var done []int64
	if err := tx.Raw("SELECT id FROM orders WHERE id IN ?", ids).Scan(&done).Error; err != nil {
		return nil, fmt.Errorf("find written orders: %w", err)
	}
	var dead []int64
	if err := tx.Raw("SELECT order_id FROM dead_letters WHERE order_id IN ?", ids).Scan(&dead).Error; err != nil {
		return nil, fmt.Errorf("find dead letters: %w", err)
	}
	done = append(done, dead...)
	seen := make(map[int64]bool, len(done))
	for _, id := range done {
		seen[id] = true
	}
	fresh := items[:0:0]
	for _, it := range items {
		if !seen[it.ord.OrderID] {
			fresh = append(fresh, it)
			seen[it.ord.OrderID] = true // a batch never writes one order twice
		}
	}
	return fresh, nil
}

// fast decrements each voucher's stock by its count in the batch, in voucher
// id order so concurrent batches lock rows in one order, then inserts every
// order in one statement. It reports false, with no error, when a guard
// tripped and the batch must go the careful way.
func (w *Writer) fast(tx *gorm.DB, items []item) (bool, error) {
	counts := map[int64]int{}
	for _, it := range items {
		counts[it.ord.VoucherID]++
	}
	vids := make([]int64, 0, len(counts))
	for id := range counts {
		vids = append(vids, id)
	}
	slices.Sort(vids)
	now := time.Now().UTC()
	for _, id := range vids {
		n := counts[id]
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
		rows[i] = Order{ID: it.ord.OrderID, UserID: it.ord.UserID, VoucherID: it.ord.VoucherID, AcceptedAt: it.ord.AcceptedAt, CreatedAt: now}
	}
	err := tx.Create(&rows).Error
	if isDuplicate(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("insert %d orders: %w", len(rows), err)
	}
	return true, nil
}

// one writes a single item under its own savepoint: the order, or the dead
// letter that says why it cannot be one.
func (w *Writer) one(tx *gorm.DB, it item, sp string) error {
	if err := tx.SavePoint(sp).Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	o := it.ord
	now := time.Now().UTC()
	res := tx.Exec("UPDATE vouchers SET stock = stock - 1, updated_at = ? WHERE id = ? AND stock > 0", now, o.VoucherID)
	if res.Error != nil {
		return fmt.Errorf("take stock of voucher %d: %w", o.VoucherID, res.Error)
	}
	if res.RowsAffected != 1 {
		var n int64
		if err := tx.Raw("SELECT COUNT(*) FROM vouchers WHERE id = ?", o.VoucherID).Scan(&n).Error; err != nil {
			return fmt.Errorf("find voucher %d: %w", o.VoucherID, err)
		}
		reason := ReasonOutOfStock
		if n == 0 {
			reason = ReasonUnknownVoucher
		}
		return w.deadLetter(tx, it, reason)
	}
	err := tx.Create(&Order{ID: o.OrderID, UserID: o.UserID, VoucherID: o.VoucherID, AcceptedAt: o.AcceptedAt, CreatedAt: now}).Error
	if err == nil {
		return nil
	}
	if !isDuplicate(err) {
		return fmt.Errorf("insert order %d: %w", o.OrderID, err)
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	var n int64
	if err := tx.Raw("SELECT COUNT(*) FROM orders WHERE id = ?", o.OrderID).Scan(&n).Error; err != nil {
		return fmt.Errorf("find order %d: %w", o.OrderID, err)
	}
	if n == 1 {
		return nil // written by a concurrent batch: done
	}
	return w.deadLetter(tx, it, ReasonDuplicateBuyer)
}

// deadLetter records why an item is not an order. The caller's savepoint
// must have undone any write for the item.
func (w *Writer) deadLetter(tx *gorm.DB, it item, reason string) error {
	payload, _ := json.Marshal(it.msg.Values)
	o := it.ord
	d := DeadLetter{
		Stream: it.msg.Stream, MessageID: it.msg.ID, OrderID: &o.OrderID, UserID: &o.UserID, VoucherID: &o.VoucherID,
		Reason: reason, Payload: string(payload), CreatedAt: time.Now().UTC(),
	}
	err := tx.Create(&d).Error
	if err != nil && !isDuplicate(err) {
		return fmt.Errorf("dead-letter order %d: %w", o.OrderID, err)
	}
	w.log.Warn("order dead-lettered", "order_id", o.OrderID, "voucher_id", o.VoucherID, "reason", reason)
	return nil
}

// forgetPending drops written orders from the pending index. Best effort:
// the status route looks at the database after the index, so a stale entry
// is only memory.
func (w *Writer) forgetPending(ctx context.Context, items []item) {
	byShard := map[int][]string{}
	for _, it := range items {
		s := w.keys.Shard(it.ord.VoucherID)
		byShard[s] = append(byShard[s], strconv.FormatInt(it.ord.OrderID, 10))
	}
	pipe := w.rdb.Pipeline()
	for s, ids := range byShard {
		pipe.HDel(ctx, w.keys.Pending(s), ids...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, context.Canceled) {
		w.log.Warn("pending index not cleaned", "err", err)
	}
}
