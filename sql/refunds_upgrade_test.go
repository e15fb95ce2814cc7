package schema

import (
	"context"
	"testing"
	"time"
)

// TestUpgradeOwesRefunds applies the migrations up to the order lifecycle
// (0001-0004), writes payments as the service did then, and applies the
// rest: the money owed before (late, paid twice) says why and since when;
// a refunded order's payment, left succeeded then, is owed since the
// refund; the others are left as they were; an unknown reason is refused.
func TestUpgradeOwesRefunds(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			g, exec, now := oldDB(t, dialect, 4)
			paid, cancelled, refunded := now.Add(-3*time.Hour), now.Add(-2*time.Hour), now.Add(-time.Hour)
			exec("INSERT INTO vouchers (id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at) VALUES (1, 'v', 1000, 500, 10, 6, ?, ?, ?, ?)",
				now.Add(-time.Hour), now.Add(time.Hour), now, now)
			const ocols = "id, user_id, voucher_id, accepted_at, created_at, status, live, amount, paid_at, cancelled_at, cancel_reason, refunded_at"
			for _, o := range [][]any{
				{21, 1, 1, now, now, "paid", 1, 500, paid, nil, nil, nil},
				{22, 2, 1, now, now, "cancelled", nil, 500, nil, cancelled, "expired", nil},
				{23, 3, 1, now, now, "refunded", nil, 500, paid, nil, nil, refunded},
				{24, 4, 1, now, now, "awaiting_payment", 1, 500, nil, nil, nil, nil},
			} {
				exec("INSERT INTO orders ("+ocols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", o...)
			}
			const pcols = "id, order_id, provider, reference, amount, status, created_at, updated_at, succeeded_at, refunded_at"
			for _, p := range [][]any{
				{1, 21, "dev", "r1", 500, "succeeded", now, now, paid, nil},         // paid its order
				{2, 21, "webhook", "r2", 500, "needs_refund", now, now, now, nil},   // paid it twice
				{3, 22, "webhook", "r3", 500, "refunded", now, now, cancelled, now}, // came late, returned
				{4, 23, "dev", "r4", 500, "succeeded", now, now, paid, nil},         // its order refunded
				{5, 24, "webhook", "r5", 500, "created", now, now, nil, nil},        // open
			} {
				exec("INSERT INTO payments ("+pcols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", p...)
			}

			if _, err := Apply(context.Background(), g); err != nil {
				t.Fatal(err)
			}
			var rows []struct {
				ID                int64
				Status            string
				RefundReason      *string
				RefundRequestedAt *time.Time
			}
			if err := g.Raw("SELECT id, status, refund_reason, refund_requested_at FROM payments ORDER BY id").Scan(&rows).Error; err != nil {
				t.Fatal(err)
			}
			want := []struct {
				status, reason string
				since          *time.Time
			}{
				{"succeeded", "", nil},
				{"needs_refund", "duplicate", &now},
				{"refunded", "late", &cancelled},
				{"needs_refund", "order_refunded", &refunded},
				{"created", "", nil},
			}
			if len(rows) != len(want) {
				t.Fatalf("payments after the upgrade: %+v", rows)
			}
			for i, r := range rows {
				w := want[i]
				reason := ""
				if r.RefundReason != nil {
					reason = *r.RefundReason
				}
				if r.Status != w.status || reason != w.reason || (r.RefundRequestedAt == nil) != (w.since == nil) ||
					w.since != nil && !r.RefundRequestedAt.Equal(*w.since) {
					t.Errorf("payment %d after the upgrade: %s %q since %v, want %s %q since %v", r.ID, r.Status, reason, r.RefundRequestedAt, w.status, w.reason, w.since)
				}
			}
			if err := g.Exec("UPDATE payments SET refund_reason = 'because' WHERE id = 2").Error; err == nil {
				t.Fatal("an unknown refund reason was stored")
			}
		})
	}
}
