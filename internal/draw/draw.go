// Package draw is a fair opening for a voucher: from the voucher's
// creation until its draw closes (begin_at + fair window), a purchase
// enters the voucher's draw instead of buying (Router); at the close one
// instance buys every entry through the purchase script, in an order that
// neither arrival time nor retries change (Drawer). The order is fixed by a
// secret chosen when the voucher was created, whose SHA-256 is published
// from the start and which is published itself once the draw is done:
// entries are bought by ascending HMAC-SHA256(secret, user id), so anyone
// can check the result (Check).
//
//	what                | where                                    | written by
//	--------------------+------------------------------------------+----------------------------------
//	entries             | {shard of bucket 0}:voucher:<v>:draw     | draw_enter.lua, before the close
//	                    | (hash user -> ticket)                    | (a ticket is a winner's order id)
//	draw done           | {shard of bucket 0}:voucher:<v>:drawn    | the Drawer, after the database
//	the lease           | {shard of bucket 0}:voucher:<v>:drawing  | the Drawer (renewed; one at a time)
//	the result          | draw_entries, vouchers.draw_done_at      | the Drawer
//
// Between the close and "done" a purchase is answered 503 drawing, so no
// purchase takes a unit ahead of the draw's entries; the sale state itself
// opens at the close (Voucher.SaleBegin), so none can before it either.
package draw

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"seckill/internal/voucher"
)

// entriesKey, doneKey and leaseKey are a voucher's draw keys, beside its
// bucket 0's state.
func entriesKey(k voucher.Keys, v int64) string { return k.State(v) + ":draw" }
func doneKey(k voucher.Keys, v int64) string    { return k.State(v) + ":drawn" }
func leaseKey(k voucher.Keys, v int64) string   { return k.State(v) + ":drawing" }

// Entry is one buyer's entry into a draw.
type Entry struct {
	UserID int64 `json:"user_id"`
	Ticket int64 `json:"ticket,string"`
	// Place is the entry's place in the draw's order, from 0.
	Place int  `json:"place"`
	Won   bool `json:"won"`
}

// Rank is an entry's key in the draw's order: HMAC-SHA256 of the user id
// (decimal) under the secret (the hex string's bytes), in hex.
func Rank(secret string, user int64) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(strconv.FormatInt(user, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// Order sorts entries into the draw's order (ascending Rank, then user
// id) and numbers their places.
func Order(secret string, entries []Entry) {
	ranks := make(map[int64]string, len(entries))
	for _, e := range entries {
		ranks[e.UserID] = Rank(secret, e.UserID)
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := strings.Compare(ranks[a.UserID], ranks[b.UserID]); c != 0 {
			return c
		}
		return int(a.UserID - b.UserID)
	})
	for i := range entries {
		entries[i].Place = i
	}
}
