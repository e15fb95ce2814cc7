package payment

import "seckill/internal/order"

// verdict is what money arriving for a payment does, given the payment's
// status and its order's state.
type verdict uint8

const (
	// pays: the order moves to paid, the payment succeeded.
	pays verdict = iota + 1
	// refunds: the order cannot take the money (cancelled or expired
	// before it came, or paid by another payment): the payment needs a
	// refund and the order stays as it is.
	refunds
	// settled: the payment was settled before; nothing changes.
	settled
	// broken: a state this code does not know; nothing changes and the
	// notification is answered with an error (the gateway tries again).
	broken
)

// anyState matches every status in a row of decisions.
const anyState = "*"

// decisions is the whole decision, one row per case, read top down; the
// first row whose payment status and order state match decides:
//
//	payment       order                       verdict   outcome
//	created       awaiting_payment            pays      order paid, payment succeeded
//	created       cancelled                   refunds   payment needs_refund, late (order not revived)
//	created       paid, used, refunded        refunds   payment needs_refund, duplicate (paid twice)
//	succeeded     *                           settled   nothing changes
//	needs_refund  *                           settled   nothing changes
//	refunded      *                           settled   nothing changes
//
// A paid, used or refunded order with a payment still created was paid by
// another payment: a succeeded payment is never left created.
var decisions = []struct {
	payment, order string
	verdict        verdict
	// reason is the refund_reason a refunds verdict records.
	reason string
}{
	{StatusCreated, order.StatusAwaitingPayment, pays, ""},
	{StatusCreated, order.StatusCancelled, refunds, ReasonLate},
	{StatusCreated, order.StatusPaid, refunds, ReasonDuplicate},
	{StatusCreated, order.StatusUsed, refunds, ReasonDuplicate},
	{StatusCreated, order.StatusRefunded, refunds, ReasonDuplicate},
	{StatusSucceeded, anyState, settled, ""},
	{StatusNeedsRefund, anyState, settled, ""},
	{StatusRefunded, anyState, settled, ""},
}

// decide returns the verdict of money arriving for a payment in this
// status whose order is in this state, and for refunds why the money
// goes back.
func decide(payment, orderStatus string) (verdict, string) {
	for _, d := range decisions {
		if d.payment == payment && (d.order == anyState || d.order == orderStatus) {
			return d.verdict, d.reason
		}
	}
	return broken, ""
}

// outcome names a verdict for the notify answer and the metrics.
func (v verdict) outcome() string {
	switch v {
	case pays:
		return OutcomeSucceeded
	case refunds:
		return OutcomeNeedsRefund
	case settled:
		return OutcomeDuplicate
	}
	return "broken"
}
