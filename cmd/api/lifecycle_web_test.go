package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

// grab releases the buyers at once on a voucher and returns the order id
// each winner got; every loser must be refused sold_out.
func grab(t *testing.T, base string, voucherID int64, buyers []int64) map[int64]int64 {
	t.Helper()
	start := make(chan struct{})
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		won = map[int64]int64{}
	)
	for _, u := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, voucherID), token(t, u, auth.RoleUser), nil)
			switch {
			case a.status == http.StatusAccepted:
				id, err := strconv.ParseInt(a.body["order_id"].(string), 10, 64)
				if err != nil {
					t.Errorf("user %d: order id %v", u, a.body["order_id"])
					return
				}
				mu.Lock()
				won[u] = id
				mu.Unlock()
			case a.status == http.StatusConflict && a.code() == "sold_out":
			default:
				t.Errorf("user %d: %d %s", u, a.status, a.raw)
			}
		}()
	}
	close(start)
	wg.Wait()
	return won
}

// orderOf reads an order as its buyer sees it.
func orderOf(t *testing.T, base string, user, id int64) answer {
	t.Helper()
	return sendJSON(t, "GET", fmt.Sprintf("%s/api/v1/orders/%d", base, id), token(t, user, auth.RoleUser), nil)
}

// waitStatus waits until the buyer's order has the status.
func waitStatus(t *testing.T, base string, user, id int64, status string) answer {
	t.Helper()
	var a answer
	testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("order %d %s", id, status), func() bool {
		a = orderOf(t, base, user, id)
		return a.status == 200 && a.body["status"] == status
	})
	return a
}

// TestUnpaidOrdersGoBackOnSale runs a priced sale on MariaDB and on
// SQLite: 200 buyers at once on 40 units; of the 40 winners a quarter pay,
// a quarter cancel, half never pay. Cancelled units are on sale again at
// once, the unpaid ones after the pay window (seconds here); a second
// stampede, with the cancellers among it, sells exactly those 30 units,
// and then the live orders are the stock, every invariant holds, and
// Redis agrees.
func TestUnpaidOrdersGoBackOnSale(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{
				"SECKILL_LOG_LEVEL": "warn", "SECKILL_PAY_WINDOW": "10s", "SECKILL_EXPIRY_SWEEP": "1s",
				"SECKILL_PAY_PROVIDER": "dev", "SECKILL_RATE_LIMIT": "off",
			}
			dir := t.TempDir()
			if dialect == "sqlite" {
				env["SECKILL_MYSQL_DSN"], env["SECKILL_DATA_DIR"] = "", dir
			}
			s := startWeb(t, env)
			var g *gorm.DB
			if dialect == "sqlite" {
				var err error
				if g, err = db.OpenSQLite(filepath.Join(dir, "seckill.db")); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close(g) })
			} else {
				g = s.db(t)
			}
			const stock = 40
			admin := token(t, 1, auth.RoleAdmin)
			a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", admin, map[string]any{
				"title": "priced", "face_value": 1000, "price": 500, "stock": stock,
				"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
			})
			if a.status != http.StatusCreated {
				t.Fatalf("create voucher: %d %s", a.status, a.raw)
			}
			vid := int64(a.body["voucher"].(map[string]any)["id"].(float64))

			var first []int64
			for u := range int64(200) {
				first = append(first, 50_000+u)
			}
			won := grab(t, s.base, vid, first)
			if len(won) != stock {
				t.Fatalf("%d winners of %d units", len(won), stock)
			}
			var payers, cancellers, idle []int64
			for u := range won {
				switch {
				case len(payers) < stock/4:
					payers = append(payers, u)
				case len(cancellers) < stock/4:
					cancellers = append(cancellers, u)
				default:
					idle = append(idle, u)
				}
			}
			for u, id := range won {
				o := waitStatus(t, s.base, u, id, "awaiting_payment")
				if o.body["amount"] != float64(500) || o.body["pay_deadline"] == nil || o.body["pay_seconds_left"] == nil {
					t.Fatalf("order awaiting payment: %s", o.raw)
				}
			}
			for _, u := range payers {
				p := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/pay", s.base, won[u]), token(t, u, auth.RoleUser), nil)
				if p.status != 200 {
					t.Fatalf("pay: %d %s", p.status, p.raw)
				}
				waitStatus(t, s.base, u, won[u], "paid")
			}
			for _, u := range cancellers {
				c := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", s.base, won[u]), token(t, u, auth.RoleUser), nil)
				if c.status != 200 || c.body["status"] != "cancelled" || c.body["cancel_reason"] != "buyer" {
					t.Fatalf("cancel: %d %s", c.status, c.raw)
				}
				// Cancelling again answers the same; paying it is refused.
				if c := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", s.base, won[u]), token(t, u, auth.RoleUser), nil); c.status != 200 || c.body["status"] != "cancelled" {
					t.Fatalf("cancel again: %d %s", c.status, c.raw)
				}
				if p := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/pay", s.base, won[u]), token(t, u, auth.RoleUser), nil); p.status != http.StatusConflict || p.code() != "wrong_state" {
					t.Fatalf("pay a cancelled order: %d %s", p.status, p.raw)
				}
			}
			// Someone else's order is no order at all.
			if c := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", s.base, won[idle[0]]), token(t, 7, auth.RoleUser), nil); c.status != http.StatusNotFound {
				t.Fatalf("cancel another's order: %d %s", c.status, c.raw)
			}
			for _, u := range idle {
				o := waitStatus(t, s.base, u, won[u], "cancelled")
				if o.body["cancel_reason"] != "expired" {
					t.Fatalf("unpaid order: %s", o.raw)
				}
			}

			second := append([]int64(nil), cancellers...)
			for u := range int64(200) {
				second = append(second, 60_000+u)
			}
			// The units come back in Redis just after the moves: wait until
			// the live stock shows them, then stampede.
			var last answer
			testenv.WaitFor(t, 30*time.Second, "30 units back on sale", func() bool {
				last = sendJSON(t, "GET", fmt.Sprintf("%s/api/v1/vouchers/%d", s.base, vid), "", nil)
				return last.body["stock"] == float64(stock-len(payers))
			})
			again := grab(t, s.base, vid, second)
			if len(again) != stock-len(payers) {
				t.Fatalf("second stampede: %d winners, want %d", len(again), stock-len(payers))
			}
			accepted := map[int64]int64{}
			for u, id := range won {
				accepted[id] = u
			}
			for u, id := range again {
				accepted[id] = u
				waitStatus(t, s.base, u, id, "awaiting_payment")
			}
			keys := voucher.NewKeys(s.prefix, 1)
			rdb := testenv.Redis(t)
			var rep verify.Report
			testenv.WaitFor(t, 30*time.Second, "invariants", func() bool {
				var err error
				rep, err = verify.Check(context.Background(), g, rdb, keys, verify.Input{VoucherID: vid, Accepted: accepted, Group: orderGroup})
				if err != nil {
					t.Fatal(err)
				}
				return rep.OK()
			})
			if !rep.OK() {
				t.Fatalf("invariants:\n%s", rep)
			}
			counts := map[string]int64{}
			var rows []struct {
				Status string
				N      int64
			}
			if err := g.Raw("SELECT status, COUNT(*) AS n FROM orders WHERE voucher_id = ? GROUP BY status", vid).Scan(&rows).Error; err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				counts[r.Status] = r.N
			}
			live := counts["awaiting_payment"] + counts["paid"] + counts["used"]
			if live != stock || counts["paid"] != int64(len(payers)) || counts["cancelled"] != int64(len(cancellers)+len(idle)) {
				t.Fatalf("orders by state %v: want %d live, %d paid, %d cancelled", counts, stock, len(payers), len(cancellers)+len(idle))
			}
		})
	}
}

// TestCancelledUnitSoldThroughTheOtherInstance: two instances that answer
// refusals from memory for 5 s. The sale sells out; a buyer cancels
// through one instance, and a new buyer gets the unit through the other
// one well within those 5 s: the cancellation's event dropped what it
// remembered.
func TestCancelledUnitSoldThroughTheOtherInstance(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"SECKILL_LOG_LEVEL": "warn", "SECKILL_PAY_PROVIDER": "dev", "SECKILL_RATE_LIMIT": "off",
		"SECKILL_LOCAL_REFUSALS_TTL": "5s", "SECKILL_KEY_PREFIX": testenv.Prefix(t), "SECKILL_MYSQL_DSN": testenv.MySQLDSN(t),
	}
	a := startWeb(t, env)
	b := startWeb(t, env)
	admin := token(t, 1, auth.RoleAdmin)
	v := sendJSON(t, "POST", a.base+"/api/v1/vouchers", admin, map[string]any{
		"title": "one", "face_value": 1000, "price": 100, "stock": 1,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if v.status != http.StatusCreated {
		t.Fatalf("create voucher: %d %s", v.status, v.raw)
	}
	vid := int64(v.body["voucher"].(map[string]any)["id"].(float64))
	buy := func(base string, user int64) answer {
		return sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, vid), token(t, user, auth.RoleUser), nil)
	}
	first := buy(a.base, 70_001)
	if first.status != http.StatusAccepted {
		t.Fatalf("first buyer: %d %s", first.status, first.raw)
	}
	id, _ := strconv.ParseInt(first.body["order_id"].(string), 10, 64)
	// b learns the sale is sold out, and remembers it.
	if r := buy(b.base, 70_002); r.status != http.StatusConflict || r.code() != "sold_out" {
		t.Fatalf("second buyer: %d %s", r.status, r.raw)
	}
	waitStatus(t, a.base, 70_001, id, "awaiting_payment")
	cancelled := time.Now()
	if c := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", a.base, id), token(t, 70_001, auth.RoleUser), nil); c.status != 200 {
		t.Fatalf("cancel: %d %s", c.status, c.raw)
	}
	var r answer
	testenv.WaitFor(t, 2*time.Second, "the unit sold through b", func() bool {
		r = buy(b.base, 70_003)
		return r.status == http.StatusAccepted
	})
	if time.Since(cancelled) >= 5*time.Second {
		t.Fatalf("sold through b only after the refusal expired")
	}
	// And the buyer who cancelled may buy again: the sale is sold out
	// again, so through a they are told so, not already_purchased.
	if r := buy(a.base, 70_001); r.status != http.StatusConflict || r.code() != "sold_out" {
		t.Fatalf("the buyer who cancelled: %d %s", r.status, r.raw)
	}
}
