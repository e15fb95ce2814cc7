package order

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/voucher"
	"seckill/lua"
)

// Reasons a message becomes a dead letter instead of an order.
const (
	ReasonUndecodable    = "undecodable"
	ReasonUnknownVoucher = "unknown_voucher"
	ReasonOutOfStock     = "out_of_stock"
	ReasonDuplicateBuyer = "duplicate_buyer"
	// ReasonIDCollision: another buyer's order already has this order id
	// (ids minted twice, as after a lost id lease). Acking it as written
	// would lose the order without a trace; as a dead letter its buyer's
	// reservation is given back and the buyer can buy again.
	ReasonIDCollision = "id_collision"
	// ReasonDeliveryLimit: delivered more than MaxDeliveries times (its
	// consumers kept dying on it).
	ReasonDeliveryLimit = "delivery_limit"
	// ReasonAttemptLimit: its buyer lock was held elsewhere on every one
	// of MaxAttempts tries.
	ReasonAttemptLimit = "attempt_limit"
)

// restocks says which dead letters give their unit back to the Redis
// stock: those whose unit MySQL still has. An order refused for lack of
// MySQL stock, or for an unknown voucher, has no unit to give back.
func restocks(reason string) bool {
	return reason == ReasonDeliveryLimit || reason == ReasonAttemptLimit || reason == ReasonDuplicateBuyer ||
		reason == ReasonIDCollision
}

// WriterConfig tunes the Writer.
type WriterConfig struct {
	// Attempts bounds how often a transaction that hit a deadlock or lock
	// wait timeout is tried again within one batch, default 3.
	Attempts int
	// Locks, when set, are taken per buyer around the write; a buyer whose
	// lock is held elsewhere is retried later through the delay queue.
	Locks *Locks
	// KeyPrefix names the buyer locks (the Redis key prefix).
	KeyPrefix string
	// MaxDeliveries: a message delivered more often is dead-lettered.
	// Default 5.
	MaxDeliveries int64
	// MaxAttempts: a message whose lock was held on this many tries is
	// dead-lettered. Default 8.
	MaxAttempts int
	// AfterCommit, when set, runs after a batch committed and before it is
	// acknowledged: the hook fault tests use for a deterministic crash.
	AfterCommit func()
	// Observer, when set, hears what the writer does (metrics).
	Observer Observer
}

// Observer hears what the writer does, for metrics. It is called from the
// worker loops, so it must be cheap and safe for concurrent use.
type Observer interface {
	// Batch: a batch of size messages went through a transaction (committed
	// or not) that took this long, retries included.
	Batch(size int, took time.Duration)
	// Written: orders newly committed (redelivered ones not counted).
	Written(orders int)
	// DeadLettered: one new dead letter was committed.
	DeadLettered(reason string)
	// LockConflicts: messages whose buyer lock was held elsewhere.
	LockConflicts(n int)
	// RedisError and MySQLError: a call failed (op: lock, give_back; write).
	RedisError(op string)
	MySQLError(op string)
}

type nopObserver struct{}

func (nopObserver) Batch(int, time.Duration) {}
func (nopObserver) Written(int)              {}
func (nopObserver) DeadLettered(string)      {}
func (nopObserver) LockConflicts(int)        {}
func (nopObserver) RedisError(string)        {}
func (nopObserver) MySQLError(string)        {}

// Writer is the worker's handler: it writes a batch of stream messages as
// orders in one transaction. Every message is idempotent: an order already
// written, or already dead-lettered, counts as done and changes nothing.
type Writer struct {
	db      *gorm.DB
	rdb     redis.UniversalClient
	keys    voucher.Keys
	cfg     WriterConfig
	log     *slog.Logger
	release *redis.Script
	// settleScript is lua/settle.lua.
	settleScript *redis.Script
}

// NewWriter returns a Writer; it owns none of its clients.
func NewWriter(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, cfg WriterConfig, log *slog.Logger) *Writer {
	cfg.Attempts = cmp.Or(cfg.Attempts, 3)
	cfg.MaxDeliveries = cmp.Or(cfg.MaxDeliveries, 5)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 8)
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Writer{db: db, rdb: rdb, keys: keys, cfg: cfg, log: log, release: lua.Release(), settleScript: lua.Settle()}
}

// item is one message on its way: decoded, and with the reason it is
// dead-lettered when it cannot become an order.
type item struct {
	msg    mq.Message
	ord    voucher.Message
	bad    bool   // did not decode
	reason string // set when the item is to be dead-lettered
	fresh  bool   // not written before this batch's transaction: counted once
	// idTaken: another buyer's order or dead letter has this order id, so
	// a dead letter of this item is recorded without it (the id is unique
	// among dead letters).
	idTaken bool
	// given is the reason Handle gave before the transaction (delivery or
	// attempt limit): a transaction tried again starts from it.
	given string
	// decided: a stale copy of a message whose dead letter was replayed;
	// the replay's own message decides the order. It is acknowledged and
	// changes nothing: no order, no letter, nothing given back or settled.
	decided bool
}

// Handle writes the batch. Each message ends as an order, a dead letter
// (with its reservation given back) or, when its buyer lock is held
// elsewhere or an earlier message of the batch has its order id, a retry
// through the delay queue. A stale copy of a message whose dead letter was
// replayed is acknowledged and changes nothing: the replay decides.
func (w *Writer) Handle(ctx context.Context, batch []mq.Message) ([]mq.Outcome, error) {
	outcomes := make([]mq.Outcome, len(batch))
	items := make([]item, 0, len(batch))
	var lockKeys, lockValues []string
	var lockIdx []int
	ids := make(map[int64]bool, len(batch))
	for _, m := range batch {
		it := item{msg: m}
		o, err := voucher.Decode(m.Values)
		switch {
		case err != nil:
			it.bad, it.reason = true, ReasonUndecodable
		case ids[o.OrderID]:
			// An earlier message of this batch has the same order id:
			// another buyer's (ids minted twice) or another message of
			// this order (a replay beside a stale copy still pending). One
			// transaction decides one message per order id; this one is
			// decided in a later batch, once that one is committed.
			outcomes[len(items)] = mq.Retry
		case m.Deliveries > w.cfg.MaxDeliveries:
			it.ord, it.reason = o, ReasonDeliveryLimit
			ids[o.OrderID] = true
		default:
			it.ord = o
			ids[o.OrderID] = true
			if w.cfg.Locks != nil {
				lockKeys = append(lockKeys, lockKey(w.cfg.KeyPrefix, o.VoucherID, o.UserID))
				lockValues = append(lockValues, "order:"+strconv.FormatInt(o.OrderID, 10))
				lockIdx = append(lockIdx, len(items))
			}
		}
		items = append(items, it)
	}

	var held []*redsync.Mutex
	if len(lockKeys) > 0 {
		var err error
		held, err = w.cfg.Locks.tryAll(ctx, lockKeys, lockValues)
		if err != nil {
			w.cfg.Observer.RedisError("lock")
			return nil, err
		}
		defer w.cfg.Locks.release(context.WithoutCancel(ctx), held)
		conflicts := 0
		for j, m := range held {
			if m != nil {
				continue
			}
			conflicts++
			i := lockIdx[j]
			if items[i].msg.Attempt+1 >= w.cfg.MaxAttempts {
				items[i].reason = ReasonAttemptLimit
			} else {
				outcomes[i] = mq.Retry
			}
		}
		if conflicts > 0 {
			w.cfg.Observer.LockConflicts(conflicts)
		}
		stop := w.cfg.Locks.watch(ctx, held)
		defer stop()
	}

	work := make([]*item, 0, len(items))
	for i := range items {
		if outcomes[i] != mq.Retry {
			items[i].given = items[i].reason
			work = append(work, &items[i])
		}
	}
	if len(work) == 0 {
		return outcomes, nil
	}
	var err error
	began := time.Now()
	for attempt := 1; attempt <= w.cfg.Attempts; attempt++ {
		err = w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return w.write(tx, work) }, w.txOptions())
		if err == nil || !db.IsRetryable(err) {
			break
		}
	}
	w.cfg.Observer.Batch(len(batch), time.Since(began))
	if err != nil {
		w.cfg.Observer.MySQLError("write")
		return nil, fmt.Errorf("write %d orders: %w", len(work), err)
	}
	w.observeCommitted(work)
	if w.cfg.AfterCommit != nil {
		w.cfg.AfterCommit()
	}
	// Give back the reservations of dead letters before the ack: after a
	// crash here the redelivery finds the dead letter and gives back again,
	// which the script makes a no-op.
	if err := w.giveBack(ctx, work); err != nil {
		if !errors.Is(err, errNotReady) {
			w.cfg.Observer.RedisError("give_back")
		}
		return nil, err
	}
	if err := w.settle(ctx, work); err != nil {
		return nil, err
	}
	return outcomes, nil
}

// observeCommitted tells the observer what the committed transaction
// recorded for the first time.
func (w *Writer) observeCommitted(items []*item) {
	orders := 0
	for _, it := range items {
		switch {
		case !it.fresh:
		case it.reason == "":
			orders++
		default:
			w.cfg.Observer.DeadLettered(it.reason)
		}
	}
	if orders > 0 {
		w.cfg.Observer.Written(orders)
	}
}

// write records every item as an order or a dead letter. The fast path
// does the whole batch in a few statements; when any guard trips (a
// duplicate, a stock guard) it is rolled back and every item goes the
// careful way, one savepoint each. Items already written or dead-lettered
// (a redelivery) change nothing.
func (w *Writer) write(tx *gorm.DB, items []*item) error {
	fresh, err := w.unseen(tx, items)
	if err != nil {
		return err
	}
	var orders []*item
	for _, it := range fresh {
		if it.reason != "" {
			if err := w.deadLetter(tx, it); err != nil {
				return err
			}
			continue
		}
		orders = append(orders, it)
	}
	if len(orders) == 0 {
		return nil
	}
	if err := tx.SavePoint("fast").Error; err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	ok, err := w.fast(tx, orders)
	if err != nil || ok {
		return err
	}
	if err := tx.RollbackTo("fast").Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	for i, it := range orders {
		if err := w.one(tx, it, "m"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	return nil
}

// unseen returns the items not yet written: not an order, not a live dead
// letter, both matched by order id and buyer. Items already dead-lettered
// get that reason back, so their reservation is given back again (a no-op
// if it was). An order id another buyer's order holds is a collision; one
// only another buyer's dead letter holds is still free for an order.
func (w *Writer) unseen(tx *gorm.DB, items []*item) ([]*item, error) {
	var ids []int64
	for _, it := range items {
		// A transaction tried again decides afresh.
		it.fresh, it.idTaken, it.decided = false, false, false
		if !it.bad {
			it.reason = it.given
			ids = append(ids, it.ord.OrderID)
		}
	}
	if len(ids) == 0 {
		return w.unseenBad(tx, items)
	}
	var done []buyerOf
	if err := tx.Raw(w.locking("SELECT id, user_id, voucher_id FROM orders WHERE id IN ?"), ids).Scan(&done).Error; err != nil {
		return nil, fmt.Errorf("find written orders: %w", err)
	}
	var dead []struct {
		OrderID   int64
		UserID    int64
		VoucherID int64
		Reason    string
		Replayed  bool
		Stream    string
		MessageID string
	}
	if err := tx.Raw(w.locking("SELECT order_id, user_id, voucher_id, reason, replayed_at IS NOT NULL AS replayed, stream, message_id FROM dead_letters WHERE order_id IN ?"), ids).Scan(&dead).Error; err != nil {
		return nil, fmt.Errorf("find dead letters: %w", err)
	}
	written := make(map[int64]buyerOf, len(done))
	for _, o := range done {
		written[o.ID] = o
	}
	type deadOf struct {
		buyer           buyerOf
		reason          string
		replayed        bool
		stream, message string
	}
	deadLetters := make(map[int64]deadOf, len(dead))
	for _, d := range dead {
		deadLetters[d.OrderID] = deadOf{buyerOf{d.OrderID, d.UserID, d.VoucherID}, d.Reason, d.Replayed, d.Stream, d.MessageID}
	}
	var fresh []*item
	for _, it := range items {
		if it.bad {
			continue
		}
		id := it.ord.OrderID
		o, isOrder := written[id]
		d, isDead := deadLetters[id]
		otherOrder := isOrder && o != it.buyer()
		otherLetter := isDead && d.buyer != it.buyer()
		switch {
		case isOrder && !otherOrder:
			it.reason = "" // an order: nothing to give back
			continue
		case isDead && !otherLetter && !d.replayed:
			it.reason = d.reason
			continue
		case isDead && !otherLetter && d.stream == it.msg.Stream && d.message == it.msg.ID:
			it.decided, it.reason = true, "" // a stale copy of a replayed letter's message
			continue
		}
		if otherOrder || otherLetter {
			// Another buyer's order or letter has the id: a letter of this
			// item is kept by its message (found there on a redelivery).
			// Another buyer's letter leaves the id free for an order.
			found, err := w.byMessage(tx, it)
			if err != nil {
				return nil, err
			}
			if found {
				continue
			}
			it.idTaken = true
			if otherOrder {
				it.reason = ReasonIDCollision
			}
		}
		fresh = append(fresh, it)
		it.fresh = true
	}
	bad, err := w.unseenBad(tx, items)
	return append(fresh, bad...), err
}

// byMessage looks for the dead letter of this very stream message (kept
// by its message: another buyer holds the order id) and, when there is
// one, decides the item by it: a live letter gives its reason (given back
// again, a no-op); a replayed one makes the item a stale copy.
func (w *Writer) byMessage(tx *gorm.DB, it *item) (bool, error) {
	var rows []struct {
		Reason            string
		Replayed          bool
		UserID, VoucherID *int64
	}
	if err := tx.Raw(w.locking("SELECT reason, replayed_at IS NOT NULL AS replayed, user_id, voucher_id FROM dead_letters WHERE stream = ? AND message_id = ?"),
		it.msg.Stream, it.msg.ID).Scan(&rows).Error; err != nil {
		return false, fmt.Errorf("find dead letter of message %s: %w", it.msg.ID, err)
	}
	if len(rows) == 0 || rows[0].UserID == nil || rows[0].VoucherID == nil ||
		*rows[0].UserID != it.ord.UserID || *rows[0].VoucherID != it.ord.VoucherID {
		return false, nil // none, or another message's under the same id
	}
	if rows[0].Replayed {
		it.decided, it.reason = true, ""
	} else {
		it.reason = rows[0].Reason
	}
	return true, nil
}

// unseenBad returns the undecodable items without a dead letter yet.
func (w *Writer) unseenBad(tx *gorm.DB, items []*item) ([]*item, error) {
	var out []*item
	for _, it := range items {
		if !it.bad {
			continue
		}
		var n int64
		if err := tx.Raw("SELECT COUNT(*) FROM dead_letters WHERE stream = ? AND message_id = ?", it.msg.Stream, it.msg.ID).Scan(&n).Error; err != nil {
			return nil, fmt.Errorf("find dead letter: %w", err)
		}
		if n == 0 {
			out = append(out, it)
			it.fresh = true
		}
	}
	return out, nil
}

// fast decrements each voucher's stock by its count in the batch, in voucher
// id order so concurrent batches lock rows in one order, then inserts every
// order in one statement. It reports false, with no error, when a guard
// tripped and the batch must go the careful way.
func (w *Writer) fast(tx *gorm.DB, items []*item) (bool, error) {
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
	// In statements of 1,000 rows (5,000 placeholders): one statement for a
	// large batch would pass SQLite's limit of 32,766 variables.
	err := tx.CreateInBatches(&rows, 1000).Error
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
	var keyed []buyerOf
	if err := tx.Raw(w.locking("SELECT order_id AS id, user_id, voucher_id FROM dead_letters WHERE order_id IN ? AND replayed_at IS NULL"), ids).
		Scan(&keyed).Error; err != nil {
		return false, fmt.Errorf("find dead letters of orders: %w", err)
	}
	for _, k := range keyed {
		for _, it := range items {
			if k == it.buyer() {
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

// one writes a single item under its own savepoint: the order, or the dead
// letter that says why it cannot be one.
func (w *Writer) one(tx *gorm.DB, it *item, sp string) error {
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
		// (The last unit may have gone to this very order, written by a
		// worker that took the message over: recordDeadLetter finds it.)
		var n int64
		if err := tx.Raw("SELECT COUNT(*) FROM vouchers WHERE id = ?", o.VoucherID).Scan(&n).Error; err != nil {
			return fmt.Errorf("find voucher %d: %w", o.VoucherID, err)
		}
		it.reason = ReasonOutOfStock
		if n == 0 {
			it.reason = ReasonUnknownVoucher
		}
		return w.deadLetter(tx, it)
	}
	err := tx.Create(&Order{ID: o.OrderID, UserID: o.UserID, VoucherID: o.VoucherID, AcceptedAt: o.AcceptedAt, CreatedAt: now}).Error
	if err == nil {
		// A worker that took the message over may have dead-lettered it
		// meanwhile: then that letter is what it is.
		letter, err := w.liveLetter(tx, it)
		if err != nil || letter == "" {
			return err
		}
		if err := tx.RollbackTo(sp).Error; err != nil {
			return fmt.Errorf("rollback to savepoint: %w", err)
		}
		it.reason, it.fresh = letter, false
		return nil
	}
	if !db.IsDuplicate(err) {
		return fmt.Errorf("insert order %d: %w", o.OrderID, err)
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	var found []buyerOf
	if err := tx.Raw(w.locking("SELECT id, user_id, voucher_id FROM orders WHERE id = ?"), o.OrderID).Scan(&found).Error; err != nil {
		return fmt.Errorf("find order %d: %w", o.OrderID, err)
	}
	switch {
	case len(found) == 1 && found[0] == it.buyer():
		it.fresh = false // written by a concurrent batch: done, counted there
		return nil
	case len(found) == 1:
		it.reason = ReasonIDCollision
		it.idTaken = true
	default:
		it.reason = ReasonDuplicateBuyer
	}
	return w.deadLetter(tx, it)
}

// written reports whether this item's order is in the table, written by a
// concurrent batch (then it is done, and counted there).
func (w *Writer) written(tx *gorm.DB, it *item) (bool, error) {
	var found []buyerOf
	if err := tx.Raw(w.locking("SELECT id, user_id, voucher_id FROM orders WHERE id = ?"), it.ord.OrderID).Scan(&found).Error; err != nil {
		return false, fmt.Errorf("find order %d: %w", it.ord.OrderID, err)
	}
	if len(found) == 1 && found[0] == it.buyer() {
		it.fresh = false
		return true, nil
	}
	return false, nil
}

// buyerOf is an order id with the buyer and voucher it was accepted for.
type buyerOf struct {
	ID        int64
	UserID    int64
	VoucherID int64
}

func (it *item) buyer() buyerOf {
	return buyerOf{ID: it.ord.OrderID, UserID: it.ord.UserID, VoucherID: it.ord.VoucherID}
}

// deadLetter records why an item is not an order (recordDeadLetter says
// how, when a letter is there already). The caller's savepoint must have
// undone any write for the item. A dead letter is kept under its order id
// unless another buyer's order or dead letter has that id: then it is kept
// by its message alone.
func (w *Writer) deadLetter(tx *gorm.DB, it *item) error {
	payload, _ := json.Marshal(it.msg.Values)
	d := DeadLetter{
		Stream: it.msg.Stream, MessageID: it.msg.ID, Reason: it.reason, Payload: string(payload), CreatedAt: time.Now().UTC(),
	}
	if !it.bad {
		o := it.ord
		d.OrderID, d.UserID, d.VoucherID = &o.OrderID, &o.UserID, &o.VoucherID
	}
	if err := w.recordDeadLetter(tx, it, &d); err != nil {
		return fmt.Errorf("dead-letter message %s: %w", it.msg.ID, err)
	}
	if it.reason == "" || !it.fresh {
		return nil // an order after all, or recorded by another worker
	}
	level := slog.LevelWarn
	if it.reason == ReasonIDCollision {
		level = slog.LevelError // order ids were minted twice: a fault to look into
	}
	w.log.Log(context.Background(), level, "message dead-lettered", "message_id", it.msg.ID, "order_id", it.ord.OrderID, "reason", it.reason)
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
	if err != nil || !wrote || it.bad {
		return err
	}
	if done, err := w.written(tx, it); err != nil || !done {
		return err
	}
	if err := tx.RollbackTo(sp).Error; err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	it.reason = ""
	return nil
}

// insertDeadLetter inserts d and reports whether it wrote a row. When a
// row holds its order id already: another buyer's leaves d to be kept by
// its message; this order's live letter (a concurrent worker recorded it
// meanwhile) stands, the item takes its reason and is not counted again;
// this order's replayed letter is live again when d is the replay's
// message failing again, and when d is the very message whose letter was
// replayed (a stale copy), the replay decides and d changes nothing.
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
		var held []struct {
			ID, UserID, VoucherID int64
			Reason                string
			Replayed              bool
			Stream, MessageID     string
		}
		if err := tx.Raw(w.locking("SELECT order_id AS id, user_id, voucher_id, reason, replayed_at IS NOT NULL AS replayed, stream, message_id FROM dead_letters WHERE order_id = ?"),
			*d.OrderID).Scan(&held).Error; err != nil {
			return false, fmt.Errorf("find dead letter of order %d: %w", *d.OrderID, err)
		}
		switch {
		case len(held) == 0:
			return false, w.recordedByMessage(tx, it) // the message's key, not the order's
		case (buyerOf{held[0].ID, held[0].UserID, held[0].VoucherID}) != it.buyer():
			it.idTaken = true
		case !held[0].Replayed:
			it.reason, it.fresh = held[0].Reason, false
			return false, nil
		case held[0].Stream == d.Stream && held[0].MessageID == d.MessageID:
			it.decided, it.reason, it.fresh = true, "", false
			return false, nil
		default:
			err := tx.Model(&DeadLetter{}).Where("order_id = ?", *d.OrderID).Updates(map[string]any{
				"reason": d.Reason, "replayed_at": nil, "stream": d.Stream, "message_id": d.MessageID,
				"payload": d.Payload, "created_at": d.CreatedAt,
			}).Error
			if db.IsDuplicate(err) {
				return false, w.recordedByMessage(tx, it)
			}
			return err == nil, err
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

// recordedByMessage decides an item whose letter could not be inserted
// because its message has one already (a concurrent worker's).
func (w *Writer) recordedByMessage(tx *gorm.DB, it *item) error {
	found, err := w.byMessage(tx, it)
	if err != nil {
		return err
	}
	it.fresh = false
	if !found {
		// The message's key holds another message's letter (stream ids
		// reused, or a worker that reads messages otherwise): nothing
		// more can be recorded for this one.
		w.log.Error("dead letter not recorded: its stream message id holds another message's letter",
			"message_id", it.msg.ID, "order_id", it.ord.OrderID, "reason", it.reason)
	}
	return nil
}

// giveBack returns the Redis reservation of every dead-lettered item. In
// a shard that is not ready (being rebuilt) the script gives nothing back,
// and the batch is tried again after the rebuild (errNotReady): the dead
// letter is committed, so the redelivery finds it and gives back then.
func (w *Writer) giveBack(ctx context.Context, items []*item) error {
	pipe := w.rdb.Pipeline()
	var cmds []*redis.Cmd
	for _, it := range items {
		if it.reason == "" || it.bad || it.decided {
			continue
		}
		o := it.ord
		restock := "0"
		if restocks(it.reason) {
			restock = "1"
		}
		shard := w.keys.Shard(o.VoucherID)
		keys := []string{w.keys.Ready(shard), w.keys.State(o.VoucherID), w.keys.Buyers(o.VoucherID), w.keys.Pending(shard)}
		cmds = append(cmds, w.release.Eval(ctx, pipe, keys, o.UserID, o.OrderID, restock))
	}
	if len(cmds) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("give back %d reservations: %w", len(cmds), err)
	}
	for _, c := range cmds {
		if given, err := c.Int(); err != nil || given < 0 {
			return fmt.Errorf("give back %d reservations: %w", len(cmds), cmp.Or(err, errNotReady))
		}
	}
	return nil
}

// txOptions runs the batch at READ COMMITTED on MySQL: its locking reads
// then see, and wait for, what a concurrent writer of the same order
// commits, without the gap locks that make concurrent batches deadlock.
// SQLite has one writer and needs nothing.
func (w *Writer) txOptions() *sql.TxOptions {
	if w.db.Dialector.Name() == "mysql" {
		return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	return nil
}

// locking turns a query of the batch into a locking read on MySQL: a
// worker that took over a message from a stalled one must see the stalled
// one's commit (or wait for it), never an older snapshot, or one order
// could end as both an order and a dead letter.
func (w *Writer) locking(query string) string {
	if w.db.Dialector.Name() == "mysql" {
		return query + " LOCK IN SHARE MODE"
	}
	return query
}

// settle makes Redis agree with the orders just written, one script call
// per shard: it drops them from the pending index and, when a rebuild of
// Redis missed one (it was in this worker's hands), records its buyer and
// takes its unit; when the buyer bought again meanwhile, the written order
// takes over that later order's entry and unit (lua/settle.lua says why).
// While a shard is being rebuilt it cannot settle, and the batch is tried
// again.
func (w *Writer) settle(ctx context.Context, items []*item) error {
	type call struct {
		keys []string
		args []any
	}
	calls := map[int]*call{}
	for _, it := range items {
		if it.bad || it.reason != "" || it.decided {
			continue
		}
		o := it.ord
		shard := w.keys.Shard(o.VoucherID)
		c := calls[shard]
		if c == nil {
			c = &call{keys: []string{w.keys.Ready(shard), w.keys.Pending(shard)}}
			calls[shard] = c
		}
		c.keys = append(c.keys, w.keys.State(o.VoucherID), w.keys.Buyers(o.VoucherID))
		c.args = append(c.args, o.UserID, o.OrderID, o.VoucherID)
	}
	for shard, c := range calls {
		n, err := w.settleScript.Run(ctx, w.rdb, c.keys, c.args...).Int()
		if err != nil {
			return fmt.Errorf("settle %d orders of shard %d in redis: %w", len(c.args)/3, shard, err)
		}
		if n != 1 {
			return fmt.Errorf("settle orders of shard %d in redis: %w", shard, errNotReady)
		}
	}
	return nil
}

// errNotReady means a shard's Redis state is being rebuilt.
var errNotReady = errors.New("shard state not ready")
