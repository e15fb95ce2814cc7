package voucher

import (
	"cmp"
	"strconv"
	"time"

	"seckill/internal/redisconn"
)

// Keys spells every Redis key of the sale state and the order stream. All
// keys of one voucher, and the stream its orders go to, carry the hash tag of
// the voucher's shard, so one script's keys share a Redis Cluster slot.
//
// Each shard's tag is spelled once, at construction; a Keys is a small
// value, cheap to copy, and read-only after that.
type Keys struct {
	prefix string
	tags   []string // tags[shard] is the hash-tagged head of the shard's keys
}

// NewKeys returns the key names under prefix (default "seckill") for the
// given number of stream shards (default 1), for a single Redis server:
// shard N's tag is "{N}". The shard count is fixed for the life of the
// data: changing it moves vouchers to other shards.
func NewKeys(prefix string, shards int) Keys {
	k := Keys{prefix: cmp.Or(prefix, "seckill"), tags: make([]string, max(shards, 1))}
	for s := range k.tags {
		k.tags[s] = k.plainTag(s)
	}
	return k
}

// NewClusterKeys returns the key names for a Redis Cluster: like NewKeys,
// but each shard's tag is chosen so that the shards spread evenly over the
// cluster's slots. Shard i of n gets the first tag "{i.k}", k = 0, 1, ...,
// whose slot lies in the middle half of the i-th of n equal parts of the
// slot range. A cluster whose masters serve equal contiguous ranges (what
// redis-cli --cluster create makes) then holds n/M shards on each of its M
// masters when M divides n, and as close to that as contiguous parts allow
// otherwise. The tags depend on prefix and n alone, so every process
// finds the same ones. The prefix must hold no '{' or '}', which would move
// the hash tag.
func NewClusterKeys(prefix string, shards int) Keys {
	k := Keys{prefix: cmp.Or(prefix, "seckill"), tags: make([]string, max(shards, 1))}
	for s := range k.tags {
		k.tags[s] = k.prefix + ":{" + spreadTag(s, len(k.tags)) + "}"
	}
	return k
}

// KeysFor returns NewClusterKeys on a Redis Cluster, NewKeys otherwise.
func KeysFor(prefix string, shards int, cluster bool) Keys {
	if cluster {
		return NewClusterKeys(prefix, shards)
	}
	return NewKeys(prefix, shards)
}

// spreadTag finds the hash tag content of shard i of n: the first "i.k"
// whose slot lies in the middle half of the i-th of n equal parts of the
// slot range. The middle half keeps a quarter part of margin from the
// part's ends, where the masters' ranges may meet.
func spreadTag(i, n int) string {
	lo, hi := i*redisconn.SlotCount/n, (i+1)*redisconn.SlotCount/n
	margin := (hi - lo) / 4
	lo, hi = lo+margin, max(hi-margin, lo+margin+1)
	head := strconv.Itoa(i) + "."
	headHash := redisconn.SlotHash(0).Add(head)
	// k = 10*stem + d, in increasing order: stem 0 stands for no leading
	// digits (k < 10). The hash of head and stem serves ten candidates.
	var digits []byte
	for stem := 0; ; stem++ {
		h := headHash
		if stem > 0 {
			digits = strconv.AppendInt(digits[:0], int64(stem), 10)
			for _, c := range digits {
				h = h.AddByte(c)
			}
		}
		for d := byte('0'); d <= '9'; d++ {
			if s := h.AddByte(d).Slot(); lo <= s && s < hi {
				return head + string(digits) + string(d)
			}
		}
	}
}

// plainTag is the single-server spelling of a shard's tag.
func (k Keys) plainTag(shard int) string { return k.prefix + ":{" + strconv.Itoa(shard) + "}" }

// Shards is the number of stream shards.
func (k Keys) Shards() int { return len(k.tags) }

// Prefix is the key prefix, for components that name keys of their own.
func (k Keys) Prefix() string { return k.prefix }

// Shard is the shard a voucher's keys and orders live in.
func (k Keys) Shard(voucherID int64) int { return int(uint64(voucherID) % uint64(len(k.tags))) }

// InShards is Shard as an SQL condition on a voucher id column (ids are
// positive): the rows of vouchers that live in one of shards. Use it with
// Where(cond, args...).
func (k Keys) InShards(column string, shards []int) (cond string, args []any) {
	return column + " % ? IN ?", []any{len(k.tags), shards}
}

// Tag is the hash-tagged head of every key of a shard. A shard outside
// 0..Shards()-1 gets the single-server spelling.
func (k Keys) Tag(shard int) string {
	if uint(shard) < uint(len(k.tags)) {
		return k.tags[shard]
	}
	return k.plainTag(shard)
}

// Ready marks a shard whose state was loaded from MySQL; purchases fail
// closed while it is missing.
func (k Keys) Ready(shard int) string { return k.Tag(shard) + ":ready" }

// Rebuilding is held by the one instance rebuilding a shard's state.
func (k Keys) Rebuilding(shard int) string { return k.Tag(shard) + ":rebuilding" }

// State is a voucher's sale state: stock, begin_ms, end_ms.
func (k Keys) State(voucherID int64) string {
	return k.tags[k.Shard(voucherID)] + ":voucher:" + strconv.FormatInt(voucherID, 10)
}

// Buyers maps each buyer of a voucher to their order id.
func (k Keys) Buyers(voucherID int64) string {
	return k.tags[k.Shard(voucherID)] + ":voucher:" + strconv.FormatInt(voucherID, 10) + ":buyers"
}

// Stream is a shard's order stream.
func (k Keys) Stream(shard int) string { return k.Tag(shard) + ":orders" }

// Pending indexes a shard's accepted orders not yet written to MySQL:
// order id -> "user id:voucher id".
func (k Keys) Pending(shard int) string { return k.Tag(shard) + ":pending" }

// Delayed is a shard's delay queue: orders waiting to go back onto the
// shard's stream (a buyer lock was held elsewhere).
func (k Keys) Delayed(shard int) string { return k.Tag(shard) + ":delayed" }

// DBSeen is a shard's record of the database: the database's lineage
// token, and per GTID origin (domain and server_id) the highest
// transaction whose orders the shard settled or whose commit an instance
// saw (hash: lineage -> token, g:<domain>-<server> -> sequence number).
// A database that lacks one of them lost it (package failover).
func (k Keys) DBSeen(shard int) string { return k.Tag(shard) + ":db" }

// EndedAt records, beside the buyers of a voucher's bucket in shard, the
// orders whose unit went back on sale because they ended (hash: order id
// -> "user id:how", how one of the Ended* values): what Redis still knows
// of an order's cancellation or refund if the database loses it.
func (k Keys) EndedAt(shard int, voucherID int64) string {
	return k.StateAt(shard, voucherID) + ":ended"
}

// How an order ended, as EndedAt records it.
const (
	EndedCancelled = "cancelled"
	EndedExpired   = "expired"
	EndedRefunded  = "refunded"
)

// Events is the pub/sub channel on which whatever can make an instance's
// local refusals wrong is announced (refusals.go): a unit given back, a
// buyer entry removed, a shard rebuilt, a voucher's state loaded. Classic
// PUBLISH reaches the subscribers of every node of a Redis Cluster, so the
// channel carries no hash tag.
func (k Keys) Events() string { return k.prefix + ":events" }

// MaxBuckets bounds a voucher's buckets (the schema's check says the
// same); a voucher also has at most one bucket per shard.
const MaxBuckets = 64

// BucketCount is v's number of buckets, 1 for a voucher written before
// buckets existed (0 in memory).
func (v Voucher) BucketCount() int { return max(v.Buckets, 1) }

// Fair reports whether the voucher opens with a draw.
func (v Voucher) Fair() bool { return v.FairWindowMs > 0 }

// DrawClose is when a fair voucher's draw stops taking entries and is
// drawn: BeginAt + the fair window.
func (v Voucher) DrawClose() time.Time {
	return v.BeginAt.Add(time.Duration(v.FairWindowMs) * time.Millisecond)
}

// Fields of a fair voucher's sale state (every bucket's), read by the
// draw's Router so that a purchase finds its draw without the database.
const (
	FieldDrawClose     = "draw_close_ms"
	FieldDrawOpens     = "draw_opens_ms"
	FieldDrawPow       = "draw_pow"
	FieldDrawChallenge = "draw_challenge"
	// FieldDrawPending is 1 until the draw is done: the purchase script
	// then sells only to the drawer (its fence token), whatever an
	// instance believes. The drawer sets it to 0 in every bucket once the
	// result is recorded.
	FieldDrawPending = "draw_pending"
)

// DrawFields are a fair voucher's draw fields of its sale state: field,
// value, ...; none for a voucher without a draw. Entries open at
// draw_opens_ms (0: at once); draw_pending is 1 until the database says
// the draw is done.
func DrawFields(v Voucher) []any {
	if !v.Fair() {
		return nil
	}
	var opens int64
	if v.PowBits > 0 {
		opens = v.EntriesOpen().UnixMilli()
	}
	pending := 1
	if v.DrawDoneAt != nil {
		pending = 0
	}
	return []any{FieldDrawClose, v.DrawClose().UnixMilli(), FieldDrawOpens, opens, FieldDrawPow, v.PowBits, FieldDrawChallenge, DrawChallenge(v),
		FieldDrawPending, pending}
}

// SaleBegin is when the purchase script starts selling: BeginAt, or for a
// fair voucher the draw's close, so that no purchase reaches the stock
// before the draw's entries do.
func (v Voucher) SaleBegin() time.Time { return v.DrawClose() }

// Home is the bucket a buyer buys in, of nb: a stable hash of the user id
// (splitmix64's finaliser), 0 when nb <= 1. It is frozen: one order per
// buyer holds across buckets only because a buyer is never sent to any
// other bucket of a voucher, and a voucher's nb never changes. A golden
// test holds its values.
func Home(userID int64, nb int) int {
	if nb <= 1 {
		return 0
	}
	z := uint64(userID) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return int(z % uint64(nb))
}

// BucketShard is the shard that holds bucket b of a voucher with nb
// buckets: bucket 0 is the voucher's own shard (Shard), and the others
// follow at a stride of Shards()/nb, so with shards spread over the
// masters (NewClusterKeys) the buckets land on different masters. A shard
// holds at most one bucket of a voucher while nb <= Shards().
func (k Keys) BucketShard(voucherID int64, b, nb int) int {
	n := len(k.tags)
	if nb <= 1 || b <= 0 {
		return k.Shard(voucherID)
	}
	return (k.Shard(voucherID) + b*max(n/nb, 1)) % n
}

// StateAt is a voucher's sale state in one shard: the State of the
// voucher's bucket that lives there (bucket 0: State itself). Fields:
// stock, begin_ms, end_ms, and for a voucher of more than one bucket
// also the Field* names below.
func (k Keys) StateAt(shard int, voucherID int64) string {
	return k.Tag(shard) + ":voucher:" + strconv.FormatInt(voucherID, 10)
}

// BuyersAt is the buyers hash of the voucher's bucket in one shard.
func (k Keys) BuyersAt(shard int, voucherID int64) string {
	return k.Tag(shard) + ":voucher:" + strconv.FormatInt(voucherID, 10) + buyersSuffix
}

// BuyersLoading is where a load stages a bucket's buyers (token names
// the load) before load.lua puts them in place with the state.
func (k Keys) BuyersLoading(shard int, voucherID int64, token string) string {
	return k.BuyersAt(shard, voucherID) + ":loading:" + token
}

// Lease is held by the one instance that loads the buckets of a voucher of
// nb buckets, or stops its units moving to rebuild one of them (the bucket
// package's Quiesce): beside the state of its bucket 0.
func (k Keys) Lease(voucherID int64, nb int) string {
	return k.StateAt(k.BucketShard(voucherID, 0, nb), voucherID) + ":lease"
}

// Fields of a bucket's state hash that a voucher of more than one bucket
// has beside stock, begin_ms and end_ms. The purchase script, the
// loader and the bucket package's transfer scripts share them.
const (
	// FieldBuckets is the voucher's bucket count, which the purchase
	// script checks against the caller's.
	FieldBuckets = "nb"
	// FieldTotal is the voucher's total stock.
	FieldTotal = "total"
	// FieldAlloc is the units this bucket holds or sold, net of moves:
	// changed by a load, a transfer and a rebuild, never by a sale or a
	// give-back. Over a voucher's buckets, sum(alloc) + units in transit
	// = total.
	FieldAlloc = "alloc"
	// FieldOut is the units this bucket gave to a transfer still in its
	// journal.
	FieldOut = "out"
	// FieldFenceUntil (ms, Redis time) is how an older version fenced a
	// bucket; take.lua still refuses transfers out of it before that time,
	// during a rolling upgrade. Fences are now tokens in the bucket
	// package's fences hash (internal/bucket/quiesce.go).
	FieldFenceUntil = "fence_until"
)
