package schema

import (
	"context"
	"testing"
	"time"

	"seckill/internal/db"
)

// TestUpgradeKeepsOrders applies the migrations before the order
// lifecycle (0001-0003) to an empty database, writes a sale with orders
// as the service did then, and applies the rest as the service does at
// start-up: the old orders are paid (paid when written), live, with
// nothing to pay, the vouchers free, and the new guards hold them (one
// live order per buyer, state and live agreeing).
func TestUpgradeKeepsOrders(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			g, exec, now := oldDB(t, dialect, 3)
			exec("INSERT INTO vouchers (id, title, face_value, total_stock, stock, begin_at, end_at, created_at, updated_at) VALUES (1, 'old', 1000, 5, 3, ?, ?, ?, ?)",
				now.Add(-time.Hour), now.Add(time.Hour), now, now)
			exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (11, 101, 1, ?, ?), (12, 102, 1, ?, ?)", now, now, now, now)

			applied, err := Apply(context.Background(), g)
			if err != nil {
				t.Fatal(err)
			}
			if len(applied) == 0 || applied[0] != 4 {
				t.Fatalf("applied %v, want from 4 on", applied)
			}
			var rows []struct {
				ID       int64
				Status   string
				Live     *int
				Amount   int64
				PaidAt   *time.Time
				Deadline *time.Time `gorm:"column:pay_deadline"`
			}
			if err := g.Raw("SELECT id, status, live, amount, paid_at, pay_deadline FROM orders ORDER BY id").Scan(&rows).Error; err != nil {
				t.Fatal(err)
			}
			if len(rows) != 2 {
				t.Fatalf("orders after the upgrade: %+v", rows)
			}
			for _, r := range rows {
				if r.Status != "paid" || r.Live == nil || *r.Live != 1 || r.Amount != 0 || r.PaidAt == nil || r.Deadline != nil {
					t.Fatalf("order %d after the upgrade: %+v", r.ID, r)
				}
			}
			var price int64 = -1
			if err := g.Raw("SELECT price FROM vouchers WHERE id = 1").Scan(&price).Error; err != nil || price != 0 {
				t.Fatalf("voucher price after the upgrade: %d, %v", price, err)
			}
			// The guards hold the old rows: a second live order of buyer
			// 101 is refused; a cancelled one beside it is not; a state
			// that disagrees with live is refused.
			if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live) VALUES (13, 101, 1, ?, ?, 'paid', 1)", now, now).Error; !db.IsDuplicate(err) {
				t.Fatalf("a second live order of a buyer: %v, want a duplicate key", err)
			}
			exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live, cancelled_at, cancel_reason) VALUES (14, 101, 1, ?, ?, 'cancelled', NULL, ?, 'buyer')", now, now, now)
			if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live) VALUES (15, 103, 1, ?, ?, 'cancelled', 1)", now, now).Error; err == nil {
				t.Fatal("a cancelled order that is live was stored")
			}
			if err := g.Exec("UPDATE vouchers SET price = 2000 WHERE id = 1").Error; err == nil {
				t.Fatal("a price above the face value was stored")
			}
		})
	}
}
