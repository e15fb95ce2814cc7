package failover

import (
	"seckill/internal/order"
	"seckill/internal/voucher"
)

// orderFate is what the heal does with an order the sale's Redis holds
// (its buyer entry names it); decideOrder chooses it.
type orderFate uint8

const (
	orderRequeue  orderFate = iota // the database lost it: queue it again for the worker
	orderPending                   // on its way to the database (the pending index holds it)
	orderWritten                   // the database holds it
	orderLettered                  // the database holds its dead letter
	orderConflict                  // the buyer holds another live order of the voucher in the database
)

var orderFateNames = [...]string{"requeue", "pending", "written", "lettered", "conflict"}

func (f orderFate) String() string { return orderFateNames[f] }

// decideOrder is the one place the heal decides an order Redis holds, from
// what Redis and the database hold of it:
//
//	pending index holds it                          -> pending   (nothing: the worker writes it)
//	the database holds the order                    -> written   (nothing)
//	the database holds its dead letter              -> lettered  (nothing; reported)
//	the buyer holds another live order of it there  -> conflict  (nothing; reported)
//	none of these                                   -> requeue   (the worker writes it again)
//
// Requeued, the order meets the worker's guards like any other: whatever
// the database holds by then decides, and nothing is written twice.
func decideOrder(pending, written, lettered, otherLive bool) orderFate {
	switch {
	case pending:
		return orderPending
	case written:
		return orderWritten
	case lettered:
		return orderLettered
	case otherLive:
		return orderConflict
	}
	return orderRequeue
}

// endFate is what the heal does with an order Redis recorded as ended
// (its unit went back on sale: voucher.EndedAt); decideEnd chooses it.
type endFate uint8

const (
	endHeld     endFate = iota // the database holds the end
	endGone                    // the database holds no such order: nothing to end
	endCancel                  // cancel it again
	endExpire                  // expire it again
	endRefund                  // refund it again (its payment owed back)
	endConflict                // the database holds it in a state its end cannot follow
)

var endFateNames = [...]string{"held", "gone", "cancel", "expire", "refund", "conflict"}

func (f endFate) String() string { return endFateNames[f] }

// decideEnd is the one place the heal decides an ended order, from the
// order's state in the database (found false: no such order) and how
// Redis recorded its end:
//
//	database holds              Redis recorded    -> fate
//	no such order               any               -> gone      (the order and its end were both lost)
//	cancelled or refunded       any               -> held      (nothing)
//	awaiting_payment            cancelled         -> cancel
//	awaiting_payment            expired           -> expire
//	awaiting_payment            refunded          -> cancel    (its payment and its refund were both
//	                                                              lost: the unit goes back, as it had)
//	paid                        refunded          -> refund    (the payment owed back again)
//	paid                        cancelled/expired -> conflict  (an order paid is never cancelled)
//	used                        any               -> conflict
//
// A database that lost an order's end holds it live while Redis sells its
// unit again: without the end written back, the database counts one unit
// too few, and the order that bought it again would be refused as out of
// stock.
func decideEnd(found bool, status, how string) endFate {
	switch {
	case !found:
		return endGone
	case status == order.StatusCancelled || status == order.StatusRefunded:
		return endHeld
	case status == order.StatusAwaitingPayment && how == voucher.EndedExpired:
		return endExpire
	case status == order.StatusAwaitingPayment:
		return endCancel
	case status == order.StatusPaid && how == voucher.EndedRefunded:
		return endRefund
	}
	return endConflict
}
