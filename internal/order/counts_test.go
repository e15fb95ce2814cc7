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
		ps := make([]purchase, written)
		for i := range ps {
			ps[i] = e.reserve(t, e.v.ID)
		}
		for i := 0; i < written; i += 40 {
			e.write(t, ps[i:i+40]...)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		moved := moveAtOnce(t, e, ps, start, &wg)
		writeAtOnce(t, e, fresh, ps[0].user, start, &wg)
		// A hand edit the first recount fixes while the callers run; the
		// recounts after it, one after another all along, find nothing.
		if err := e.db.Exec("UPDATE order_counts SET n = n + 7 WHERE voucher_id = ? AND status = ?", e.v.ID, StatusAwaitingPayment).Error; err != nil {
			t.Fatal(err)
		}
		recounted := recountAlong(t, e, start)
		close(start)
		wg.Wait()
		if recounts, fixes := recounted(); recounts < 2 || fixes != 1 {
			t.Errorf("%d recounts fixed %d vouchers during the stampede; want at least 2 recounts, the first fixing the hand edit, none after", recounts, fixes)
		}
		const each = written / 4
		for a, want := range map[Action]int64{Pay: each, Cancel: each, Expire: each} {
			if got := moved[a].Load(); got != want {
				t.Errorf("%s: %d moves won, want %d", a, got, want)
			}
		}
		checkCounts(t, e, counts{
			{e.v.ID, StatusAwaitingPayment, ""}:      {fresh, fresh * price},
			{e.v.ID, StatusPaid, ""}:                 {each, each * price},
			{e.v.ID, StatusCancelled, CancelByBuyer}: {each, each * price},
			{e.v.ID, StatusCancelled, CancelExpired}: {2 * each, 2 * each * price},
		})
		figs, err := NewStore(e.db).Figures(context.Background(), time.Now(), 10)
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

// moveAtOnce sets a caller on each written order, to start with start:
// pay, cancel or expire it (Lifecycle.Do), or, a fourth of them, expire
// 20 at a time in a batch as the sweeper does (ExpireAll). It returns the
// moves each action won.
func moveAtOnce(t *testing.T, e lifeEnv, ps []purchase, start chan struct{}, wg *sync.WaitGroup) *[len(lifeActions)]atomic.Int64 {
	ctx := context.Background()
	late := e.lifecycleAhead(2 * lifeWindow)
	actions := []Action{Pay, Cancel, Expire, Expire}
	var moved [len(lifeActions)]atomic.Int64
	var batched []int64
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
		ids := batched[i:min(i+20, len(batched))]
		wg.Go(func() {
			<-start
			got, err := late.ExpireAll(ctx, ids)
			if err != nil || len(got) != len(ids) {
				t.Errorf("expire %d orders in a batch: %d back, %v", len(ids), len(got), err)
			}
		})
	}
	return &moved
}

// writeAtOnce sets writers of n new orders, 10 a batch, to start with
// start. The first batch also holds a second purchase of buyer, who holds
// a live order (paid meanwhile): its bulk insert meets the one live order
// per buyer key and goes the careful way, one order at a time; that
// message ends as a dead letter.
func writeAtOnce(t *testing.T, e lifeEnv, n int, buyer int64, start chan struct{}, wg *sync.WaitGroup) {
	for i := 0; i < n; i += 10 {
		var msgs []mq.Message
		for range min(10, n-i) {
			msgs = append(msgs, e.reserve(t, e.v.ID).m)
		}
		if i == 0 {
			id := e.next.Add(1)
			m := voucher.Message{OrderID: id, UserID: buyer, VoucherID: e.v.ID, AcceptedAt: time.Now()}
			msgs = append(msgs, mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(id, 10), Values: m.Encode()})
		}
		wg.Go(func() {
			<-start
			out, err := e.w.Handle(context.Background(), msgs)
			if err != nil || len(out) != len(msgs) || slices.ContainsFunc(out, func(o mq.Outcome) bool { return o != mq.Ack }) {
				t.Errorf("a batch of %d new orders: %v, %v; want each acked", len(msgs), out, err)
			}
		})
	}
}

// recountAlong runs RecountAll again and again from start until the
// function it returns is called, which reports how many recounts ran and
// how many vouchers they fixed in all.
func recountAlong(t *testing.T, e lifeEnv, start chan struct{}) func() (recounts, fixes int) {
	stop, done := make(chan struct{}), make(chan struct{})
	var recounts, fixes int
	go func() {
		defer close(done)
		<-start
		for {
			select {
			case <-stop:
				return
			default:
			}
			fixed, err := RecountAll(context.Background(), e.db)
			if err != nil {
				t.Errorf("a recount during the stampede: %v", err)
				return
			}
			recounts, fixes = recounts+1, fixes+len(fixed)
		}
	}()
	return func() (int, int) {
		close(stop)
		<-done
		return recounts, fixes
	}
}

// checkCounts checks that the env's voucher's orders are want, that the
// order counters say the same, and the sweeper's state counts too.
func checkCounts(t *testing.T, e lifeEnv, want counts) {
	t.Helper()
	ctx := context.Background()
	kept, err := readCounts(ctx, e.db, []int64{e.v.ID})
	if err != nil {
		t.Fatal(err)
	}
	actual, err := countOrders(e.db.WithContext(ctx), e.v.ID, false)
	if err != nil {
		t.Fatal(err)
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
	wantStates := map[string]int64{StatusAwaitingPayment: 0, StatusPaid: 0, StatusUsed: 0, StatusCancelled: 0, StatusRefunded: 0}
	for k, c := range want {
		wantStates[k.Status] += c.N
	}
	if !maps.Equal(states, wantStates) {
		t.Fatalf("states %v; want %v", states, wantStates)
	}
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
