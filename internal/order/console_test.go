package order

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestSearch: orders are found by order id, by voucher code (as typed)
// and by their buyer's phone (with or without its +, or its country code:
// a national number), of one voucher or of
// all, newest first, each with the phone; nothing that is none of these
// finds anything.
func TestSearch(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		s := NewStore(e.db)
		a, b := e.buy(t), e.buy(t)
		paid, _, err := e.life.Do(ctx, Pay, a.order)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		for i, u := range []int64{a.user, b.user} {
			if err := e.db.Exec("INSERT INTO users (id, phone, created_at, last_login_at) VALUES (?, ?, ?, ?)", u, "+861380000000"+strconv.Itoa(i), now, now).Error; err != nil {
				t.Fatal(err)
			}
		}
		other := e.newVoucher(t, 0, 5)
		c := e.reserve(t, other.ID)
		e.write(t, c)
		ids := func(fs []Found) []int64 {
			out := make([]int64, len(fs))
			for i, f := range fs {
				out[i] = f.ID
			}
			return out
		}
		code := *paid.Code
		for _, tc := range []struct {
			voucher int64
			q       string
			want    []int64
		}{
			{0, "", []int64{c.order, b.order, a.order}},
			{e.v.ID, "", []int64{b.order, a.order}},
			{0, strconv.FormatInt(b.order, 10), []int64{b.order}},
			{0, code, []int64{a.order}},
			{0, code[:5] + "-" + code[5:], []int64{a.order}},
			{0, "+8613800000001", []int64{b.order}},
			{0, "8613800000000", []int64{a.order}},
			{0, "+86 138-0000-0001", []int64{b.order}},
			{0, "(86) 138.0000.0001", []int64{b.order}},
			{0, "13800000001", []int64{b.order}},
			{0, "138 0000 0001", []int64{b.order}},
			{0, "138-0000-0000", []int64{a.order}},
			{0, "0086 138 0000 0000", []int64{a.order}},
			{0, "+1 380 000 0001", []int64{}},
			{other.ID, "8613800000000", []int64{}},
			{0, "no such thing", []int64{}},
			{0, "ZZZZZZZZZZ", []int64{}},
		} {
			got, err := s.Search(ctx, tc.voucher, tc.q, 50)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids(got), tc.want) {
				t.Errorf("search voucher %d %q: %v, want %v", tc.voucher, tc.q, ids(got), tc.want)
			}
		}
		got, err := s.Search(ctx, 0, code, 50)
		if err != nil || len(got) != 1 || got[0].Phone != "+8613800000000" || got[0].Code == nil || *got[0].Code != code {
			t.Fatalf("search by code: %+v %v; want the order with its buyer's phone", got, err)
		}
	})
}

// TestFigures: a voucher's figures count its orders by state, expired
// apart from cancelled, revenue only from paid and used, sold + stock left
// = the total, and the purchases of the last window per second.
func TestFigures(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		var ps []purchase
		for range 7 {
			ps = append(ps, e.buy(t))
		}
		do := func(a Action, p purchase) {
			t.Helper()
			if _, _, err := e.life.Do(ctx, a, p.order); err != nil {
				t.Fatalf("%s: %v", a, err)
			}
		}
		for _, p := range ps[:4] {
			do(Pay, p)
		}
		do(Redeem, ps[0])
		do(Refund, ps[1])
		do(Cancel, ps[4])
		if _, _, err := e.lifecycleAhead(2*lifeWindow).Do(ctx, Expire, ps[5].order); err != nil {
			t.Fatal(err)
		}
		empty := e.newVoucher(t, 0, 3)
		fs, err := NewStore(e.db).Figures(ctx, time.Now(), 50)
		if err != nil {
			t.Fatal(err)
		}
		want := Figures{VoucherID: e.v.ID, Title: "t", Price: 990, FaceValue: 5000, TotalStock: 10, StockLeft: 6,
			Sold: 4, AwaitingPayment: 1, Paid: 2, Used: 1, Cancelled: 1, Expired: 1, Refunded: 1, Revenue: 3 * 990,
			PerSecond: 7 / FiguresWindow.Seconds()}
		if len(fs) != 2 || fs[1] != want || fs[0].VoucherID != empty.ID || fs[0].Sold != 0 || fs[0].StockLeft != 3 {
			t.Fatalf("figures %+v\nwant %+v (and the empty voucher first)", fs, want)
		}
		later, err := NewStore(e.db).Figures(ctx, time.Now().Add(FiguresWindow+time.Second), 50)
		if err != nil || later[1].PerSecond != 0 {
			t.Fatalf("a window later: %+v %v; want no purchases per second", later, err)
		}
	})
}
