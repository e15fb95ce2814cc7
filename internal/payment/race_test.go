package payment

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"seckill/internal/order"
)

// TestPaymentRacesExpiry: on many orders past their deadline, the
// gateway's notification and the expiry arrive at once. Each order ends
// as exactly one of: paid with its payment succeeded (the expiry found it
// paid), or cancelled as expired, its unit given back once, with its
// payment needing a refund; and the answers say the same.
func TestPaymentRacesExpiry(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, e env) {
		s := e.service(t, webhookConfig("http://gateway.invalid", nil))
		ctx := context.Background()
		const orders = 40
		ids := make([]int64, orders)
		pays := make([]Payment, orders)
		for i := range ids {
			ids[i] = e.order(t, int64(100+i), time.Now().Add(-time.Second))
			pays[i] = e.payment(t, ids[i])
		}
		start := make(chan struct{})
		notified := make([]string, orders)
		expired := make([]error, orders)
		var wg sync.WaitGroup
		for i := range ids {
			wg.Go(func() {
				<-start
				_, _, expired[i] = e.life.Do(ctx, order.Expire, ids[i])
			})
			wg.Go(func() {
				<-start
				n := Notification{NotificationID: "n-" + strconv.Itoa(i), Reference: pays[i].Reference, Amount: pays[i].Amount, Status: "succeeded"}
				w := s.notify(t, n, secret, time.Now())
				var body map[string]string
				if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &body) != nil {
					notified[i] = strconv.Itoa(w.Code) + " " + w.Body.String()
					return
				}
				notified[i] = body["status"]
			})
		}
		close(start)
		wg.Wait()

		var paid, cancelled int
		for i, id := range ids {
			o := e.getOrder(t, id)
			ps := e.payments(t, id)
			if len(ps) != 1 {
				t.Fatalf("order %d: %d payments, want 1", id, len(ps))
			}
			p := ps[0]
			var wrong *order.StateError
			switch {
			case o.Status == order.StatusPaid && p.Status == StatusSucceeded:
				paid++
				if notified[i] != OutcomeSucceeded || !errors.As(expired[i], &wrong) || wrong.Status != order.StatusPaid {
					t.Errorf("order %d paid: notify answered %q, expiry %v; want succeeded and a wrong state (paid)", id, notified[i], expired[i])
				}
			case o.Status == order.StatusCancelled && p.Status == StatusNeedsRefund:
				cancelled++
				if notified[i] != OutcomeNeedsRefund || expired[i] != nil {
					t.Errorf("order %d cancelled: notify answered %q, expiry %v; want needs_refund and no error", id, notified[i], expired[i])
				}
				if o.CancelReason == nil || *o.CancelReason != order.CancelExpired || o.Live != nil || o.PaidAt != nil || o.UnitBackAt == nil {
					t.Errorf("order %d %+v: want expired, not live, never paid, unit back on sale", id, o)
				}
			default:
				t.Errorf("order %d is %s with its payment %s: want paid and succeeded, or cancelled and needs_refund", id, o.Status, p.Status)
			}
		}
		t.Logf("%d paid, %d cancelled with a refund", paid, cancelled)
		e.conserved(t)
		if stock, total := e.count(t, "SELECT stock FROM vouchers WHERE id = ?", e.voucher), e.count(t, "SELECT total_stock FROM vouchers WHERE id = ?", e.voucher); stock != total-int64(paid) {
			t.Fatalf("stock %d of %d, want %d: one unit back per cancelled order", stock, total, total-int64(paid))
		}
		if n := e.count(t, "SELECT COUNT(*) FROM payments WHERE status = ?", StatusNeedsRefund); n != int64(cancelled) {
			t.Fatalf("%d payments need a refund, want %d", n, cancelled)
		}
	})
}
