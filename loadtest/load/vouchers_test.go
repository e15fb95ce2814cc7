package load

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// TestRunSpreadsOverVouchers: with Vouchers, a run creates that many and
// sends buyer u's purchases, repeats included, to voucher u mod n, so a
// sale of several vouchers loads every shard alike.
func TestRunSpreadsOverVouchers(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	created := int64(40)
	byVoucher := map[int64]map[int64]bool{} // voucher -> buyers seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/api/v1/vouchers" {
			created++
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"voucher":{"id":%d},"redis_ready":true}`, created)
			return
		}
		vid, _ := strconv.ParseInt(strings.Split(r.URL.Path, "/")[4], 10, 64)
		user, _ := strconv.ParseInt(r.Header.Get("X-Loadtest-User"), 10, 64)
		if byVoucher[vid] == nil {
			byVoucher[vid] = map[int64]bool{}
		}
		byVoucher[vid][user] = true
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"order_id":"%d","status":"pending"}`, user)
	}))
	defer srv.Close()

	res, err := Run(context.Background(), Config{URL: srv.URL, Vouchers: 3, Stock: 100, Users: 90, Requests: 150,
		Concurrency: 8, Secret: "0123456789abcdef0123456789abcdef", Progress: -1})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Summary.VoucherIDs) != "[41 42 43]" || res.Summary.Requests != 150 {
		t.Fatalf("vouchers %v, %d purchases", res.Summary.VoucherIDs, res.Summary.Requests)
	}
	for i, vid := range res.Summary.VoucherIDs {
		if len(byVoucher[vid]) != 30 {
			t.Errorf("voucher %d: %d buyers, want 30", vid, len(byVoucher[vid]))
		}
		for user := range byVoucher[vid] {
			if int(user-100_000)%3 != i {
				t.Errorf("buyer %d bought voucher %d (index %d)", user, vid, i)
			}
		}
	}
	if _, err := Run(context.Background(), Config{URL: srv.URL, Vouchers: 2, VoucherID: 7, Secret: "x"}); err == nil {
		t.Error("several vouchers with a given VoucherID: no error")
	}
}
