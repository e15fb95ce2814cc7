package voucher

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// Refusals of a purchase; the HTTP edge turns each into a status and code.
var (
	ErrSoldOut    = errors.New("sold out")
	ErrNotStarted = errors.New("sale not started")
	ErrEnded      = errors.New("sale ended")
	// ErrNotReady means Redis holds no loaded state for the voucher's shard:
	// the purchase fails closed until the state is rebuilt.
	ErrNotReady = errors.New("sale state not ready")
	// ErrNoState means the shard is loaded but this voucher has no state:
	// it is unknown, ended long ago, or its state was not written yet.
	ErrNoState = errors.New("no sale state for voucher")
	// ErrWrongType means a key the purchase writes holds another Redis type
	// than the sale state uses (overwritten by hand, or another program
	// shares the key prefix). The purchase wrote nothing; purchases of the
	// shard or voucher fail closed until an operator removes the key.
	ErrWrongType = errors.New("sale state key of the wrong type")
)

// PurchasedError means the buyer already holds an order for the voucher.
type PurchasedError struct{ OrderID int64 }

func (e *PurchasedError) Error() string {
	return "already purchased: order " + strconv.FormatInt(e.OrderID, 10)
}

// Reservation is an accepted purchase.
type Reservation struct {
	OrderID int64
	// Replayed is true when this order id had been accepted by an earlier
	// call (a retry): nothing was reserved again.
	Replayed bool
}

// Reserver runs the purchase script: one Redis round trip per purchase.
type Reserver struct {
	rdb    redis.Scripter
	keys   Keys
	script *redis.Script
}

// NewReserver returns a Reserver; it does not own rdb.
func NewReserver(rdb redis.Scripter, keys Keys) *Reserver {
	return &Reserver{rdb: rdb, keys: keys, script: lua.Purchase()}
}

// Reserve checks the buyer's eligibility and, when eligible, reserves one
// unit and queues the order with the given id. Calling it again with the
// same order id does not reserve twice.
func (r *Reserver) Reserve(ctx context.Context, voucherID, userID, orderID int64) (Reservation, error) {
	shard := r.keys.Shard(voucherID)
	keys := []string{
		r.keys.Ready(shard),
		r.keys.State(voucherID),
		r.keys.Buyers(voucherID),
		r.keys.Stream(shard),
		r.keys.Pending(shard),
	}
	res, err := r.script.Run(ctx, r.rdb, keys, voucherID, userID, orderID).Slice()
	if err != nil {
		return Reservation{}, fmt.Errorf("purchase script: %w", err)
	}
	return decodePurchase(res)
}

// The return codes of purchase.lua, as its header lists them: {code, detail}.
const (
	purchaseAccepted   = 0 // detail: order id; stock reserved, order queued
	purchaseReplayed   = 1 // detail: order id; accepted by an earlier call, nothing written again
	purchaseDuplicate  = 2 // detail: the buyer's existing order id
	purchaseSoldOut    = 3
	purchaseNotStarted = 4 // the sale has not started (Redis server time)
	purchaseEnded      = 5 // the sale has ended (Redis server time)
	purchaseNotReady   = 6 // the shard's state is not loaded
	purchaseNoState    = 7 // no state for this voucher
	purchaseWrongType  = 8 // detail: the key of another type; nothing written
)

// decodePurchase is the one place that reads purchase.lua's return codes.
func decodePurchase(res []any) (Reservation, error) {
	if len(res) != 2 {
		return Reservation{}, fmt.Errorf("purchase script: %d return values, want 2", len(res))
	}
	code, ok := res[0].(int64)
	if !ok {
		return Reservation{}, fmt.Errorf("purchase script: code is %T", res[0])
	}
	detail, _ := res[1].(string)
	orderID := func() (int64, error) {
		id, err := strconv.ParseInt(detail, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("purchase script: bad order id %q", detail)
		}
		return id, nil
	}
	switch code {
	case purchaseAccepted, purchaseReplayed:
		id, err := orderID()
		if err != nil {
			return Reservation{}, err
		}
		return Reservation{OrderID: id, Replayed: code == purchaseReplayed}, nil
	case purchaseDuplicate:
		id, err := orderID()
		if err != nil {
			return Reservation{}, err
		}
		return Reservation{}, &PurchasedError{OrderID: id}
	case purchaseSoldOut:
		return Reservation{}, ErrSoldOut
	case purchaseNotStarted:
		return Reservation{}, ErrNotStarted
	case purchaseEnded:
		return Reservation{}, ErrEnded
	case purchaseNotReady:
		return Reservation{}, ErrNotReady
	case purchaseNoState:
		return Reservation{}, ErrNoState
	case purchaseWrongType:
		return Reservation{}, fmt.Errorf("purchase script: key %q: %w", detail, ErrWrongType)
	}
	return Reservation{}, fmt.Errorf("purchase script: unknown code %d", code)
}
