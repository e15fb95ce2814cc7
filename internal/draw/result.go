package draw

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/voucher"
)

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
	if d.Digest != "" && Digest(r.Entries) != d.Digest {
		return fmt.Errorf("the published entries' digest is %s, not the digest %s published at the close", Digest(r.Entries), d.Digest)
	}
	again := make([]Entry, len(r.Entries))
	copy(again, r.Entries)
	Order(d.Secret, d.Digest, again)
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
