package draw

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"seckill/internal/failing"
	"seckill/internal/lease"
	"seckill/internal/voucher"
	"seckill/lua"
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
	// Deadline bounds the buying of a draw: an entry still unbought this
	// long after the drawer began buying (its bucket never settles: units
	// that stay in transit, a master that stays away) ends the draw, with
	// it and the entries after it not won and their units on sale
	// (default 2m). A draw always ends: only a drawer stopped half-way
	// (killed, its lease lost) starts it again.
	Deadline time.Duration
	// Key is the instances' draw key, which derives each draw's secret
	// from its salt (voucher.DrawSecretOf); a voucher made before keys
	// existed keeps its secret in the database and needs none.
	Key []byte
	// Now is the instance's clock (default time.Now): when it says a
	// draw closed, Redis's clock still decides (draw_close.lua).
	Now func() time.Time
}

// Buyer buys an entry with the drawer's fence token (voucher.Reserver).
type Buyer interface {
	ReserveAs(ctx context.Context, voucherID, userID, orderID int64, fence string) (voucher.Reservation, error)
}

// Drawer draws the fair vouchers whose draw closed, on every instance, one
// instance per draw at a time (a lease kept by a watchdog). The draw is
// closed on Redis's clock (draw_close.lua, which also gives the drawer a
// fence token above every earlier drawer's) before its entries are read;
// their digest is published, the secret derived and held to its
// commitment, every bucket fenced with the token, and the entries bought
// in their order through the purchase script, each with its ticket as the
// order id and the token: a draw cut short (the instance killed) is drawn
// again from the start by the next, an entry bought before answers as
// replayed, never bought twice, and a drawer that lost its lease buys
// nothing once a newer one fenced the buckets. Then the result and the
// secret go to the database, and the draw is marked done in Redis.
type Drawer struct {
	db    *gorm.DB
	rdb   redis.UniversalClient
	keys  voucher.Keys
	buyer Buyer
	cfg   DrawerConfig
	log   *slog.Logger
	close *redis.Script
	fencs *redis.Script
}

// NewDrawer returns a Drawer that buys through reserver.
func NewDrawer(db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, reserver Buyer, cfg DrawerConfig, log *slog.Logger) *Drawer {
	cfg.Every = cmp.Or(cfg.Every, 500*time.Millisecond)
	cfg.Lease = max(cmp.Or(cfg.Lease, 10*time.Second), lease.Min)
	cfg.Retry = cmp.Or(cfg.Retry, 50*time.Millisecond)
	cfg.Deadline = cmp.Or(cfg.Deadline, 2*time.Minute)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Drawer{db: db, rdb: rdb, keys: keys, buyer: reserver, cfg: cfg, log: log, close: lua.DrawClose(), fencs: lua.DrawFence()}
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
// the mark, or a bucket may not have been opened). It reads the live fair vouchers only: every instance passes
// twice a second, whatever else is on sale.
func (d *Drawer) Pass(ctx context.Context) error {
	now := d.cfg.Now()
	vs, err := voucher.NewStore(d.db).LiveFair(ctx, now)
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range vs {
		switch {
		case v.DrawDoneAt != nil:
			errs = append(errs, d.done(ctx, v))
		case !now.Before(v.DrawClose()):
			errs = append(errs, d.Draw(ctx, v))
		}
	}
	return errors.Join(errs...)
}

// Draw draws voucher v unless another instance is drawing it, or Redis's
// clock says its draw has not closed yet.
func (d *Drawer) Draw(ctx context.Context, v voucher.Voucher) error {
	l, took, err := lease.Take(ctx, d.rdb, leaseKey(d.keys, v.ID), d.cfg.Lease)
	if err != nil || !took {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	began := time.Now()
	token, err := d.closeOnRedis(l.Context(), v)
	if err != nil || token == "" {
		return err // not closed on Redis's clock yet: the next pass
	}
	entries, err := d.entries(l.Context(), v.ID)
	if err != nil {
		return err
	}
	secret, err := d.secret(v)
	if err != nil {
		return err
	}
	digest, err := d.publishDigest(l.Context(), v, entries)
	if err != nil {
		return err
	}
	Order(secret, digest, entries)
	if err := d.fence(l.Context(), v, token); err != nil {
		return err
	}
	won, late := 0, 0
	deadline := time.Now().Add(d.cfg.Deadline)
	for i := range entries {
		if time.Now().After(deadline) {
			// Its bucket never settled: this entry and the rest are not
			// won, and the sale opens. A draw always ends.
			late = len(entries) - i
			break
		}
		if entries[i].Won, err = d.buy(l, v, entries[i], token, deadline); err != nil {
			return fmt.Errorf("draw voucher %d: entry %d of %d: %w", v.ID, i, len(entries), err)
		}
		if entries[i].Won {
			won++
		}
	}
	if late > 0 {
		d.log.Warn("draw ended at its deadline: entries whose bucket never settled are not won", "voucher", v.ID,
			"not_bought", late, "deadline", deadline)
	}
	if err := d.record(l.Context(), v.ID, secret, entries); err != nil {
		return err
	}
	if err := d.done(l.Context(), v); err != nil {
		return err
	}
	d.log.Info("draw done", "voucher", v.ID, "entries", len(entries), "won", won, "digest", digest, "took_ms", time.Since(began).Milliseconds())
	return nil
}

// closeOnRedis marks v's draw closed once Redis's clock has passed its
// close (draw_close.lua): no entry is taken after that, so the entries
// read next are all there will be. It returns this drawer's fence token,
// above every one given before for the draw, or "" while Redis's clock
// has not got to the close.
func (d *Drawer) closeOnRedis(ctx context.Context, v voucher.Voucher) (string, error) {
	keys := []string{entriesKey(d.keys, v.ID), closedKey(d.keys, v.ID), fenceKey(d.keys, v.ID)}
	res, err := d.close.Run(ctx, d.rdb, keys, v.DrawClose().UnixMilli()).Slice()
	if err != nil {
		return "", fmt.Errorf("close the draw of voucher %d: %w", v.ID, err)
	}
	code, _ := res[0].(int64)
	switch {
	case code == 0 && len(res) == 2:
		return "", nil
	case code == 1 && len(res) == 3:
		if token, _ := res[2].(string); token != "" {
			return token, nil
		}
	case code == 8 && len(res) == 2:
		return "", fmt.Errorf("close the draw of voucher %d: key %v: %w", v.ID, res[1], voucher.ErrWrongType)
	}
	return "", fmt.Errorf("close the draw of voucher %d: answer %v", v.ID, res)
}

// entries reads a closed draw's entries, a page at a time (the list no
// longer changes).
func (d *Drawer) entries(ctx context.Context, v int64) ([]Entry, error) {
	var out []Entry
	var cursor uint64
	for {
		page, next, err := d.rdb.HScan(ctx, entriesKey(d.keys, v), cursor, "", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("read the entries of voucher %d's draw: %w", v, err)
		}
		for i := 0; i+1 < len(page); i += 2 {
			user, err1 := strconv.ParseInt(page[i], 10, 64)
			ticket, err2 := strconv.ParseInt(page[i+1], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("voucher %d's draw holds entry %q -> %q", v, page[i], page[i+1])
			}
			out = append(out, Entry{UserID: user, Ticket: ticket})
		}
		if next == 0 {
			return out, nil
		}
		cursor = next
	}
}

// ErrCommitment means the secret a draw would be drawn with is not the one
// its commitment binds: the draw key changed (SECKILL_TOKEN_SECRET), or
// the salt was edited. The draw is not drawn; an operator decides.
var ErrCommitment = errors.New("the draw's secret does not match its published commitment")

// secret is v's draw secret: derived from its salt with the draw key and
// held to the commitment published at creation; a voucher made before
// commitments were stored keeps its secret in the database.
func (d *Drawer) secret(v voucher.Voucher) (string, error) {
	if v.DrawCommitment == "" {
		return v.DrawSecret, nil
	}
	if d.cfg.Key == nil {
		return "", fmt.Errorf("draw voucher %d: no draw key to derive its secret", v.ID)
	}
	secret := voucher.DrawSecretOf(d.cfg.Key, v.DrawSalt)
	if voucher.DrawCommitment(secret) != v.DrawCommitment {
		return "", fmt.Errorf("draw voucher %d: commitment %s: %w", v.ID, v.DrawCommitment, ErrCommitment)
	}
	return secret, nil
}

// publishDigest writes the closed entry list's digest on v's row, once: a
// draw drawn again finds it there, and must find the same list.
func (d *Drawer) publishDigest(ctx context.Context, v voucher.Voucher, entries []Entry) (string, error) {
	digest := Digest(entries)
	if err := d.db.WithContext(ctx).Model(&voucher.Voucher{}).Where("id = ? AND draw_digest = ''", v.ID).
		Update("draw_digest", digest).Error; err != nil {
		return "", fmt.Errorf("publish the digest of voucher %d's draw: %w", v.ID, err)
	}
	var held string
	if err := d.db.WithContext(ctx).Raw("SELECT draw_digest FROM vouchers WHERE id = ?", v.ID).Row().Scan(&held); err != nil {
		return "", fmt.Errorf("read the digest of voucher %d's draw: %w", v.ID, err)
	}
	if held != digest {
		return "", fmt.Errorf("draw voucher %d: its closed entry list changed since its digest %s was published (now %s): "+
			"Redis lost or gained entries after the close; an operator decides", v.ID, held, digest)
	}
	return digest, nil
}

// done opens every bucket of v to any buyer (draw_pending 0: the purchase
// script sells to the drawer alone before) and then marks the draw done
// for the Routers. The database holds the result already.
func (d *Drawer) done(ctx context.Context, v voucher.Voucher) error {
	nb := v.BucketCount()
	for b := range nb {
		key := d.keys.StateAt(d.keys.BucketShard(v.ID, b, nb), v.ID)
		if err := d.fencs.Run(ctx, d.rdb, []string{key}, "open").Err(); err != nil {
			return fmt.Errorf("open bucket %d of voucher %d after its draw: %w", b, v.ID, err)
		}
	}
	if err := d.rdb.Set(ctx, doneKey(d.keys, v.ID), "1", 0).Err(); err != nil {
		return fmt.Errorf("mark the draw of voucher %d done: %w", v.ID, err)
	}
	return nil
}

// errSuperseded means a drawer holding a newer fence token took the draw
// over: this one stops, buying nothing more.
var errSuperseded = errors.New("another drawer took the draw over (its fence token is newer)")

// fence fences every bucket of v with the drawer's token (draw_fence.lua):
// from then on only this drawer's purchases of the draw are taken
// (purchase.lua). A bucket holding a newer token stops the drawer; one
// without state is left to its purchases, which answer so.
func (d *Drawer) fence(ctx context.Context, v voucher.Voucher, token string) error {
	nb := v.BucketCount()
	for b := range nb {
		key := d.keys.StateAt(d.keys.BucketShard(v.ID, b, nb), v.ID)
		got, err := d.fencs.Run(ctx, d.rdb, []string{key}, token).Int64()
		switch {
		case err != nil:
			return fmt.Errorf("fence bucket %d of voucher %d's draw: %w", b, v.ID, err)
		case got == 0:
			return fmt.Errorf("fence bucket %d of voucher %d's draw with token %s: %w", b, v.ID, token, errSuperseded)
		}
	}
	return nil
}

// buy buys one entry through the purchase script, its ticket as the order
// id and the drawer's fence token with it, until judge calls the answer
// final or the draw's deadline passes (then: not won). An answer that
// needs an operator stops the draw (Run logs it) and the next pass draws
// again from the start. No purchase is sent once the lease is known lost,
// and none is taken once a newer drawer fenced the buckets: a drawer
// resumed from a pause past its lease buys nothing.
func (d *Drawer) buy(l *lease.Lease, v voucher.Voucher, e Entry, token string, deadline time.Time) (bool, error) {
	ctx := l.Context()
	for {
		if err := l.Err(); err != nil {
			return false, err
		}
		_, err := d.buyer.ReserveAs(ctx, v.ID, e.UserID, e.Ticket, token)
		switch judge(err, e.Ticket) {
		case drawn:
			return true, nil
		case notDrawn:
			return false, nil
		case stopDraw:
			return false, err
		case refence:
			// A rebuild of a bucket dropped its fence, or a newer drawer
			// holds it: fenced again, unless it is newer (then this
			// drawer stops).
			if ferr := d.fence(ctx, v, token); ferr != nil {
				return false, ferr
			}
		}
		if time.Now().After(deadline) {
			return false, nil
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
	askAgain                // a pause: asked again, until the draw's deadline
	refence                 // the bucket's fence is not this drawer's: fenced again, asked again
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
//	fenced by another token                  refence    a rebuild dropped the fence, or a newer drawer holds it (fence says)
//	units in transit between buckets         askAgain   they arrive within the apply window
//	shard not ready, no state for it yet     askAgain   a rebuild or a load under way
//	sale not started                         askAgain   the clocks of instance and Redis apart at the close
//	not confirmed by replicas                askAgain   it may have been taken: the same ticket answers it
//	a key of the wrong type                  stopDraw   no try can succeed until an operator removes it
//	anything else (Redis unreachable, ...)   askAgain   the answer may be lost: the same ticket makes a try again safe
//
// An entry asked again past the draw's deadline is not won (buy).
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
	case errors.Is(err, voucher.ErrFenced):
		return refence
	case errors.Is(err, voucher.ErrWrongType):
		return stopDraw
	}
	return askAgain
}

// record writes the draw's result, reveals its secret and marks it done,
// in one transaction; a result recorded before (a draw drawn again) is
// kept.
func (d *Drawer) record(ctx context.Context, v int64, secret string, entries []Entry) error {
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
			Updates(map[string]any{"draw_done_at": time.Now().UTC(), "draw_secret": secret}).Error
	})
	if err != nil {
		return fmt.Errorf("record the draw of voucher %d: %w", v, err)
	}
	return nil
}
