package main

import (
	"fmt"
	"seckill/internal/testenv"
	"sync"
	"testing"
	"time"

	"seckill/internal/auth"
)

// TestOneUserThousandPurchases releases 1,000 purchases of one user at
// once: exactly one is accepted, every other one is refused as already
// purchased (limits off, so all reach the script) or too many requests
// (limits on), and one order lands in MariaDB.
func TestOneUserThousandPurchases(t *testing.T) {
	t.Parallel()
	for _, limits := range []string{"off", "on"} {
		t.Run("limits="+limits, func(t *testing.T) {
			t.Parallel()
			s := startWeb(t, map[string]string{"SECKILL_RATE_LIMIT": limits, "SECKILL_LOG_LEVEL": "warn"})
			vid := createVoucher(t, s.base, 100)
			tok := token(t, 4242, auth.RoleUser)
			url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, vid)

			const n = 1000
			answers := make(chan answer, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					<-start
					answers <- send(t, "POST", url, nil, map[string]string{"Authorization": "Bearer " + tok})
				})
			}
			close(start)
			wg.Wait()
			close(answers)

			codes := map[string]int{}
			orderIDs := map[string]bool{}
			for a := range answers {
				switch {
				case a.status == 202:
					codes["accepted"]++
					orderIDs[a.body["order_id"].(string)] = true
				case a.status == 409 && a.code() == "already_purchased":
					codes[a.code()]++
					orderIDs[a.body["order_id"].(string)] = true
				case a.status == 429 && a.code() == "too_many_requests" && limits == "on" && a.header.Get("Retry-After") != "":
					codes[a.code()]++
				default:
					t.Errorf("unexpected answer %d %s", a.status, a.raw)
				}
			}
			if codes["accepted"] != 1 || len(orderIDs) != 1 {
				t.Fatalf("answers %v, order ids %v; want exactly one accepted order", codes, orderIDs)
			}
			if limits == "on" && codes["too_many_requests"] < n-50 {
				t.Fatalf("answers %v: the per-user limit let too many through", codes)
			}
			t.Logf("answers %v", codes)

			g := s.db(t)
			testenv.WaitFor(t, 30*time.Second, "the one accepted order written to MySQL", func() bool {
				var c int64
				g.Table("orders").Where("voucher_id = ?", vid).Count(&c)
				return c == 1
			})
			var c, stock int64
			g.Table("orders").Where("user_id = ?", 4242).Count(&c)
			g.Raw("SELECT stock FROM vouchers WHERE id = ?", vid).Scan(&stock)
			if c != 1 || stock != 99 {
				t.Fatalf("%d orders of the user, stock %d; want 1 and 99", c, stock)
			}
		})
	}
}
