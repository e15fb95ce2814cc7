package payment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"seckill/internal/order"
)

// racer is an order past its pay deadline with a created payment, and
// what the expiry and the gateway's notification answered.
type racer struct {
	id       int64
	p        Payment
	notified string // the notify answer's status, or its code and body
	expired  error
}

// race is the expiry and the notification of the same orders.
type race struct {
	e    env
	s    service
	next int64 // the next buyer
}

// arm writes n orders past their deadline, each with a created payment.
func (r *race) arm(t *testing.T, n int) []*racer {
	t.Helper()
	rs := make([]*racer, n)
	for i := range rs {
		r.next++
		id := r.e.order(t, r.next, time.Now().Add(-time.Second))
		rs[i] = &racer{id: id, p: r.e.payment(t, id)}
	}
	return rs
}

func (r *race) expire(x *racer) {
	_, _, x.expired = r.e.life.Do(context.Background(), order.Expire, x.id)
}

func (r *race) notify(t *testing.T, x *racer) {
	n := Notification{NotificationID: "n-" + strconv.FormatInt(x.id, 10), Reference: x.p.Reference, Amount: x.p.Amount, Status: "succeeded"}
	w := r.s.notify(t, n, secret, time.Now())
	var body map[string]string
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &body) != nil {
		x.notified = strconv.Itoa(w.Code) + " " + w.Body.String()
		return
	}
	x.notified = body["status"]
}

// at releases the expiry and the notification of every racer at once.
func (r *race) at(t *testing.T, rs []*racer) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, x := range rs {
		wg.Go(func() { <-start; r.expire(x) })
		wg.Go(func() { <-start; r.notify(t, x) })
	}
	close(start)
	wg.Wait()
}

// ended checks that the racer ended as exactly one of: paid with its
// payment succeeded (the expiry found it paid), or cancelled as expired,
// its unit back on sale, with its payment owed back (late); and that the
// answers say the same. It returns which, order.StatusPaid or
// order.StatusCancelled.
func (r *race) ended(t *testing.T, x *racer) string {
	t.Helper()
	o := r.e.getOrder(t, x.id)
	ps := r.e.payments(t, x.id)
	if len(ps) != 1 {
		t.Fatalf("order %d: %d payments, want 1", x.id, len(ps))
	}
	p := ps[0]
	var wrong *order.StateError
	switch {
	case o.Status == order.StatusPaid && p.Status == StatusSucceeded:
		if x.notified != OutcomeSucceeded || !errors.As(x.expired, &wrong) || wrong.Status != order.StatusPaid {
			t.Errorf("order %d paid: notify answered %q, expiry %v; want succeeded and a wrong state (paid)", x.id, x.notified, x.expired)
		}
		if o.PaidAt == nil || o.Live == nil || o.CancelledAt != nil || p.RefundReason != nil {
			t.Errorf("order %d %s, payment %s: want paid, live, never cancelled, nothing owed", x.id, describeOrder(o), describePayment(p))
		}
	case o.Status == order.StatusCancelled && p.Status == StatusNeedsRefund:
		if x.notified != OutcomeNeedsRefund || x.expired != nil {
			t.Errorf("order %d cancelled: notify answered %q, expiry %v; want needs_refund and no error", x.id, x.notified, x.expired)
		}
		if o.CancelReason == nil || *o.CancelReason != order.CancelExpired || o.Live != nil || o.PaidAt != nil || o.UnitBackAt == nil {
			t.Errorf("order %d %s: want expired, not live, never paid, unit back on sale", x.id, describeOrder(o))
		}
		if p.RefundReason == nil || *p.RefundReason != ReasonLate || p.RefundRequestedAt == nil {
			t.Errorf("order %d cancelled, payment %s: want owed back, late", x.id, describePayment(p))
		}
	default:
		t.Errorf("order %d is %s with its payment %s: want paid and succeeded, or cancelled and needs_refund", x.id, o.Status, p.Status)
	}
	return o.Status
}

func describeOrder(o order.Order) string {
	return fmt.Sprintf("{status %s live %v paid_at %v cancelled_at %v reason %v unit_back_at %v}", o.Status, o.Live != nil, o.PaidAt != nil, o.CancelledAt != nil, o.CancelReason != nil, o.UnitBackAt != nil)
}

func describePayment(p Payment) string {
	reason := "-"
	if p.RefundReason != nil {
		reason = *p.RefundReason
	}
	return fmt.Sprintf("{status %s reason %s refund_requested_at %v}", p.Status, reason, p.RefundRequestedAt != nil)
}

// TestPaymentRacesExpiry: on orders past their deadline, the gateway's
// notification and the expiry arrive at once. Each order ends as exactly
// one of the two outcomes ended names. Each outcome is first made on
// purpose (expiry then notification, and the other way round); then the
// two are raced, in rounds of orders released at once until both outcomes
// have won at least once: a side that can never win fails the test.
func TestPaymentRacesExpiry(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		r := &race{e: e, s: e.service(t, webhookConfig("http://gateway.invalid", nil)), next: 100}
		won := map[string]int{}

		// The two outcomes, one after the other.
		in := r.arm(t, 2)
		r.expire(in[0])
		r.notify(t, in[0])
		r.notify(t, in[1])
		r.expire(in[1])
		if got := r.ended(t, in[0]); got != order.StatusCancelled {
			t.Fatalf("expired, then notified: order is %s, want cancelled", got)
		}
		if got := r.ended(t, in[1]); got != order.StatusPaid {
			t.Fatalf("notified, then expired: order is %s, want paid", got)
		}
		won[order.StatusCancelled]++
		won[order.StatusPaid]++

		// The race.
		const (
			orders    = 40
			maxRounds = 10
		)
		raced := map[string]int{}
		rounds := 0
		for ; rounds < maxRounds && (raced[order.StatusPaid] == 0 || raced[order.StatusCancelled] == 0); rounds++ {
			rs := r.arm(t, orders)
			r.at(t, rs)
			for _, x := range rs {
				raced[r.ended(t, x)]++
			}
			if t.Failed() {
				t.FailNow()
			}
		}
		t.Logf("%d rounds of %d: %d paid, %d cancelled with a refund owed", rounds, orders, raced[order.StatusPaid], raced[order.StatusCancelled])
		if raced[order.StatusPaid] == 0 || raced[order.StatusCancelled] == 0 {
			t.Fatalf("after %d rounds of %d orders, %d paid and %d cancelled: one side never won the race", rounds, orders, raced[order.StatusPaid], raced[order.StatusCancelled])
		}
		for st, n := range raced {
			won[st] += n
		}

		e.conserved(t)
		if stock, total := e.stock(t), e.count(t, "SELECT total_stock FROM vouchers WHERE id = ?", e.voucher); stock != total-int64(won[order.StatusPaid]) {
			t.Fatalf("stock %d of %d, want %d: one unit back per cancelled order", stock, total, total-int64(won[order.StatusPaid]))
		}
		if n := e.count(t, "SELECT COUNT(*) FROM payments WHERE status = ?", StatusNeedsRefund); n != int64(won[order.StatusCancelled]) {
			t.Fatalf("%d payments need a refund, want %d", n, won[order.StatusCancelled])
		}
	})
}
