// Package draw is a fair opening for a voucher: from when its entries
// open (its creation; with a proof of work, its begin) until its draw
// closes (begin_at + fair window), a purchase enters the voucher's draw
// instead of buying (Router); at the close one instance buys every entry
// through the purchase script, in an order that neither arrival time nor
// retries change (Drawer). The order is fixed by two things no one knows
// together before the close: the draw's secret, whose SHA-256 (the
// commitment) is stored once at creation and published from the start,
// and the closed entry list, whose SHA-256 (the digest) is published at
// the close. Entries are bought by ascending HMAC-SHA256(secret, digest +
// ":" + user id); the secret is derived from a salt in the database with
// a key only the instances hold, and published once the draw is done, so
// anyone can check the result (Check) and no one with the database alone
// can tell a rank before it.
//
//	what                | where                                    | written by
//	--------------------+------------------------------------------+----------------------------------
//	entries             | {shard of bucket 0}:voucher:<v>:draw     | draw_enter.lua, before the close
//	                    | (hash user -> ticket)                    | (a ticket is a winner's order id)
//	closed              | {shard of bucket 0}:voucher:<v>:closed   | draw_close.lua, on Redis's clock,
//	                    |                                          | before the entries are read
//	the lease           | {shard of bucket 0}:voucher:<v>:drawing  | the Drawer (renewed; one at a time)
//	fence tokens        | {shard of bucket 0}:voucher:<v>:fence    | draw_close.lua: a higher one for
//	                    | (the last one given)                     | each drawer, at its close
//	the fence           | draw_fence of every bucket's state       | the Drawer, with its token, which
//	                    |                                          | only rises (draw_fence.lua); its
//	                    |                                          | purchases carry it (ReserveAs)
//	draw done           | {shard of bucket 0}:voucher:<v>:drawn    | the Drawer, after the database
//	the digest          | vouchers.draw_digest                     | the Drawer, at the close
//	the result          | draw_entries, vouchers.draw_secret and   | the Drawer
//	                    | draw_done_at                             |
//
// Between the close and "done" a purchase is answered 503 drawing, so no
// purchase takes a unit ahead of the draw's entries; the sale state itself
// opens at the close (Voucher.SaleBegin), so none can before it either.
package draw

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"

	"seckill/internal/voucher"
)

// entriesKey, doneKey, leaseKey, closedKey and fenceKey are a voucher's draw keys,
// beside its bucket 0's state.
func entriesKey(k voucher.Keys, v int64) string { return k.State(v) + ":draw" }
func doneKey(k voucher.Keys, v int64) string    { return k.State(v) + ":drawn" }
func leaseKey(k voucher.Keys, v int64) string   { return k.State(v) + ":drawing" }
func closedKey(k voucher.Keys, v int64) string  { return k.State(v) + ":closed" }
func fenceKey(k voucher.Keys, v int64) string   { return k.State(v) + ":fence" }

// fenceField is the field of every bucket's state that holds the fence
// token of the drawer buying the draw (purchase.lua reads it).
const fenceField = "draw_fence"

// Entry is one buyer's entry into a draw.
type Entry struct {
	UserID int64 `json:"user_id"`
	Ticket int64 `json:"ticket,string"`
	// Place is the entry's place in the draw's order, from 0.
	Place int  `json:"place"`
	Won   bool `json:"won"`
}

// Digest is the SHA-256 of a closed entry list, in hex: each entry as
// "user id:ticket\n", by ascending user id. Published at the close, it
// makes every rank depend on every entry: no rank can be known, or
// chosen, before the list is closed.
func Digest(entries []Entry) string {
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int { return cmp.Compare(a.UserID, b.UserID) })
	h := sha256.New()
	var line []byte
	for _, e := range sorted {
		line = strconv.AppendInt(line[:0], e.UserID, 10)
		line = append(line, ':')
		line = strconv.AppendInt(line, e.Ticket, 10)
		line = append(line, '\n')
		h.Write(line)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Rank is an entry's key in the draw's order: HMAC-SHA256 under the
// secret (the hex string's bytes) of the entry list's digest, ":" and the
// user id (decimal), in hex. A draw done before digests were published
// (digest "") ranked by the user id alone.
func Rank(secret, digest string, user int64) string {
	m := hmac.New(sha256.New, []byte(secret))
	if digest != "" {
		m.Write([]byte(digest + ":"))
	}
	m.Write([]byte(strconv.FormatInt(user, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// Order sorts entries into the draw's order (ascending Rank, then user
// id) and numbers their places.
func Order(secret, digest string, entries []Entry) {
	ranks := make(map[int64]string, len(entries))
	for _, e := range entries {
		ranks[e.UserID] = Rank(secret, digest, e.UserID)
	}
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := strings.Compare(ranks[a.UserID], ranks[b.UserID]); c != 0 {
			return c
		}
		return cmp.Compare(a.UserID, b.UserID)
	})
	for i := range entries {
		entries[i].Place = i
	}
}
