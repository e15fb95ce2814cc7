package draw

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"seckill/internal/apierr"
	"seckill/internal/failing"
	"seckill/internal/lease"
	"seckill/internal/voucher"
)

// entryRow is a row of draw_entries (sql/*/0008_voucher_draw.sql).
type entryRow struct {
	VoucherID int64 `gorm:"column:voucher_id;primaryKey"`
	UserID    int64 `gorm:"column:user_id;primaryKey"`
	TicketID  int64 `gorm:"column:ticket_id"`
	Place     int   `gorm:"column:place"`
	Won       bool  `gorm:"column:won"`
}

func (entryRow) TableName() string { return "draw_entries" }

// DrawerConfig tunes a Drawer; zero fields take the defaults.
type DrawerConfig struct {
	// Every is how often it looks for draws that closed (default 500ms):
	// a draw starts within it of its close.
	Every time.Duration
	// Lease is the life of a draw's lease, renewed while it is drawn
	// (default 10s).
	Lease time.Duration
	// Retry is the wait before a purchase that paused is tried again
	// (default 50ms).
	Retry time.Duration
	// GiveUp is how long one entry's purchase is tried again before the
	// draw stops with its last answer, to be drawn again by the next pass
	// (default 10s).
	GiveUp time.Duration
}

// Drawer draws the fair vouchers whose draw closed, on every instance, one
// instance per draw at a time (a lease kept by a watchdog). A draw is
// bought entry by entry in its order through the purchase script, with
// each entry's ticket as the order id: a draw cut short (the instance
// killed) is drawn again from the start by the next, and an entry bought
// before answers as replayed, never bought twice. Then the result goes
// to the database, and the draw is marked done in Redis.
type Drawer struct {
	db       *gorm.DB
	rdb      redis.UniversalClient
	keys     voucher.Keys
	reserver *voucher.Reserver
	cfg      DrawerConfig
	log      *slog.Logger
}

// NewDrawer returns a Drawer that buys through reserver.
func NewDrawer(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, reserver *voucher.Reserver, cfg DrawerConfig, log *slog.Logger) *Drawer {
	cfg.Every = cmp.Or(cfg.Every, 500*time.Millisecond)
	cfg.Lease = max(cmp.Or(cfg.Lease, 10*time.Second), lease.Min)
	cfg.Retry = cmp.Or(cfg.Retry, 50*time.Millisecond)
	cfg.GiveUp = cmp.Or(cfg.GiveUp, 10*time.Second)
	return &Drawer{db: db, rdb: rdb, keys: keys, reserver: reserver, cfg: cfg, log: log}
}

// Run draws until ctx is done.
func (d *Drawer) Run(ctx context.Context) error {
	t := time.NewTicker(d.cfg.Every)
	defer t.Stop()
	rounds := failing.Log{Log: d.log, What: "draw"}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rounds.Round(ctx, d.Pass(ctx))
	}
}

// Pass draws every live fair voucher whose draw closed and is not done,
// and marks done in Redis those the database says are (Redis may have lost
// the mark). It reads the live fair vouchers only: every instance passes
// twice a second, whatever else is on sale.
func (d *Drawer) Pass(ctx context.Context) error {
	now := time.Now()
	vs, err := voucher.NewStore(d.db).LiveFair(ctx, now)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vs {
		switch {
		case v.DrawDoneAt != nil:
			errs = append(errs, d.rdb.Set(ctx, doneKey(d.keys, v.ID), "1", 0).Err())
		case !now.Before(v.DrawClose()):
			errs = append(errs, d.Draw(ctx, v))
		}
	}
	return errors.Join(errs...)
}

// Draw draws voucher v unless another instance is drawing it.
func (d *Drawer) Draw(ctx context.Context, v voucher.Voucher) error {
	l, took, err := lease.Take(ctx, d.rdb, leaseKey(d.keys, v.ID), d.cfg.Lease)
	if err != nil || !took {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	began := time.Now()
	entries, err := d.entries(l.Context(), v.ID)
	if err != nil {
		return err
	}
	Order(v.DrawSecret, entries)
	won := 0
	for i := range entries {
		if entries[i].Won, err = d.buy(l, v.ID, entries[i]); err != nil {
			return fmt.Errorf("draw voucher %d: entry %d of %d: %w", v.ID, i, len(entries), err)
		}
		if entries[i].Won {
			won++
		}
	}
	if err := d.record(l.Context(), v.ID, entries); err != nil {
		return err
	}
	if err := d.rdb.Set(l.Context(), doneKey(d.keys, v.ID), "1", 0).Err(); err != nil {
		return fmt.Errorf("mark the draw of voucher %d done: %w", v.ID, err)
	}
	d.log.Info("draw done", "voucher", v.ID, "entries", len(entries), "won", won, "took_ms", time.Since(began).Milliseconds())
	return nil
}

// entries reads a draw's entries.
func (d *Drawer) entries(ctx context.Context, v int64) ([]Entry, error) {
	m, err := d.rdb.HGetAll(ctx, entriesKey(d.keys, v)).Result()
	if err != nil {
		return nil, fmt.Errorf("read the entries of voucher %d's draw: %w", v, err)
	}
	out := make([]Entry, 0, len(m))
	for u, t := range m {
		user, err1 := strconv.ParseInt(u, 10, 64)
		ticket, err2 := strconv.ParseInt(t, 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("voucher %d's draw holds entry %q -> %q", v, u, t)
		}
		out = append(out, Entry{UserID: user, Ticket: ticket})
	}
	return out, nil
}

// buy buys one entry through the purchase script, its ticket as the order
// id, until judge calls the answer final. A pause is asked again for at
// most GiveUp; then, or on an answer that needs an operator, the draw
// stops with it (Run logs it) and the next pass draws again from the
// start. No purchase is sent once the lease is known lost: a drawer
// resumed from a pause past its lease stops at once.
func (d *Drawer) buy(l *lease.Lease, v int64, e Entry) (bool, error) {
	ctx := l.Context()
	until := time.Now().Add(d.cfg.GiveUp)
	for {
		if err := l.Err(); err != nil {
			return false, err
		}
		_, err := d.reserver.Reserve(ctx, v, e.UserID, e.Ticket)
		switch judge(err, e.Ticket) {
		case drawn:
			return true, nil
		case notDrawn:
			return false, nil
		case stopDraw:
			return false, err
		}
		if time.Now().After(until) {
			return false, fmt.Errorf("no final answer within %s: %w", d.cfg.GiveUp, err)
		}
		select {
		case <-ctx.Done():
			return false, context.Cause(ctx)
		case <-time.After(d.cfg.Retry):
		}
	}
}

// verdict is what a draw makes of one answer to an entry's purchase.
type verdict int

const (
	drawn    verdict = iota // bought now, or before (a draw drawn again)
	notDrawn                // no unit for it
	askAgain                // a pause: asked again
	stopDraw                // needs an operator: the draw stops with it
)

// judge is the draw's table of the purchase script's answers, the one
// the code follows (TestJudgeTable enumerates it):
//
//	answer                                   verdict    why
//	accepted                                 drawn
//	purchased, with this entry's ticket      drawn      bought by a draw cut short
//	purchased, with another order            notDrawn   the buyer holds another order
//	sold out, sale ended                     notDrawn
//	units in transit between buckets         askAgain   they arrive within the apply window
//	shard not ready, no state for it yet     askAgain   a rebuild or a load under way
//	sale not started                         askAgain   the clocks of instance and Redis apart at the close
//	not confirmed by replicas                askAgain   it may have been taken: the same ticket answers it
//	a key of the wrong type                  stopDraw   no try can succeed until an operator removes it
//	anything else (Redis unreachable, ...)   askAgain   the answer may be lost: the same ticket makes a try again safe
func judge(err error, ticket int64) verdict {
	var held *voucher.PurchasedError
	switch {
	case err == nil:
		return drawn
	case errors.As(err, &held):
		if held.OrderID == ticket {
			return drawn
		}
		return notDrawn
	case errors.Is(err, voucher.ErrSoldOut), errors.Is(err, voucher.ErrEnded):
		return notDrawn
	case errors.Is(err, voucher.ErrWrongType):
		return stopDraw
	}
	return askAgain
}

// record writes the draw's result and marks it done, in one transaction;
// a result recorded before (a draw drawn again) is kept.
func (d *Drawer) record(ctx context.Context, v int64, entries []Entry) error {
	rows := make([]entryRow, len(entries))
	for i, e := range entries {
		rows[i] = entryRow{VoucherID: v, UserID: e.UserID, TicketID: e.Ticket, Place: e.Place, Won: e.Won}
	}
	err := d.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if len(rows) > 0 {
			if err := tx.Clauses(clause.OnConflict{DoNothing: true}).CreateInBatches(rows, 500).Error; err != nil {
				return err
			}
		}
		return tx.Model(&voucher.Voucher{}).Where("id = ? AND draw_done_at IS NULL", v).
			Update("draw_done_at", time.Now().UTC()).Error
	})
	if err != nil {
		return fmt.Errorf("record the draw of voucher %d: %w", v, err)
	}
	return nil
}

// Result is a draw as published: the voucher's draw and, once done, every
// entry in the draw's order.
type Result struct {
	VoucherID int64             `json:"voucher_id"`
	Draw      *voucher.DrawView `json:"draw"`
	Entries   []Entry           `json:"entries,omitempty"`
}

// Results reads voucher v's draw; ErrNoDraw for a voucher without one.
func Results(ctx context.Context, db *gorm.DB, v int64) (Result, error) {
	vc, err := voucher.NewStore(db).Get(ctx, v)
	if err != nil {
		return Result{}, err
	}
	if !vc.Fair() {
		return Result{}, fmt.Errorf("voucher %d: %w", v, ErrNoDraw)
	}
	r := Result{VoucherID: v, Draw: voucher.DrawOf(vc, time.Now())}
	if vc.DrawDoneAt == nil {
		return r, nil
	}
	var rows []entryRow
	if err := db.WithContext(ctx).Where("voucher_id = ?", v).Order("place").Find(&rows).Error; err != nil {
		return Result{}, fmt.Errorf("read the draw of voucher %d: %w", v, err)
	}
	r.Entries = make([]Entry, len(rows))
	for i, row := range rows {
		r.Entries[i] = Entry{UserID: row.UserID, Ticket: row.TicketID, Place: row.Place, Won: row.Won}
	}
	return r, nil
}

// ErrNoDraw means the voucher opens without a draw.
var ErrNoDraw = errors.New("no draw")

// Check recomputes a published draw: the secret matches the commitment,
// every entry is at the place its rank gives, and the winners are the
// first entries in that order (each bought in turn until the units ran
// out). It returns what is wrong, or nil.
func Check(r Result) error {
	d := r.Draw
	switch {
	case d == nil || d.Status != "done":
		return errors.New("the draw is not done: nothing to check yet")
	case voucher.DrawCommitment(d.Secret) != d.Commitment:
		return fmt.Errorf("the secret's SHA-256 is not the published commitment %s", d.Commitment)
	}
	again := make([]Entry, len(r.Entries))
	copy(again, r.Entries)
	Order(d.Secret, again)
	var errs []error
	lost := false
	for i, e := range again {
		if got := r.Entries[i]; got.UserID != e.UserID || got.Place != i {
			errs = append(errs, fmt.Errorf("place %d: published user %d, the secret orders user %d there", i, got.UserID, e.UserID))
		}
		switch {
		case !e.Won:
			lost = true
		case lost:
			errs = append(errs, fmt.Errorf("place %d (user %d) won after an earlier entry lost", i, e.UserID))
		}
	}
	return errors.Join(errs...)
}

// Show serves GET /api/v1/vouchers/:id/draw: the draw's commitment and
// state, and once it is done its secret and every entry in order.
func Show(db *gorm.DB, log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		id, ok := apierr.PathID(c, "id")
		if !ok {
			return
		}
		r, err := Results(c.Request.Context(), db, id)
		switch {
		case errors.Is(err, voucher.ErrNotFound):
			apierr.Abort(c, http.StatusNotFound, "voucher_not_found", "no voucher has this id")
		case errors.Is(err, ErrNoDraw):
			apierr.Abort(c, http.StatusNotFound, "no_draw", "this voucher opens without a draw")
		case err != nil:
			log.Error("read a draw failed", "voucher", id, "err", err)
			apierr.Unavailable(c, "unavailable", "the draw cannot be read right now")
		default:
			c.JSON(http.StatusOK, r)
		}
	}
}
