package payment

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/order"
)

const buyer = 42

// TestPayDev: the dev provider pays the order at once, in the answer;
// paying again is refused as a wrong state, someone else's order looks
// like none, and with no provider paying is unavailable.
func TestPayDev(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, Config{Provider: ProviderDev, Observer: obs})
		id := e.order(t, buyer, time.Now().Add(time.Hour))

		refused(t, s.pay(t, buyer+1, id), http.StatusNotFound, "order_not_found")
		got := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK)
		if got.Order.Status != order.StatusPaid || got.Order.PaidAt == nil || got.Order.OrderID != id {
			t.Fatalf("order in the answer %+v, want %d paid", got.Order, id)
		}
		if got.Payment.Status != StatusSucceeded || got.Payment.Provider != ProviderDev || got.Payment.Amount != e.price ||
			got.Payment.SucceededAt == nil || got.Payment.PayURL != "" {
			t.Fatalf("payment in the answer %+v, want dev succeeded of %d", got.Payment, e.price)
		}
		if o := e.getOrder(t, id); o.Status != order.StatusPaid || o.PaidAt == nil {
			t.Fatalf("order is %s, want paid", o.Status)
		}
		if ps := e.payments(t, id); len(ps) != 1 || ps[0].Status != StatusSucceeded {
			t.Fatalf("payments %+v, want one succeeded", ps)
		}
		// Pressing Pay again answers the first payment, and pays nothing.
		again := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK)
		if again.Order.Status != order.StatusPaid || again.Payment.Status != StatusSucceeded || again.Payment.PaymentID != ps0(t, e, id).ID {
			t.Fatalf("pay again: %+v", again)
		}
		if ps := e.payments(t, id); len(ps) != 1 {
			t.Fatalf("payments %+v after paying again, want one", ps)
		}
		if n := len(e.payments(t, id)); n != 1 {
			t.Fatalf("%d payments after paying twice, want 1", n)
		}
		if obs.succeeded.Load() != 1 {
			t.Fatalf("observer heard %d successes, want 1", obs.succeeded.Load())
		}

		late := e.order(t, buyer+2, time.Now().Add(-time.Second))
		refused(t, s.pay(t, buyer+2, late), http.StatusConflict, "wrong_state")
		if n := len(e.payments(t, late)); n != 0 {
			t.Fatalf("%d payments of an order past its deadline, want none", n)
		}

		off := e.service(t, Config{})
		other := e.order(t, buyer+3, time.Now().Add(time.Hour))
		refused(t, off.pay(t, buyer+3, other), http.StatusServiceUnavailable, "payment_unavailable")
		if o := e.getOrder(t, other); o.Status != order.StatusAwaitingPayment {
			t.Fatalf("order is %s with payments off, want awaiting_payment", o.Status)
		}
	})
}

// gateway is a payment gateway that checks each request's signature.
type gateway struct {
	mu       sync.Mutex
	requests []GatewayRequest
	bad      int // requests whose signature was wrong
	fail     bool
	srv      *httptest.Server
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts := r.Header.Get(auth.WebhookTimestampHeader)
		g.mu.Lock()
		defer g.mu.Unlock()
		if r.Header.Get(auth.WebhookSignatureHeader) != auth.Sign(secret, ts, body) {
			g.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if g.fail {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		var req GatewayRequest
		if err := json.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		g.requests = append(g.requests, req)
		_ = json.NewEncoder(w).Encode(GatewayAnswer{PayURL: "https://gateway.example/pay/" + req.Reference})
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateway) seen() ([]GatewayRequest, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]GatewayRequest(nil), g.requests...), g.bad
}

// TestPayWebhook: paying creates the payment at the gateway with a signed
// request and answers its page; the order still awaits payment. Paying
// again reuses the open payment. A gateway that fails leaves the payment
// open, answered unavailable. The gateway's notification pays the order.
func TestPayWebhook(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		g := newGateway(t)
		obs := &outcomes{}
		s := e.service(t, webhookConfig(g.srv.URL, obs))
		id := e.order(t, buyer, time.Now().Add(time.Hour))

		got := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK)
		p := got.Payment
		if p.Status != StatusCreated || p.Provider != ProviderWebhook || p.Amount != e.price || p.Reference == "" ||
			p.PayURL != "https://gateway.example/pay/"+p.Reference {
			t.Fatalf("payment in the answer %+v, want created with the gateway's page", p)
		}
		if got.Order.Status != order.StatusAwaitingPayment || got.Order.PaySecondsLeft == nil {
			t.Fatalf("order in the answer %+v, want awaiting payment", got.Order)
		}
		reqs, bad := g.seen()
		if bad != 0 || len(reqs) != 1 || reqs[0] != (GatewayRequest{Reference: p.Reference, OrderID: id, Amount: e.price}) {
			t.Fatalf("gateway got %+v (%d badly signed), want one signed request for %s", reqs, bad, p.Reference)
		}

		again := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK)
		if again.Payment.PaymentID != p.PaymentID || again.Payment.Reference != p.Reference {
			t.Fatalf("paying again made payment %+v, want %+v again", again.Payment, p)
		}
		if n := len(e.payments(t, id)); n != 1 {
			t.Fatalf("%d payments after paying twice, want 1 open", n)
		}

		g.mu.Lock()
		g.fail = true
		g.mu.Unlock()
		refused(t, s.pay(t, buyer, id), http.StatusServiceUnavailable, "payment_unavailable")
		if ps := e.payments(t, id); len(ps) != 1 || ps[0].Status != StatusCreated {
			t.Fatalf("payments %+v after the gateway failed, want the one open", ps)
		}

		w := s.notify(t, Notification{NotificationID: "n1", Reference: p.Reference, Amount: e.price, Status: "succeeded"}, secret, time.Now())
		if st := answer[map[string]string](t, w, http.StatusOK)["status"]; st != OutcomeSucceeded {
			t.Fatalf("notify answered %q, want succeeded", st)
		}
		if o := e.getOrder(t, id); o.Status != order.StatusPaid {
			t.Fatalf("order is %s after the notification, want paid", o.Status)
		}
		if ps := e.payments(t, id); ps[0].Status != StatusSucceeded || ps[0].SucceededAt == nil {
			t.Fatalf("payment %+v, want succeeded", ps[0])
		}
		if again := answer[PayAnswer](t, s.pay(t, buyer, id), http.StatusOK); again.Payment.Status != StatusSucceeded || len(e.payments(t, id)) != 1 {
			t.Fatalf("pay a paid order again: %+v, payments %+v", again, e.payments(t, id))
		}
		if obs.succeeded.Load() != 1 {
			t.Fatalf("observer heard %d successes, want 1", obs.succeeded.Load())
		}
	})
}

// TestNotifyTwice: a notification delivered again, one after the other or
// 50 at once, pays once; another notification of a settled payment
// changes nothing either.
func TestNotifyTwice(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, webhookConfig("http://gateway.invalid", obs))

		id := e.order(t, buyer, time.Now().Add(time.Hour))
		p := e.payment(t, id)
		n := Notification{NotificationID: "once", Reference: p.Reference, Amount: p.Amount, Status: "succeeded"}
		for i, want := range []string{OutcomeSucceeded, OutcomeDuplicate} {
			if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != want {
				t.Fatalf("delivery %d answered %q, want %q", i+1, st, want)
			}
		}
		n.NotificationID = "another"
		if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != OutcomeDuplicate {
			t.Fatalf("another notification of a settled payment answered %q, want duplicate", st)
		}
		paidAt := e.getOrder(t, id).PaidAt
		if o := e.getOrder(t, id); o.Status != order.StatusPaid {
			t.Fatalf("order is %s, want paid", o.Status)
		}

		// 50 deliveries of one notification released at once.
		id2 := e.order(t, buyer+1, time.Now().Add(time.Hour))
		p2 := e.payment(t, id2)
		n2 := Notification{NotificationID: "at-once", Reference: p2.Reference, Amount: p2.Amount, Status: "succeeded"}
		const deliveries = 50
		start := make(chan struct{})
		answers := make([]string, deliveries)
		var wg sync.WaitGroup
		for i := range deliveries {
			wg.Go(func() {
				<-start
				w := s.notify(t, n2, secret, time.Now())
				if w.Code != http.StatusOK {
					answers[i] = strconv.Itoa(w.Code) + " " + w.Body.String()
					return
				}
				var body map[string]string
				_ = json.Unmarshal(w.Body.Bytes(), &body)
				answers[i] = body["status"]
			})
		}
		close(start)
		wg.Wait()
		count := map[string]int{}
		for _, a := range answers {
			count[a]++
		}
		if count[OutcomeSucceeded] != 1 || count[OutcomeDuplicate] != deliveries-1 {
			t.Fatalf("answers %v, want 1 succeeded and %d duplicate", count, deliveries-1)
		}
		if o := e.getOrder(t, id2); o.Status != order.StatusPaid {
			t.Fatalf("order is %s, want paid", o.Status)
		}
		if ps := e.payments(t, id2); len(ps) != 1 || ps[0].Status != StatusSucceeded {
			t.Fatalf("payments %+v, want one succeeded", ps)
		}
		if n := e.count(t, "SELECT COUNT(*) FROM payment_notifications WHERE reference = ?", p2.Reference); n != 1 {
			t.Fatalf("%d notifications recorded, want 1", n)
		}
		if got := e.getOrder(t, id).PaidAt; !got.Equal(*paidAt) {
			t.Fatalf("first order's paid_at moved from %v to %v", paidAt, got)
		}
		if obs.succeeded.Load() != 2 || obs.duplicate.Load() != 2+deliveries-1 {
			t.Fatalf("observer heard %d successes and %d duplicates, want 2 and %d", obs.succeeded.Load(), obs.duplicate.Load(), 2+deliveries-1)
		}
		e.conserved(t)
	})
}

// TestNotificationIDSeenBefore: a notification whose id was seen before
// pays nothing, even when it names another payment still open: the id,
// not the payment's own status, makes it a duplicate.
func TestNotificationIDSeenBefore(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, webhookConfig("http://gateway.invalid", obs))
		first, second := e.order(t, buyer, time.Now().Add(time.Hour)), e.order(t, buyer+1, time.Now().Add(time.Hour))
		p1, p2 := e.payment(t, first), e.payment(t, second)
		n := Notification{NotificationID: "seen", Reference: p1.Reference, Amount: p1.Amount, Status: "succeeded"}
		if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != OutcomeSucceeded {
			t.Fatalf("the first notification answered %q, want succeeded", st)
		}
		n.Reference, n.Amount = p2.Reference, p2.Amount
		if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != OutcomeDuplicate {
			t.Fatalf("the id again, naming another payment, answered %q, want duplicate", st)
		}
		if o, p := e.getOrder(t, second), ps0(t, e, second); o.Status != order.StatusAwaitingPayment || p.Status != StatusCreated || p.SucceededAt != nil {
			t.Fatalf("order %s, payment %s after a repeated id: want awaiting_payment and created", o.Status, p.Status)
		}
		if n := e.count(t, "SELECT COUNT(*) FROM payment_notifications WHERE reference = ?", p2.Reference); n != 0 {
			t.Fatalf("%d notifications recorded for the second payment, want none", n)
		}
		if obs.succeeded.Load() != 1 || obs.duplicate.Load() != 1 {
			t.Fatalf("observer heard %d successes and %d duplicates, want 1 and 1", obs.succeeded.Load(), obs.duplicate.Load())
		}
		// Its own notification still pays it.
		n.NotificationID = "its-own"
		if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != OutcomeSucceeded {
			t.Fatalf("the second payment's own notification answered %q, want succeeded", st)
		}
	})
}

// TestNotifyRefused: a notification with a bad or missing signature, a
// stale or future timestamp, bad JSON, an unknown reference or another
// amount is refused and changes nothing.
func TestNotifyRefused(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, webhookConfig("http://gateway.invalid", obs))
		id := e.order(t, buyer, time.Now().Add(time.Hour))
		p := e.payment(t, id)
		good := Notification{NotificationID: "n", Reference: p.Reference, Amount: p.Amount, Status: "succeeded"}
		body, _ := json.Marshal(good)
		now := time.Now()

		stamp := strconv.FormatInt(now.Unix(), 10)
		// with is the good body with these headers (a header "" is left
		// out; one holding " " is sent empty).
		with := func(ts, sig string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodPost, "/api/v1/payments/notify", strings.NewReader(string(body)))
			for h, v := range map[string]string{auth.WebhookTimestampHeader: ts, auth.WebhookSignatureHeader: sig} {
				switch v {
				case "":
				case " ":
					req.Header[h] = []string{""}
				default:
					req.Header.Set(h, v)
				}
			}
			return s.do(t, req)
		}
		sig := auth.Sign(secret, stamp, body)
		forged := httptest.NewRequest(http.MethodPost, "/api/v1/payments/notify", strings.NewReader(string(body)))
		forged.Header.Set(auth.WebhookTimestampHeader, stamp)
		forged.Header.Set(auth.WebhookSignatureHeader, auth.Sign(secret, strconv.FormatInt(now.Unix()+1, 10), body))
		mismatch := good
		mismatch.Amount++
		unknown := good
		unknown.Reference = "no-such-payment"
		for _, c := range []struct {
			name   string
			w      *httptest.ResponseRecorder
			status int
			code   string
		}{
			{"no headers", with("", ""), http.StatusUnauthorized, "bad_signature"},
			// A fresh timestamp: these reach the signature check.
			{"no signature", with(stamp, ""), http.StatusUnauthorized, "bad_signature"},
			{"empty signature", with(stamp, " "), http.StatusUnauthorized, "bad_signature"},
			{"signature of nothing", with(stamp, "sha256="), http.StatusUnauthorized, "bad_signature"},
			{"garbage signature", with(stamp, "sha256="+strings.Repeat("0", 64)), http.StatusUnauthorized, "bad_signature"},
			{"signature cut short", with(stamp, sig[:len(sig)-1]), http.StatusUnauthorized, "bad_signature"},
			{"signed, no timestamp", with("", sig), http.StatusUnauthorized, "bad_signature"},
			{"signed with another timestamp", s.do(t, forged), http.StatusUnauthorized, "bad_signature"},
			{"signed with another secret", s.notify(t, good, []byte("not-the-gateway-secret-at-all!!!"), now), http.StatusUnauthorized, "bad_signature"},
			{"stale", s.notify(t, good, secret, now.Add(-6*time.Minute)), http.StatusUnauthorized, "stale_notification"},
			{"from the future", s.notify(t, good, secret, now.Add(6*time.Minute)), http.StatusUnauthorized, "stale_notification"},
			{"bad json", s.notifyRaw(t, []byte(`{"notification_id":`), secret, now), http.StatusBadRequest, "bad_request"},
			{"not succeeded", s.notifyRaw(t, []byte(`{"notification_id":"n","reference":"`+p.Reference+`","amount":1990,"status":"failed"}`), secret, now), http.StatusBadRequest, "bad_request"},
			{"too large", s.notifyRaw(t, []byte(`{"notification_id":"`+strings.Repeat("x", maxNotifyBody)+`"}`), secret, now), http.StatusRequestEntityTooLarge, "body_too_large"},
			{"unknown reference", s.notify(t, unknown, secret, now), http.StatusNotFound, "payment_not_found"},
			{"amount mismatch", s.notify(t, mismatch, secret, now), http.StatusUnprocessableEntity, "amount_mismatch"},
		} {
			t.Run(c.name, func(t *testing.T) { refused(t, c.w, c.status, c.code) })
		}
		if o := e.getOrder(t, id); o.Status != order.StatusAwaitingPayment {
			t.Fatalf("order is %s after refused notifications, want awaiting_payment", o.Status)
		}
		if ps := e.payments(t, id); ps[0].Status != StatusCreated || ps[0].SucceededAt != nil {
			t.Fatalf("payment %+v after refused notifications, want created", ps[0])
		}
		if n := e.count(t, "SELECT COUNT(*) FROM payment_notifications"); n != 0 {
			t.Fatalf("%d notifications recorded, want none", n)
		}
		if obs.refused.Load() != 16 {
			t.Fatalf("observer heard %d refusals, want 16", obs.refused.Load())
		}
		// The refusals did not use up the notification: delivered right,
		// with the headers the cases above left out or spoilt, it pays.
		if st := answer[map[string]string](t, with(stamp, sig), http.StatusOK)["status"]; st != OutcomeSucceeded {
			t.Fatalf("the good notification answered %q, want succeeded", st)
		}
	})
}

// TestNotifyAfterCancel: money that comes after the order was cancelled
// does not revive it: the payment needs a refund, is listed for admins,
// and is marked refunded once; a payment that paid its order cannot be.
func TestNotifyAfterCancel(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		obs := &outcomes{}
		s := e.service(t, webhookConfig("http://gateway.invalid", obs))
		ctx := context.Background()
		id := e.order(t, buyer, time.Now().Add(time.Hour))
		p := e.payment(t, id)
		if _, _, err := e.life.Do(ctx, order.Cancel, id); err != nil {
			t.Fatal(err)
		}
		w := s.notify(t, Notification{NotificationID: "late", Reference: p.Reference, Amount: p.Amount, Status: "succeeded"}, secret, time.Now())
		if st := answer[map[string]string](t, w, http.StatusOK)["status"]; st != OutcomeNeedsRefund {
			t.Fatalf("notify answered %q, want needs_refund", st)
		}
		if o := e.getOrder(t, id); o.Status != order.StatusCancelled || o.Live != nil || o.PaidAt != nil {
			t.Fatalf("order %+v, want still cancelled, not live, never paid", o)
		}
		e.conserved(t)

		// Another payment paid its order: not listed.
		paid := e.order(t, buyer+1, time.Now().Add(time.Hour))
		pp := e.payment(t, paid)
		s.notify(t, Notification{NotificationID: "ok", Reference: pp.Reference, Amount: pp.Amount, Status: "succeeded"}, secret, time.Now())

		refused(t, s.as(t, buyer, false, http.MethodGet, "/api/v1/admin/refunds"), http.StatusForbidden, "forbidden")
		list := answer[struct{ Payments []View }](t, s.as(t, 1, true, http.MethodGet, "/api/v1/admin/refunds"), http.StatusOK)
		if len(list.Payments) != 1 || list.Payments[0].PaymentID != p.ID || list.Payments[0].OrderID != id ||
			list.Payments[0].Status != StatusNeedsRefund || list.Payments[0].SucceededAt == nil || list.Payments[0].Amount != p.Amount {
			t.Fatalf("refunds %+v, want payment %d of order %d needing a refund", list.Payments, p.ID, id)
		}

		mark := func(pid int64) *httptest.ResponseRecorder {
			return s.as(t, 1, true, http.MethodPost, "/api/v1/admin/payments/"+strconv.FormatInt(pid, 10)+"/refunded")
		}
		first := answer[View](t, mark(p.ID), http.StatusOK)
		if first.Status != StatusRefunded || first.RefundedAt == nil {
			t.Fatalf("marked %+v, want refunded with its time", first)
		}
		if again := answer[View](t, mark(p.ID), http.StatusOK); again.Status != StatusRefunded || !again.RefundedAt.Equal(*first.RefundedAt) {
			t.Fatalf("marked again %+v, want the same refund", again)
		}
		refused(t, mark(pp.ID), http.StatusConflict, "wrong_state")
		refused(t, mark(p.ID+1000), http.StatusNotFound, "payment_not_found")
		list = answer[struct{ Payments []View }](t, s.as(t, 1, true, http.MethodGet, "/api/v1/admin/refunds"), http.StatusOK)
		if len(list.Payments) != 0 {
			t.Fatalf("refunds %+v after marking, want none", list.Payments)
		}
		if o := e.getOrder(t, id); o.Status != order.StatusCancelled {
			t.Fatalf("order is %s after the refund, want cancelled", o.Status)
		}
		if obs.needsRefund.Load() != 1 {
			t.Fatalf("observer heard %d refunds needed, want 1", obs.needsRefund.Load())
		}
	})
}

// TestPaidTwice: two payments of one order both succeed at the gateway:
// the first pays the order, the second needs a refund.
func TestPaidTwice(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		s := e.service(t, webhookConfig("http://gateway.invalid", nil))
		id := e.order(t, buyer, time.Now().Add(time.Hour))
		first := e.payment(t, id)
		second := first
		second.ID, second.Reference = 0, first.Reference+"-again"
		if err := e.db.Create(&second).Error; err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			p    Payment
			want string
		}{{first, OutcomeSucceeded}, {second, OutcomeNeedsRefund}} {
			n := Notification{NotificationID: "n-" + c.p.Reference, Reference: c.p.Reference, Amount: c.p.Amount, Status: "succeeded"}
			if st := answer[map[string]string](t, s.notify(t, n, secret, time.Now()), http.StatusOK)["status"]; st != c.want {
				t.Fatalf("payment %s answered %q, want %q", c.p.Reference, st, c.want)
			}
		}
		ps := e.payments(t, id)
		if o := e.getOrder(t, id); o.Status != order.StatusPaid || ps[0].Status != StatusSucceeded || ps[1].Status != StatusNeedsRefund {
			t.Fatalf("order %s, payments %s and %s; want paid, succeeded and needs_refund", o.Status, ps[0].Status, ps[1].Status)
		}
		if v := answer[order.View](t, s.as(t, buyer, false, http.MethodGet, "/api/v1/orders/"+strconv.FormatInt(id, 10)), http.StatusOK); v.Status != order.StatusPaid || !v.NeedsRefund {
			t.Fatalf("the buyer's view %+v; want paid, with the second payment's money owed back", v)
		}
	})
}

// ps0 is the order's first payment.
func ps0(t testing.TB, e env, orderID int64) Payment {
	t.Helper()
	ps := e.payments(t, orderID)
	if len(ps) == 0 {
		t.Fatalf("order %d has no payment", orderID)
	}
	return ps[0]
}

// TestPayPressedAtOnce: 50 presses of Pay on one order with the dev
// provider, released at once. Every press answers 200 with the order paid
// and the one payment that paid it: none answers 503 or pays twice.
func TestPayPressedAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		s := e.service(t, Config{Provider: ProviderDev})
		id := e.order(t, buyer, time.Now().Add(time.Hour))
		start := make(chan struct{})
		var wg sync.WaitGroup
		codes := make([]int, 50)
		refs := make([]string, 50)
		for i := range codes {
			wg.Go(func() {
				<-start
				w := s.pay(t, buyer, id)
				codes[i] = w.Code
				var a PayAnswer
				if err := json.Unmarshal(w.Body.Bytes(), &a); err == nil && a.Order.Status == order.StatusPaid {
					refs[i] = a.Payment.Reference
				}
			})
		}
		close(start)
		wg.Wait()
		ps := e.payments(t, id)
		if len(ps) != 1 || ps[0].Status != StatusSucceeded {
			t.Fatalf("payments %+v, want one succeeded", ps)
		}
		for i := range codes {
			if codes[i] != http.StatusOK || refs[i] != ps[0].Reference {
				t.Fatalf("press %d answered %d with payment %q, want 200 with %q", i, codes[i], refs[i], ps[0].Reference)
			}
		}
		e.conserved(t)
	})
}
