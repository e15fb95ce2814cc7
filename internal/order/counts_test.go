package order

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestCountsKeptUnderStampede: callers released at once on a voucher with
// 240 written orders: 180 callers each pay, cancel or expire one of them,
// three expire 20 each in a batch as the sweeper does, and six write 10
// new orders each through the writer (one batch the careful way, one order
// at a time: it holds a second purchase of a buyer), while recounts run
// one after another: the first fixes a hand edit of the counters, the
// others find nothing. The order counters then say
// what counting the orders says, state by state with the amounts; so do
// the sweeper's state counts and the console's figures read from them;
// and each counter moved by exactly the moves the callers won.
func TestCountsKeptUnderStampede(t *testing.T) {
	t.Parallel()
	const written, fresh, price = 240, 60, 1990
	eachLifeDB(t, price, written+fresh, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		ps := make([]purchase, written)
		for i := range ps {
			ps[i] = e.reserve(t, e.v.ID)
		}
		for i := 0; i < written; i += 40 {
			e.write(t, ps[i:i+40]...)
		}
		late := e.lifecycleAhead(2 * lifeWindow)
		actions := []Action{Pay, Cancel, Expire, Expire}
		var moved [len(lifeActions)]atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		var batched []int64 // expired in batches, as the sweeper does
		for i, p := range ps {
			a := actions[i%len(actions)]
			if i%len(actions) == 3 {
				batched = append(batched, p.order)
				continue
			}
			wg.Go(func() {
				<-start
				_, m, err := late.Do(ctx, a, p.order)
				if err != nil && !errors.Is(err, ErrUnitNotBack) {
					t.Errorf("order %d: %s: %v", p.order, a, err)
				}
				if m {
					moved[a].Add(1)
				}
			})
		}
		for i := 0; i < len(batched); i += 20 {
			ids := batched[i : i+20]
			wg.Go(func() {
				<-start
				got, err := late.ExpireAll(ctx, ids)
				if err != nil || len(got) != len(ids) {
					t.Errorf("expire %d orders in a batch: %d back, %v", len(ids), len(got), err)
				}
			})
		}
		news := make([]purchase, fresh)
		for i := range news {
			news[i] = e.reserve(t, e.v.ID)
		}
		for i := 0; i < fresh; i += 10 {
			batch := news[i : i+10]
			msgs := make([]mq.Message, len(batch))
			for j, p := range batch {
				msgs[j] = p.m
			}
			if i == 0 {
				// A second purchase of a buyer holding a live order (one
				// paid meanwhile): the batch's bulk insert meets the one
				// live order per buyer key and goes the careful way, one
				// order at a time; that message ends as a dead letter.
				id := e.next.Add(1)
				m := voucher.Message{OrderID: id, UserID: ps[0].user, VoucherID: e.v.ID, AcceptedAt: time.Now()}
				msgs = append(msgs, mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(id, 10), Values: m.Encode()})
			}
			wg.Go(func() {
				<-start
				out, err := e.w.Handle(ctx, msgs)
				if err != nil || len(out) != len(msgs) || slices.ContainsFunc(out, func(o mq.Outcome) bool { return o != mq.Ack }) {
					t.Errorf("a batch of %d new orders: %v, %v; want each acked", len(msgs), out, err)
				}
			})
		}
		// A hand edit the first recount fixes while the callers run; the
		// recounts after it, one after another all along, find nothing.
		if err := e.db.Exec("UPDATE order_counts SET n = n + 7 WHERE voucher_id = ? AND status = ?", e.v.ID, StatusAwaitingPayment).Error; err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		recounts, fixes := 0, 0
		recounted := make(chan struct{})
		go func() {
			defer close(recounted)
			<-start
			for {
				select {
				case <-stop:
					return
				default:
				}
				fixed, err := RecountAll(ctx, e.db)
				if err != nil {
					t.Errorf("a recount during the stampede: %v", err)
					return
				}
				recounts, fixes = recounts+1, fixes+len(fixed)
			}
		}()
		close(start)
		wg.Wait()
		close(stop)
		<-recounted
		if recounts < 2 || fixes != 1 {
			t.Errorf("%d recounts fixed %d vouchers during the stampede; want at least 2 recounts, the first fixing the hand edit, none after", recounts, fixes)
		}

		const each = written / 4
		for a, want := range map[Action]int64{Pay: each, Cancel: each, Expire: each} {
			if got := moved[a].Load(); got != want {
				t.Errorf("%s: %d moves won, want %d", a, got, want)
			}
		}
		kept, err := readCounts(ctx, e.db, []int64{e.v.ID})
		if err != nil {
			t.Fatal(err)
		}
		actual, err := countOrders(e.db.WithContext(ctx), e.v.ID, false)
		if err != nil {
			t.Fatal(err)
		}
		want := counts{
			{e.v.ID, StatusAwaitingPayment, ""}:      {fresh, fresh * price},
			{e.v.ID, StatusPaid, ""}:                 {each, each * price},
			{e.v.ID, StatusCancelled, CancelByBuyer}: {each, each * price},
			{e.v.ID, StatusCancelled, CancelExpired}: {2 * each, 2 * each * price},
		}
		if !maps.Equal(actual, want) {
			t.Fatalf("the orders say %v; want %v", actual, want)
		}
		if !maps.Equal(kept, actual) {
			t.Fatalf("the counters say %v; the orders %v", kept, actual)
		}
		states, err := CountStates(ctx, e.db)
		if err != nil {
			t.Fatal(err)
		}
		wantStates := map[string]int64{StatusAwaitingPayment: fresh, StatusPaid: each, StatusUsed: 0, StatusCancelled: 3 * each, StatusRefunded: 0}
		if !maps.Equal(states, wantStates) {
			t.Fatalf("states %v; want %v", states, wantStates)
		}
		figs, err := NewStore(e.db).Figures(ctx, time.Now(), 10)
		if err != nil || len(figs) != 1 {
			t.Fatalf("figures %+v, %v", figs, err)
		}
		f := figs[0]
		if f.AwaitingPayment != fresh || f.Paid != each || f.Cancelled != each || f.Expired != 2*each ||
			f.Sold != fresh+each || f.Revenue != each*price || f.StockLeft != 3*each {
			t.Fatalf("figures %+v", f)
		}
	})
}

// TestRecountAll: counters missing for orders (as after orders written by
// hand) and counters edited by hand are set to what the orders say; a
// voucher whose counters are right is not reported, and a second recount
// finds nothing.
func TestRecountAll(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 10, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		right := e.newVoucher(t, 0, 5)
		for range 4 {
			e.buy(t)
		}
		p := e.reserve(t, right.ID)
		e.write(t, p)
		if _, _, err := e.life.Do(ctx, Cancel, e.buy(t).order); err != nil {
			t.Fatal(err)
		}
		// Orders no counter holds (their rows deleted), and a hand edit
		// to a slot.
		if err := e.db.Exec("DELETE FROM order_counts WHERE voucher_id = ? AND status = ?", e.v.ID, StatusAwaitingPayment).Error; err != nil {
			t.Fatal(err)
		}
		if err := e.db.Exec("UPDATE order_counts SET n = n + 7 WHERE voucher_id = ? AND status = ?", e.v.ID, StatusCancelled).Error; err != nil {
			t.Fatal(err)
		}
		got, err := RecountAll(ctx, e.db)
		if err != nil {
			t.Fatal(err)
		}
		wantBefore := map[string]int64{StatusCancelled + ":" + CancelByBuyer: 8}
		wantAfter := map[string]int64{StatusAwaitingPayment: 4, StatusCancelled + ":" + CancelByBuyer: 1}
		if len(got) != 1 || got[0].VoucherID != e.v.ID || !maps.Equal(got[0].Before, wantBefore) || !maps.Equal(got[0].After, wantAfter) {
			t.Fatalf("recounted %+v; want voucher %d from %v to %v", got, e.v.ID, wantBefore, wantAfter)
		}
		for _, id := range []int64{e.v.ID, right.ID} {
			kept, err := readCounts(ctx, e.db, []int64{id})
			if err != nil {
				t.Fatal(err)
			}
			actual, err := countOrders(e.db.WithContext(ctx), id, false)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(kept, actual) {
				t.Fatalf("voucher %d: counters %v after the recount, orders %v", id, kept, actual)
			}
		}
		if again, err := RecountAll(ctx, e.db); err != nil || len(again) != 0 {
			t.Fatalf("a second recount: %+v, %v; want nothing", again, err)
		}
	})
}
