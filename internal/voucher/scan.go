package voucher

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// scanHash calls each for every field of a hash, one HSCAN page at a time
// (then afterPage, when set): a large hash never blocks Redis in one long
// command.
func (s *State) scanHash(ctx context.Context, key string, each func(field, value string), afterPage func()) error {
	var cursor uint64
	for {
		page, next, err := s.rdb.HScan(ctx, key, cursor, "", inFlightPage).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(page); i += 2 {
			each(page[i], page[i+1])
		}
		if afterPage != nil {
			afterPage()
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// scanPages is scanHash handing each page's fields, as read by field, to
// page, whose error stops the scan.
func (s *State) scanPages(ctx context.Context, key string, field func(k, v string), page func() error) error {
	var perr error
	err := s.scanHash(ctx, key, func(k, v string) {
		if perr == nil {
			field(k, v)
		}
	}, func() {
		if perr == nil {
			perr = page()
		}
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	return perr
}

// Ready reports whether a shard's sale state is loaded (its ready marker
// is there).
func (s *State) Ready(ctx context.Context, shard int) (bool, error) {
	n, err := s.rdb.Exists(ctx, s.keys.Ready(shard)).Result()
	return n == 1, err
}

// Buyers hands the buyers a voucher's bucket in shard holds (order id ->
// user id) to page, a page at a time; an entry the purchase script did
// not write is skipped.
func (s *State) Buyers(ctx context.Context, shard int, voucherID int64, page func(orders map[int64]int64) error) error {
	held := map[int64]int64{}
	return s.scanPages(ctx, s.keys.BuyersAt(shard, voucherID), func(k, v string) {
		user, err1 := strconv.ParseInt(k, 10, 64)
		id, err2 := strconv.ParseInt(v, 10, 64)
		if err1 == nil && err2 == nil {
			held[id] = user
		}
	}, func() error {
		defer clear(held)
		return page(held)
	})
}

// Ended is an order's end as release.lua recorded it beside its voucher's
// buyers: the buyer, and how it ended (EndedCancelled, EndedExpired,
// EndedRefunded).
type Ended struct {
	User int64
	How  string
}

// EndedOrders hands the ended orders a voucher's bucket in shard recorded
// (order id -> its end) to page, a page at a time.
func (s *State) EndedOrders(ctx context.Context, shard int, voucherID int64, page func(ended map[int64]Ended) error) error {
	ended := map[int64]Ended{}
	return s.scanPages(ctx, s.keys.EndedAt(shard, voucherID), func(k, v string) {
		id, err1 := strconv.ParseInt(k, 10, 64)
		user, how, ok := strings.Cut(v, ":")
		uid, err2 := strconv.ParseInt(user, 10, 64)
		if err1 == nil && err2 == nil && ok {
			ended[id] = Ended{User: uid, How: how}
		}
	}, func() error {
		defer clear(ended)
		return page(ended)
	})
}

// InFlight lists a shard's orders accepted and not yet written (its
// pending-order index: on the stream or in the delay queue).
func (s *State) InFlight(ctx context.Context, shard int) (map[int64]bool, error) {
	out := map[int64]bool{}
	err := s.scanHash(ctx, s.keys.Pending(shard), func(k, _ string) {
		if id, err := strconv.ParseInt(k, 10, 64); err == nil {
			out[id] = true
		}
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("read pending orders of shard %d: %w", shard, err)
	}
	return out, nil
}

// ForgetShard drops what the buckets in shard of vs recorded of ended
// orders, and the shard's ready marker: the warmer then rebuilds the
// shard from the database (keeping the orders in flight). For a database
// restored from a dump, whose ends Redis must not write back.
func (s *State) ForgetShard(ctx context.Context, shard int, vs []Voucher) error {
	pipe := s.rdb.Pipeline()
	for _, v := range vs {
		nb := v.BucketCount()
		for b := range nb {
			if s.keys.BucketShard(v.ID, b, nb) == shard {
				pipe.Del(ctx, s.keys.EndedAt(shard, v.ID))
			}
		}
	}
	pipe.Del(ctx, s.keys.Ready(shard))
	_, err := pipe.Exec(ctx)
	return err
}
