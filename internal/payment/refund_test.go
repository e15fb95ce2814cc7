package payment

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"seckill/internal/order"
)

// refunds is the admin's list of the money owed back.
func (s service) refunds(t testing.TB) []View {
	t.Helper()
	return answer[struct{ Payments []View }](t, s.as(t, 1, true, http.MethodGet, "/api/v1/admin/refunds"), http.StatusOK).Payments
}

// refund is an admin refunding the order.
func (s service) refund(t testing.TB, id int64) *httptest.ResponseRecorder {
	t.Helper()
	return s.as(t, 1, true, http.MethodPost, "/api/v1/orders/"+strconv.FormatInt(id, 10)+"/refund")
}

// markRefunded is an admin marking the payment's money returned.
func (s service) markRefunded(t testing.TB, id int64) *httptest.ResponseRecorder {
	t.Helper()
	return s.as(t, 1, true, http.MethodPost, "/api/v1/admin/payments/"+strconv.FormatInt(id, 10)+"/refunded")
}

// paidOrder is an order of buyer paid by the dev provider, and its payment.
func (s service) paidOrder(t testing.TB, buyer int64) (int64, Payment) {
	t.Helper()
	id := s.e.order(t, buyer, time.Now().Add(time.Hour))
	got := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK)
	if got.Order.Status != order.StatusPaid {
		t.Fatalf("order %d is %s after paying, want paid", id, got.Order.Status)
	}
	return id, ps0(t, s.e, id)
}

func (e env) stock(t testing.TB) int64 {
	t.Helper()
	return e.count(t, "SELECT stock FROM vouchers WHERE id = ?", e.voucher)
}

// TestRefundOwesThePayment: an admin refunding a paid order moves, in one
// transaction, the order to refunded (its unit back on sale) and its
// payment to needs_refund (order_refunded, with the time): the payment is
// listed as money owed beside a late one, until the admin marks it
// returned. A repeat refund changes nothing, before and after the mark; an
// order in another state is refused and its payment left alone.
func TestRefundOwesThePayment(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, Config{Provider: ProviderDev, Observer: obs})
		id, p := s.paidOrder(t, buyer)
		if p.Status != StatusSucceeded || len(s.refunds(t)) != 0 {
			t.Fatalf("paid: payment %s, refunds owed %v; want succeeded and none", p.Status, s.refunds(t))
		}
		// A payment that came after its order was cancelled is owed too.
		lateID := e.order(t, buyer+1, time.Now().Add(time.Hour))
		late := e.payment(t, lateID)
		if _, _, err := e.life.Do(context.Background(), order.Cancel, lateID); err != nil {
			t.Fatal(err)
		}
		hook := e.service(t, webhookConfig("http://gateway.invalid", nil))
		w := hook.notify(t, Notification{NotificationID: "late", Reference: late.Reference, Amount: late.Amount, Status: "succeeded"}, secret, time.Now())
		if st := answer[map[string]string](t, w, http.StatusOK)["status"]; st != OutcomeNeedsRefund {
			t.Fatalf("the late notification answered %q, want needs_refund", st)
		}

		stock := e.stock(t)
		before := time.Now().UTC().Truncate(time.Millisecond)
		refused(t, s.as(t, buyer, false, http.MethodPost, "/api/v1/orders/"+strconv.FormatInt(id, 10)+"/refund"), http.StatusForbidden, "forbidden")
		v := answer[order.View](t, s.refund(t, id), http.StatusOK)
		if v.Status != order.StatusRefunded || v.RefundedAt == nil || !v.NeedsRefund {
			t.Fatalf("refund answered %+v, want refunded with its time and a refund owed", v)
		}
		if shown := answer[order.View](t, s.as(t, buyer, false, http.MethodGet, "/api/v1/orders/"+strconv.FormatInt(id, 10)), http.StatusOK); shown.Status != order.StatusRefunded || !shown.NeedsRefund {
			t.Fatalf("the buyer's view of the refunded order %+v, want refunded with a refund owed", shown)
		}
		o := e.getOrder(t, id)
		if o.Status != order.StatusRefunded || o.Live != nil || o.UnitBackAt == nil || e.stock(t) != stock+1 {
			t.Fatalf("order %+v, stock %d (was %d): want refunded, its unit back on sale", o, e.stock(t), stock)
		}
		owed := ps0(t, e, id)
		if owed.Status != StatusNeedsRefund || owed.RefundReason == nil || *owed.RefundReason != ReasonOrderRefunded ||
			owed.RefundRequestedAt == nil || owed.RefundRequestedAt.Before(before) || !owed.SucceededAt.Equal(*p.SucceededAt) || owed.RefundedAt != nil {
			t.Fatalf("payment after the refund %+v, want needs_refund (order_refunded) since the refund, its success kept", owed)
		}
		list := s.refunds(t)
		if len(list) != 2 || list[0].PaymentID != late.ID || list[0].RefundReason != ReasonLate || list[0].RefundRequestedAt == nil ||
			list[1].PaymentID != p.ID || list[1].OrderID != id || list[1].RefundReason != ReasonOrderRefunded ||
			!list[1].RefundRequestedAt.Equal(*owed.RefundRequestedAt) || list[1].Amount != p.Amount {
			t.Fatalf("refunds owed %+v, want the late payment %d, then %d of the refunded order", list, late.ID, p.ID)
		}

		// A repeat changes nothing.
		again := answer[order.View](t, s.refund(t, id), http.StatusOK)
		if again.Status != order.StatusRefunded || !again.RefundedAt.Equal(*v.RefundedAt) || !again.NeedsRefund {
			t.Fatalf("refund again answered %+v, want the first refund", again)
		}
		if p2 := ps0(t, e, id); p2.Status != StatusNeedsRefund || !p2.RefundRequestedAt.Equal(*owed.RefundRequestedAt) || e.stock(t) != stock+1 {
			t.Fatalf("after a repeat refund: payment %+v, stock %d; want unchanged", p2, e.stock(t))
		}

		// The admin returns the money: listed no more, and a refund after
		// that leaves the payment refunded.
		marked := answer[View](t, s.markRefunded(t, p.ID), http.StatusOK)
		if marked.Status != StatusRefunded || marked.RefundedAt == nil || marked.RefundReason != ReasonOrderRefunded {
			t.Fatalf("marked %+v, want refunded with its time", marked)
		}
		if shown := answer[order.View](t, s.as(t, buyer, false, http.MethodGet, "/api/v1/orders/"+strconv.FormatInt(id, 10)), http.StatusOK); shown.NeedsRefund {
			t.Fatalf("the buyer's view after the money went back %+v, want nothing owed", shown)
		}
		if list := s.refunds(t); len(list) != 1 || list[0].PaymentID != late.ID {
			t.Fatalf("refunds owed after marking %+v, want only the late payment %d", list, late.ID)
		}
		if after := answer[order.View](t, s.refund(t, id), http.StatusOK); after.Status != order.StatusRefunded || after.NeedsRefund {
			t.Fatalf("refund after the money went back answered %+v, want refunded, nothing owed", after)
		}
		if p3 := ps0(t, e, id); p3.Status != StatusRefunded || !p3.RefundedAt.Equal(*marked.RefundedAt) {
			t.Fatalf("payment %+v after refunding again, want refunded as marked", p3)
		}

		// An order in another state: refused, its payment untouched.
		open := e.order(t, buyer+2, time.Now().Add(time.Hour))
		e.payment(t, open)
		refused(t, s.refund(t, open), http.StatusConflict, "wrong_state")
		if o := e.getOrder(t, open); o.Status != order.StatusAwaitingPayment || ps0(t, e, open).Status != StatusCreated {
			t.Fatalf("refusing to refund moved order %s, payment %s", o.Status, ps0(t, e, open).Status)
		}
		refused(t, s.refund(t, 1<<50), http.StatusNotFound, "order_not_found")
		if n := obs.refunded.Load(); n != 1 {
			t.Fatalf("observer heard %d refunds, want 1", n)
		}
		e.conserved(t)
	})
}

// TestRefundFreeOrder: an order with nothing to pay has no payment: its
// refund works all the same, with payments turned off too, and owes
// nothing.
func TestRefundFreeOrder(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		s := e.service(t, Config{})
		id := e.order(t, buyer, time.Now().Add(time.Hour))
		if err := e.db.Exec("UPDATE orders SET amount = 0 WHERE id = ?", id).Error; err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.life.Do(context.Background(), order.Pay, id); err != nil {
			t.Fatal(err)
		}
		v := answer[order.View](t, s.refund(t, id), http.StatusOK)
		if v.Status != order.StatusRefunded || v.NeedsRefund {
			t.Fatalf("refund answered %+v, want refunded, nothing owed", v)
		}
		if ps := e.payments(t, id); len(ps) != 0 {
			t.Fatalf("payments %+v of a free order, want none", ps)
		}
		if list := s.refunds(t); len(list) != 0 {
			t.Fatalf("refunds owed %+v, want none", list)
		}
		e.conserved(t)
	})
}

// TestRefundAtOnce: 50 refunds of one paid order released at once refund
// it once: every one answers the refunded order, the unit comes back
// once, and one payment is owed once.
func TestRefundAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, Config{Provider: ProviderDev, Observer: obs})
		id, p := s.paidOrder(t, buyer)
		stock := e.stock(t)
		const refunds = 50
		start := make(chan struct{})
		answers := make([]string, refunds)
		var wg sync.WaitGroup
		for i := range refunds {
			wg.Go(func() {
				<-start
				w := s.refund(t, id)
				var v order.View
				if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &v) != nil {
					answers[i] = strconv.Itoa(w.Code) + " " + w.Body.String()
					return
				}
				answers[i] = v.Status + " " + strconv.FormatBool(v.NeedsRefund)
			})
		}
		close(start)
		wg.Wait()
		for i, a := range answers {
			if a != order.StatusRefunded+" true" {
				t.Fatalf("refund %d answered %q, want refunded with a refund owed", i, a)
			}
		}
		if n := obs.refunded.Load(); n != 1 {
			t.Fatalf("observer heard %d refunds, want 1", n)
		}
		if got := e.stock(t); got != stock+1 {
			t.Fatalf("stock %d after 50 refunds, want %d: one unit back", got, stock+1)
		}
		if list := s.refunds(t); len(list) != 1 || list[0].PaymentID != p.ID || list[0].RefundReason != ReasonOrderRefunded {
			t.Fatalf("refunds owed %+v, want payment %d once", list, p.ID)
		}
		e.conserved(t)
	})
}

// TestRefundIsOneTransaction: when the payment cannot be moved to owed
// (the database refuses the update), the order is not refunded either:
// the refund answers 503 and leaves the order paid, its unit held, and
// its payment succeeded; once the database takes it, the refund goes
// through.
func TestRefundIsOneTransaction(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		s := e.service(t, Config{Provider: ProviderDev})
		id, p := s.paidOrder(t, buyer)
		stock := e.stock(t)
		refuse := map[string]string{
			"mysql": `CREATE TRIGGER refuse_owed BEFORE UPDATE ON payments FOR EACH ROW
				IF NEW.status = 'needs_refund' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'; END IF`,
			"sqlite": `CREATE TRIGGER refuse_owed BEFORE UPDATE ON payments FOR EACH ROW
				WHEN NEW.status = 'needs_refund' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END`,
		}[e.db.Dialector.Name()]
		if err := e.db.Exec(refuse).Error; err != nil {
			t.Fatal(err)
		}
		refused(t, s.refund(t, id), http.StatusServiceUnavailable, "unavailable")
		if o := e.getOrder(t, id); o.Status != order.StatusPaid || o.Live == nil || o.RefundedAt != nil || e.stock(t) != stock {
			t.Fatalf("after a refund whose payment could not move: order %s, stock %d (was %d); want paid, its unit held", describeOrder(o), e.stock(t), stock)
		}
		if got := ps0(t, e, id); got.Status != StatusSucceeded || got.RefundRequestedAt != nil {
			t.Fatalf("payment %s, want succeeded", describePayment(got))
		}
		if err := e.db.Exec("DROP TRIGGER refuse_owed").Error; err != nil {
			t.Fatal(err)
		}
		if v := answer[order.View](t, s.refund(t, id), http.StatusOK); v.Status != order.StatusRefunded || !v.NeedsRefund {
			t.Fatalf("refund answered %+v, want refunded with a refund owed", v)
		}
		if list := s.refunds(t); len(list) != 1 || list[0].PaymentID != p.ID {
			t.Fatalf("refunds owed %+v, want payment %d", list, p.ID)
		}
		e.conserved(t)
	})
}
