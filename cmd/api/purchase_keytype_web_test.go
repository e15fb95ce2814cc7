package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestPurchaseWrongTypedKeyWritesNothing overwrites the shard's order
// stream, then its pending-order index, with a string: a purchase answers
// 503 and changes nothing in Redis or MariaDB, and pressing again is
// answered the same way, never already_purchased for an order that does not
// exist. Once the key is removed, the same buyer buys and the order lands.
func TestPurchaseWrongTypedKeyWritesNothing(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"stream", "pending"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			s := startWeb(t, map[string]string{"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn"})
			vid := createVoucher(t, s.base, 5)
			keys := voucher.NewKeys(s.prefix, 1)
			key := keys.Stream(keys.Shard(vid))
			if which == "pending" {
				key = keys.Pending(keys.Shard(vid))
			}
			rdb, g := testenv.Redis(t), s.db(t)
			ctx := context.Background()
			if err := rdb.Set(ctx, key, "junk", 0).Err(); err != nil {
				t.Fatal(err)
			}
			url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, vid)
			tok := token(t, 77, auth.RoleUser)
			before := s.snapshot(t, rdb, g)
			for try := range 3 {
				a := sendJSON(t, "POST", url, tok, nil)
				if a.status != 503 || a.code() != "unavailable" {
					t.Fatalf("try %d: %d %s, want 503 unavailable", try, a.status, a.raw)
				}
			}
			if d := before.diff(s.snapshot(t, rdb, g)); len(d) > 0 {
				t.Fatalf("refused purchases changed state: %v", d)
			}

			if err := rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			a := sendJSON(t, "POST", url, tok, nil)
			if a.status != 202 {
				t.Fatalf("after the key was removed: %d %s", a.status, a.raw)
			}
			orderID, _ := a.body["order_id"].(string)
			testenv.WaitFor(t, 30*time.Second, "the order written", func() bool {
				o := sendJSON(t, "GET", s.base+"/api/v1/orders/"+orderID, tok, nil)
				return o.status == 200 && o.body["status"] == "paid"
			})
		})
	}
}
