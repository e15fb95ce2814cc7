package draw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

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

// Fetch reads voucher v's published draw from the service at base (e.g.
// https://shop.example.com), as anyone can: its status, then, once done,
// every page of its entries in order (PageMax a page). A list that does
// not hold the status's count of entries, or whose places do not follow
// on, is an error: a list cut short must not pass Check.
func Fetch(ctx context.Context, client *http.Client, base string, v int64) (Result, error) {
	root := strings.TrimRight(base, "/") + "/api/v1/vouchers/" + strconv.FormatInt(v, 10) + "/draw"
	var st Status
	if err := getJSON(ctx, client, root, &st); err != nil {
		return Result{}, err
	}
	r := Result{VoucherID: v, Draw: st.Draw}
	if st.Draw == nil || st.Draw.Status != "done" {
		return r, nil
	}
	if st.Entries == nil {
		return Result{}, fmt.Errorf("GET %s: a done draw without its entry_count", root)
	}
	r.Entries = make([]Entry, 0, *st.Entries)
	for after := -1; ; {
		var pg Page
		q := url.Values{"after": {strconv.Itoa(after)}, "limit": {strconv.Itoa(PageMax)}}
		if err := getJSON(ctx, client, root+"/entries?"+q.Encode(), &pg); err != nil {
			return Result{}, err
		}
		for _, e := range pg.Entries {
			if e.Place != len(r.Entries) {
				return Result{}, fmt.Errorf("the draw's list holds place %d where place %d belongs", e.Place, len(r.Entries))
			}
			r.Entries = append(r.Entries, e)
		}
		if pg.NextAfter == nil {
			break
		}
		if *pg.NextAfter <= after {
			return Result{}, fmt.Errorf("the draw's list goes back from place %d to %d", after, *pg.NextAfter)
		}
		after = *pg.NextAfter
	}
	if len(r.Entries) != *st.Entries {
		return Result{}, fmt.Errorf("the draw's list holds %d entries, its status counts %d", len(r.Entries), *st.Entries)
	}
	return r, nil
}

// getJSON decodes the 200 answer of GET u into v.
func getJSON(ctx context.Context, client *http.Client, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}
