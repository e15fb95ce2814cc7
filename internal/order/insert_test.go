package order

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// TestInsertOrdersAsGiven: the writer's insert stores every column of a
// new order as given, on MySQL (the driver writes the arguments into the
// statement, escaped) and on SQLite: ids, times in UTC to the millisecond
// whatever their zone, status, live, amount, NULLs, and a code holding
// quotes and a backslash as it is.
func TestInsertOrdersAsGiven(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqlite", "mariadb"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			g := testenv.DB(t, name)
			if _, err := schema.Apply(ctx, g); err != nil {
				t.Fatal(err)
			}
			v := voucher.Voucher{Title: "t", TotalStock: 10, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
			if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
				t.Fatal(err)
			}
			zone := time.FixedZone("UTC+5", 5*3600)
			at := time.Date(2026, 3, 4, 5, 6, 7, 123_456_789, zone)
			deadline, paid := at.Add(15*time.Minute), at.Add(time.Second)
			one := 1
			code, odd := "ABCDE23456", "AB'C\\D\"E"
			want := []Order{
				{ID: 7001, UserID: 11, VoucherID: v.ID, AcceptedAt: at, CreatedAt: at.Add(time.Millisecond), Status: StatusPaid, Live: &one, PaidAt: &paid, Code: &code},
				{ID: 7002, UserID: 12, VoucherID: v.ID, AcceptedAt: at, CreatedAt: at, Status: StatusAwaitingPayment, Live: &one, Amount: 1990, PayDeadline: &deadline},
			}
			oddRow := Order{ID: 7003, UserID: 13, VoucherID: v.ID, AcceptedAt: at, CreatedAt: at, Status: StatusPaid, Live: &one, PaidAt: &paid, Code: &odd}
			w := NewWriter(g, nil, voucher.NewKeys("t", 1), WriterConfig{}, quietLog)
			err := g.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				if err := w.insertOrders(tx, want); err != nil {
					return err
				}
				return w.insertOrders(tx, []Order{oddRow})
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range append(want, oddRow) {
				var got Order
				if err := g.WithContext(ctx).First(&got, o.ID).Error; err != nil {
					t.Fatal(err)
				}
				sameOrder(t, got, o)
			}
		})
	}
}

// sameOrder fails t unless got is want as stored: times equal to the
// millisecond (DATETIME(3)), pointers both nil or pointing to equal values.
func sameOrder(t *testing.T, got, want Order) {
	t.Helper()
	near := func(a, b time.Time) bool { d := a.Sub(b); return d > -time.Millisecond && d < time.Millisecond }
	nearPtr := func(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || near(*a, *b)) }
	samePtr := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	if got.ID != want.ID || got.UserID != want.UserID || got.VoucherID != want.VoucherID ||
		got.Status != want.Status || got.Amount != want.Amount ||
		(got.Live == nil) != (want.Live == nil) || (got.Live != nil && *got.Live != *want.Live) ||
		!near(got.AcceptedAt, want.AcceptedAt) || !near(got.CreatedAt, want.CreatedAt) ||
		!nearPtr(got.PayDeadline, want.PayDeadline) || !nearPtr(got.PaidAt, want.PaidAt) || !samePtr(got.Code, want.Code) ||
		got.UsedAt != nil || got.CancelledAt != nil || got.CancelReason != nil || got.RefundedAt != nil || got.UnitBackAt != nil {
		t.Fatalf("order %d stored as %+v, want %+v", want.ID, got, want)
	}
}
