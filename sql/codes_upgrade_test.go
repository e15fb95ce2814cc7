package schema

import (
	"context"
	"testing"
	"time"
)

// TestUpgradeLeavesOldPaidOrdersWithoutCode applies the migrations before
// voucher codes (0001-0005), writes paid and used orders as the service
// did then, and applies the rest: those orders keep no code (NULL, shown
// as none: their buyers redeem by order id as before), any number of
// orders may have none, and a code is one order's only.
func TestUpgradeLeavesOldPaidOrdersWithoutCode(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			g, exec, now := oldDB(t, dialect, 5)
			exec("INSERT INTO vouchers (id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at) VALUES (1, 'v', 1000, 500, 10, 7, ?, ?, ?, ?)",
				now.Add(-time.Hour), now.Add(time.Hour), now, now)
			const ocols = "id, user_id, voucher_id, accepted_at, created_at, status, live, amount, paid_at, used_at"
			for _, o := range [][]any{
				{21, 1, 1, now, now, "paid", 1, 500, now, nil},
				{22, 2, 1, now, now, "used", 1, 500, now, now},
				{23, 3, 1, now, now, "awaiting_payment", 1, 500, nil, nil},
			} {
				exec("INSERT INTO orders ("+ocols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", o...)
			}
			if _, err := Apply(context.Background(), g); err != nil {
				t.Fatal(err)
			}
			var withCode int64
			if err := g.Raw("SELECT COUNT(*) FROM orders WHERE code IS NOT NULL").Scan(&withCode).Error; err != nil {
				t.Fatal(err)
			}
			if withCode != 0 {
				t.Fatalf("%d orders got a code in the upgrade; want none", withCode)
			}
			exec("UPDATE orders SET code = 'ABCDE23456' WHERE id = 21")
			if err := g.Exec("UPDATE orders SET code = 'ABCDE23456' WHERE id = 22").Error; err == nil {
				t.Fatal("two orders hold one code")
			}
		})
	}
}
