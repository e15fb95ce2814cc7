package voucher

import (
	"context"
	"errors"
)

// ErrInTransit means the buyer's home bucket is empty and no other bucket
// could lend it a unit right now, yet the voucher is not sold out: units
// are in a transfer not yet applied, or a bucket is not ready (its master
// is failing over or being rebuilt). The buyer is told to try again
// shortly, never "sold out".
var ErrInTransit = errors.New("units of the voucher in transit between buckets")

// Borrower moves units into a buyer's empty home bucket from the other
// buckets of the voucher. The bucket package supplies it (a voucher of
// one bucket never calls it).
type Borrower interface {
	// Borrow returns nil when bucket to of voucherID holds units now
	// (moved there, or moved by someone else meanwhile); ErrSoldOut when
	// every bucket is ready and empty and no unit is in transit; else
	// ErrInTransit, or another error.
	Borrow(ctx context.Context, voucherID int64, to, nb int) error
}

// Quiescer stops units moving between a voucher's buckets, so that a
// rebuild of one bucket can count the others. The bucket package
// supplies it.
type Quiescer interface {
	// Quiesce takes the voucher's lease, refuses transfers out of every
	// bucket, finishes or returns every journaled transfer of the voucher,
	// waits out any transfer still able to arrive, and then reads the
	// alloc of every ready bucket other than lost. Release undoes the
	// fences and the lease. An error leaves nothing held.
	Quiesce(ctx context.Context, voucherID int64, nb, lost int) (Quiet, error)
}

// Quiet is a voucher whose other buckets were counted while their units
// stood still, for a rebuild of one bucket.
type Quiet struct {
	// Alloc is each ready bucket's alloc, lost excluded.
	Alloc map[int]int64
	// NotReady lists the other buckets that are not ready either.
	NotReady []int
	// Ctx ends when the voucher's lease is lost (its holder stalled past
	// it and another rebuild took over) or released: the rest of the
	// rebuild runs in it.
	Ctx context.Context
	// Guard must still hold when the rebuilt bucket's shard reopens (the
	// reopen checks it in the same script): a rebuild taken over writes
	// nothing live, whatever its lease told it.
	Guard Guard
	// Release lifts the fences and the lease; call it once.
	Release func(ctx context.Context)
}

// Holder holds a voucher of several buckets still for the first load of
// its buckets. The bucket package supplies it.
type Holder interface {
	// Hold takes the voucher's lease (kept while held) and fences every
	// bucket; each bucket's state is written only while Guards[b] holds.
	// Release lifts the fences and the lease; call it once. An error
	// leaves nothing held.
	Hold(ctx context.Context, voucherID int64, nb int) (Held, error)
}

// Held is a voucher held still for the first load of its buckets.
type Held struct {
	// Ctx ends when the lease is lost or released.
	Ctx context.Context
	// Guards has bucket b's guard at index b.
	Guards []Guard
	// Release lifts the fences and the lease; call it once.
	Release func(ctx context.Context)
}

// Guard is a fencing token a write must find where it lands: hash Key's
// Field holding Value, in the shard the write goes to.
type Guard struct{ Key, Field, Value string }
