package order

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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
	// PayWindow is how long the buyer of a voucher with a price has to pay,
	// from the order's writing; default 15m.
	PayWindow time.Duration
	// Expiries, when set, schedules each unpaid order's pay deadline, at
	// which the expirer cancels it if still unpaid. Without it only the
	// sweeper does, later.
	Expiries *Expiries
	// Verified, when set, holds a shard's writes back while it reports
	// false for the shard: the database's address reached another server
	// (a failover) that the database watcher has not checked yet, or the
	// shard's share of what that server lost is not written back yet
	// (package failover). The batch fails and is tried again after the
	// consumer's backoff.
	Verified func(shard int) bool
	// Events, when set, announces to every instance's local refusals the
	// reservations given back and the orders written; nil publishes
	// nothing, and the instances learn of them only when their answers
	// expire, after their bound.
	Events *voucher.Events
}

// Observer hears what the writer does, for metrics. It is called from the
// worker loops, so it must be cheap and safe for concurrent use.
type Observer interface {
	// Batch: a batch of size messages went through a transaction (committed
	// or not) that took this long, retries included.
	Batch(size int, took time.Duration)
	// Written: orders newly committed (redelivered ones not counted).
	Written(orders int)
	// Healed: of those, orders the database had lost and Redis still held
	// (package failover queued them again).
	Healed(orders int)
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
func (nopObserver) Healed(int)               {}
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
	// inserts holds insertSQL's statements by row count (int -> string).
	inserts sync.Map
	// gtids is tellsGTIDs's answer: whether the database gives each
	// transaction a GTID (a binary log), or not known yet.
	gtids atomic.Int32
}

// NewWriter returns a Writer; it owns none of its clients.
func NewWriter(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, cfg WriterConfig, log *slog.Logger) *Writer {
	cfg.Attempts = cmp.Or(cfg.Attempts, 3)
	cfg.MaxDeliveries = cmp.Or(cfg.MaxDeliveries, 5)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 8)
	cfg.PayWindow = cmp.Or(cfg.PayWindow, 15*time.Minute)
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Writer{db: db, rdb: rdb, keys: keys, cfg: cfg, log: log, release: lua.Release(), settleScript: lua.Settle()}
}

// item is one message on its way: decoded, what Handle read of it before
// the transaction, and its verdict.
type item struct {
	msg  mq.Message
	ord  voucher.Message
	read read
	v    verdict
	// idTaken: another buyer's order or dead letter has this order id, so
	// a dead letter of this item is recorded without it (the id is unique
	// among dead letters). Read with what MySQL holds, or learnt when a
	// write meets it.
	idTaken bool
	// deadline is the pay deadline of its order, inserted awaiting
	// payment; nil when there is nothing to pay.
	deadline *time.Time
	// left: Redis could not be made to agree with what the transaction
	// recorded for it alone (its voucher's keys cannot be read); its
	// message is left pending, and the batch's others go on.
	left error
}

// Handle writes the batch. Each message ends as an order, a dead letter
// (with its reservation given back) or, when its buyer lock is held
// elsewhere or an earlier message of the batch has its order id, a retry
// through the delay queue. One whose order or letter is committed but
// whose voucher's Redis keys cannot be read (errBadKeys) is left pending:
// it is delivered again after the reclaim idle time, and the others are
// acked. A stale copy of a message whose dead letter was replayed is
// acknowledged and changes nothing: the replay decides. decide says
// which, effectsOf what each does.
func (w *Writer) Handle(ctx context.Context, batch []mq.Message) ([]mq.Outcome, error) {
	items := w.admit(batch)
	unlock, err := w.lock(ctx, items)
	if err != nil {
		return nil, err
	}
	defer unlock()

	outcomes := make([]mq.Outcome, len(items))
	work := make([]*item, 0, len(items))
	for i := range items {
		// Only a retry is decided here; the transaction decides the rest.
		items[i].v = decide(items[i].read, found{})
		outcomes[i] = items[i].v.effects().outcome
		if outcomes[i] != mq.Retry {
			work = append(work, &items[i])
		}
	}
	if len(work) == 0 {
		return outcomes, nil
	}
	gtid, err := w.commit(ctx, work, len(batch))
	if err != nil {
		return nil, err
	}
	if err := w.afterCommit(ctx, work, gtid); err != nil {
		return nil, err
	}
	for i := range items {
		if items[i].left != nil {
			outcomes[i] = mq.LeavePending
		}
	}
	return outcomes, nil
}

// commit writes the work in one transaction, tried again after a deadlock
// or lock wait timeout (on Galera, a certification conflict at commit is a
// deadlock too: the whole transaction is tried again, and the guards find
// what a concurrent writer committed). It returns the transaction's GTID
// ("" when the database tells none), read on the connection that
// committed it, which settle records in Redis: a database that later
// lacks it lost these orders.
func (w *Writer) commit(ctx context.Context, work []*item, size int) (gtid string, err error) {
	began := time.Now()
	for attempt := 1; attempt <= w.cfg.Attempts; attempt++ {
		gtid, err = w.commitOnce(ctx, work)
		if err == nil || !db.IsRetryable(err) {
			break
		}
	}
	w.cfg.Observer.Batch(size, time.Since(began))
	if err != nil {
		w.cfg.Observer.MySQLError("write")
		return "", fmt.Errorf("write %d orders: %w", len(work), err)
	}
	return gtid, nil
}

// commitOnce runs the transaction and, where the database keeps a binary
// log, reads its GTID on the same connection. A GTID that cannot be read
// costs the record, not the batch: the orders are committed.
func (w *Writer) commitOnce(ctx context.Context, work []*item) (gtid string, err error) {
	if !w.tellsGTIDs(ctx) {
		return "", w.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return w.write(tx, work) }, w.txOptions())
	}
	err = w.db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if err := conn.Transaction(func(tx *gorm.DB) error { return w.write(tx, work) }, w.txOptions()); err != nil {
			return err
		}
		var gerr error
		gtid, gerr = db.LastGTID(ctx, conn)
		if errors.Is(gerr, db.ErrNoGTIDs) {
			w.gtids.Store(gtidsNone)
			return nil
		}
		// Committed, but unrecorded a failover could lose it unseen: the
		// batch fails and is tried again (its guards find it written, or
		// write it again on a new primary that lost it). A connection that
		// dies just after COMMIT is how a primary's death looks.
		return gerr
	})
	return gtid, err
}

// The answers of tellsGTIDs, kept in Writer.gtids.
const (
	gtidsUnknown int32 = iota
	gtidsTold
	gtidsNone
)

// tellsGTIDs reports whether the database gives each transaction a GTID
// worth recording: MariaDB with a binary log (log_bin, fixed at the
// server's start), not a Galera node (whose nodes' GTIDs need not agree,
// and which loses no commit in a failover). Asked once per server: the
// answer is forgotten when the writer finds the database unverified (a
// new server). SQLite never does.
func (w *Writer) tellsGTIDs(ctx context.Context) bool {
	switch w.gtids.Load() {
	case gtidsTold:
		return true
	case gtidsNone:
		return false
	}
	if w.db.Dialector.Name() != "mysql" {
		w.gtids.Store(gtidsNone)
		return false
	}
	var logBin, wsrep string
	err := w.db.WithContext(ctx).Raw("SELECT IF(@@global.log_bin, 'ON', 'OFF'), IF(@@global.wsrep_on, 'ON', 'OFF')").Row().Scan(&logBin, &wsrep)
	if db.IsUnknownVariable(err) {
		w.gtids.Store(gtidsNone) // MySQL: no wsrep_on, and GTIDs of another kind
		return false
	}
	if err != nil {
		return false // asked again with the next batch
	}
	if logBin != "ON" || wsrep == "ON" {
		w.gtids.Store(gtidsNone)
		return false
	}
	w.gtids.Store(gtidsTold)
	return true
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

// errUnverified means the database's primary changed and has not been
// checked yet (WriterConfig.Verified).
var errUnverified = errors.New("the database's new primary is not checked yet; writes wait")

// errNotReady means a shard's Redis state is being rebuilt.
var errNotReady = errors.New("shard state not ready")

// errBadKeys means a voucher's Redis keys hold something else than the
// scripts read (not a hash, or a stock that is not an integer): a stray
// write or a hand edit. The scripts write nothing for its orders, which
// wait for their retry path until the keys are mended; the other orders
// go on.
var errBadKeys = errors.New("voucher's redis keys hold something the scripts cannot read")
