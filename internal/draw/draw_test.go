package draw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is a database, a Redis and a fair voucher on sale.
type env struct {
	db   *gorm.DB
	rdb  *redis.Client
	keys voucher.Keys
	v    voucher.Voucher
}

// newEnv puts a fair voucher of stock units on sale whose draw closes at
// closes, on a fresh database of dialect and a Redis of shards shards.
func newEnv(t *testing.T, dialect string, stock int, closes time.Time) env {
	t.Helper()
	ctx := context.Background()
	g := testenv.DB(t, dialect)
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	e := env{db: g, rdb: testenv.Redis(t), keys: voucher.NewKeys(testenv.Prefix(t), 2)}
	secret, err := voucher.NewDrawSecret()
	if err != nil {
		t.Fatal(err)
	}
	begin := closes.Add(-time.Second).Truncate(time.Millisecond)
	e.v = voucher.Voucher{Title: "fair", FaceValue: 100, TotalStock: stock, BeginAt: begin, EndAt: begin.Add(time.Hour),
		FairWindowMs: closes.Truncate(time.Millisecond).Sub(begin).Milliseconds(), DrawSecret: secret}
	if err := voucher.NewStore(g).Create(ctx, &e.v); err != nil {
		t.Fatal(err)
	}
	st := voucher.NewState(e.rdb, e.keys)
	if _, err := st.Load(ctx, e.v, nil); err != nil {
		t.Fatal(err)
	}
	for shard := range e.keys.Shards() {
		if err := st.MarkReady(ctx, shard); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// enterAll writes entries for users first..first+n-1 (ticket = 1000 +
// user), as draw_enter.lua would before the close.
func (e env) enterAll(t *testing.T, first int64, n int) {
	t.Helper()
	for u := first; u < first+int64(n); u++ {
		if err := e.rdb.HSet(context.Background(), entriesKey(e.keys, e.v.ID), u, 1000+u).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func (e env) drawer() *Drawer {
	return NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Retry: time.Millisecond}, quietLog)
}

// voucher re-reads the voucher.
func (e env) voucher(t *testing.T) voucher.Voucher {
	t.Helper()
	v, err := voucher.NewStore(e.db).Get(context.Background(), e.v.ID)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// buyers reads the buyers Redis holds for the voucher: user -> order.
func (e env) buyers(t *testing.T) map[string]string {
	t.Helper()
	m, err := e.rdb.HGetAll(context.Background(), e.keys.Buyers(e.v.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEnterOncePerBuyer: 100 buyers press 4 times each, all at once, on
// four Routers (instances): each buyer holds one ticket, and every press
// of a buyer answered it; the voucher's stock is untouched. After the
// close, a press is answered closed (no ticket); once the draw is done,
// not handled (buy as in any sale).
func TestEnterOncePerBuyer(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			closes := time.Now().Add(8 * time.Second) // the presses, on a loaded machine, come before it
			e := newEnv(t, dialect, 10, closes)
			ctx := context.Background()
			routers := make([]*Router, 4)
			for i := range routers {
				routers[i] = NewRouter(e.rdb, e.keys)
			}
			const buyers, presses = 100, 4
			var (
				mu      sync.Mutex
				tickets = map[int64]map[int64]bool{}
				start   = make(chan struct{})
				wg      sync.WaitGroup
				next    int64
			)
			for u := int64(1); u <= buyers; u++ {
				for p := range presses {
					mu.Lock()
					next++
					ticket := next
					mu.Unlock()
					wg.Go(func() {
						<-start
						got, handled, err := routers[p].Enter(ctx, e.v.ID, u, 10_000+ticket, "")
						mu.Lock()
						defer mu.Unlock()
						if err != nil || !handled || got.Closed {
							t.Errorf("buyer %d: %+v handled %v, %v; want a ticket", u, got, handled, err)
							return
						}
						if tickets[u] == nil {
							tickets[u] = map[int64]bool{}
						}
						tickets[u][got.Ticket] = true
					})
				}
			}
			close(start)
			wg.Wait()
			for u := int64(1); u <= buyers; u++ {
				if len(tickets[u]) != 1 {
					t.Errorf("buyer %d was answered tickets %v, want one", u, tickets[u])
				}
			}
			if n, _ := e.rdb.HLen(ctx, entriesKey(e.keys, e.v.ID)).Result(); n != buyers {
				t.Fatalf("%d entries, want %d", n, buyers)
			}
			if s, _ := e.rdb.HGet(ctx, e.keys.State(e.v.ID), "stock").Result(); s != "10" {
				t.Fatalf("stock %s after the entries, want 10 untouched", s)
			}
			testenv.WaitFor(t, 10*time.Second, "the draw closed", func() bool { return !time.Now().Before(closes.Add(50 * time.Millisecond)) })
			if got, handled, err := routers[0].Enter(ctx, e.v.ID, buyers+1, 99_999, ""); err != nil || !handled || !got.Closed {
				t.Fatalf("a new buyer after the close: %+v handled %v, %v; want closed", got, handled, err)
			}
			if err := e.drawer().Pass(ctx); err != nil {
				t.Fatal(err)
			}
			if _, handled, err := routers[1].Enter(ctx, e.v.ID, buyers+1, 99_999, ""); err != nil || handled {
				t.Fatalf("after the draw: handled %v, %v; want the purchase to buy as in any sale", handled, err)
			}
		})
	}
}

// TestDrawBuysInItsOrder: 50 entries for a stock of 10: the winners are
// the first 10 in the draw's order (HMAC of the user under the secret),
// each holding the order its ticket names; the result is recorded with
// every place, the secret published, and Check holds it; a result with
// two places swapped, or a wrong secret, fails Check.
func TestDrawBuysInItsOrder(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, dialect, 10, time.Now().Add(-time.Second))
			e.enterAll(t, 1, 50)
			if err := e.drawer().Pass(ctx); err != nil {
				t.Fatal(err)
			}
			want := make([]Entry, 50)
			for i := range want {
				want[i] = Entry{UserID: int64(i + 1)}
			}
			Order(e.v.DrawSecret, want)
			buyers := e.buyers(t)
			if len(buyers) != 10 {
				t.Fatalf("%d buyers in Redis, want 10", len(buyers))
			}
			for _, w := range want[:10] {
				if got := buyers[strconv.FormatInt(w.UserID, 10)]; got != strconv.FormatInt(1000+w.UserID, 10) {
					t.Errorf("user %d at place %d holds %q, want its ticket %d", w.UserID, w.Place, got, 1000+w.UserID)
				}
			}
			r, err := Results(ctx, e.db, e.v.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.Draw.Status != "done" || r.Draw.Secret != e.v.DrawSecret || len(r.Entries) != 50 {
				t.Fatalf("result: draw %+v, %d entries; want done, the secret, 50 entries", r.Draw, len(r.Entries))
			}
			for i, en := range r.Entries {
				if en.UserID != want[i].UserID || en.Won != (i < 10) {
					t.Errorf("place %d: %+v, want user %d won %v", i, en, want[i].UserID, i < 10)
				}
			}
			if err := Check(r); err != nil {
				t.Fatalf("Check of the published draw: %v", err)
			}
			swapped := r
			swapped.Entries = append([]Entry(nil), r.Entries...)
			swapped.Entries[3].UserID, swapped.Entries[30].UserID = swapped.Entries[30].UserID, swapped.Entries[3].UserID
			if err := Check(swapped); err == nil {
				t.Error("Check took a result with two places swapped")
			}
			wrong := r
			d := *r.Draw
			flip := map[byte]string{'0': "1"}[d.Secret[0]]
			if flip == "" {
				flip = "0"
			}
			d.Secret = flip + d.Secret[1:]
			wrong.Draw = &d
			if err := Check(wrong); err == nil {
				t.Error("Check took a secret that is not the committed one")
			}
		})
	}
}

// TestDrawnAgainBuysNothingTwice: a draw cut short after its purchases
// and before its result (the instance killed) is drawn again from the
// start by the next: each entry it bought answers as bought before, so
// the winners are the same, the stock is taken once, and no buyer holds
// two orders.
func TestDrawnAgainBuysNothingTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "mariadb", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 30)
	d := e.drawer()
	if err := d.Draw(ctx, e.voucher(t)); err != nil {
		t.Fatal(err)
	}
	first := e.buyers(t)
	// As if the first draw had stopped before recording anything.
	if err := e.db.Exec("DELETE FROM draw_entries").Error; err != nil {
		t.Fatal(err)
	}
	if err := e.db.Exec("UPDATE vouchers SET draw_done_at = NULL").Error; err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, doneKey(e.keys, e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.drawer().Pass(ctx); err != nil {
		t.Fatal(err)
	}
	again := e.buyers(t)
	if len(again) != 10 || len(first) != 10 {
		t.Fatalf("buyers %d then %d, want 10", len(first), len(again))
	}
	for u, o := range first {
		if again[u] != o {
			t.Errorf("buyer %s held %s, then %s", u, o, again[u])
		}
	}
	if s, _ := e.rdb.HGet(ctx, e.keys.State(e.v.ID), "stock").Result(); s != "0" {
		t.Fatalf("stock %s, want 0: each unit taken once", s)
	}
	r, err := Results(ctx, e.db, e.v.ID)
	if err != nil || Check(r) != nil {
		t.Fatalf("result after the second draw: %v, %v", err, Check(r))
	}
}

// TestDrawWaitsForItsLease: while another instance holds the draw's
// lease, a Pass buys nothing.
func TestDrawWaitsForItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "sqlite", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 5)
	if err := e.rdb.Set(ctx, leaseKey(e.keys, e.v.ID), "another", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.drawer().Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if b := e.buyers(t); len(b) != 0 {
		t.Fatalf("%d bought while another instance held the draw", len(b))
	}
	if v := e.voucher(t); v.DrawDoneAt != nil {
		t.Fatal("the draw was recorded done")
	}
	if _, err := Results(ctx, e.db, e.v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := Results(ctx, e.db, e.v.ID+1000); !errors.Is(err, voucher.ErrNotFound) {
		t.Fatalf("Results of no voucher: %v", err)
	}
}

// TestRankAsOpenSSL: an entry's rank is what the published recipe
// computes with standard tools (printf '%s' USER | openssl dgst -sha256
// -hmac SECRET), so anyone can check a draw without this code; the order
// is by rank, not by user id or arrival.
func TestRankAsOpenSSL(t *testing.T) {
	t.Parallel()
	for user, want := range map[int64]string{
		42: "6f8f6129bb820773bf89ea27a0744730c67a5f66fd8cdd06fd5e7b1312d3f819",
		7:  "3573b1e1517f933237db4b2df8b645571fa29ab4413291ebc8d1915f6c607451",
	} {
		if got := Rank("00ff", user); got != want {
			t.Errorf("Rank(00ff, %d) = %s, want %s (openssl)", user, got, want)
		}
	}
	entries := []Entry{{UserID: 42}, {UserID: 7}}
	Order("00ff", entries)
	if entries[0].UserID != 7 || entries[0].Place != 0 || entries[1].Place != 1 {
		t.Fatalf("order %+v, want user 7 (rank 3573...) first", entries)
	}
}

// TestEntryWaitsForReplicas: with replica acknowledgement an entry is
// answered only once the replica has it; with the replica paused the
// entry is refused as not replicated (the buyer presses again), and a
// press once the replica is back answers the same ticket, confirmed.
func TestEntryWaitsForReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--repl-diskless-sync-delay", "0"}})
	_, port, _ := strings.Cut(master.Addr, ":")
	replica := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--replicaof", "127.0.0.1", port}})
	testenv.WaitFor(t, 10*time.Second, "the replica in sync", func() bool {
		info, err := replica.Client(t).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	g := testenv.DB(t, "sqlite")
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	rdb := master.Client(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	v := voucher.Voucher{Title: "fair", FaceValue: 1, TotalStock: 5, BeginAt: time.Now().Add(time.Hour), EndAt: time.Now().Add(2 * time.Hour),
		FairWindowMs: 60_000, DrawSecret: "00ff"}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	if _, err := voucher.NewState(rdb, keys).Load(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	r := NewRouter(rdb, keys)
	r.WaitReplicas(1, time.Second, nil) // a loaded machine's replica answers WAIT late
	onReplica := func(user int64) string {
		got, _ := replica.Client(t).HGet(ctx, entriesKey(keys, v.ID), strconv.FormatInt(user, 10)).Result()
		return got
	}
	if e, handled, err := r.Enter(ctx, v.ID, 7, 700, ""); err != nil || !handled || e.Ticket != 700 || onReplica(7) != "700" {
		t.Fatalf("entry with the replica up: %+v %v %v, on the replica %q", e, handled, err, onReplica(7))
	}
	replica.Pause(t)
	if _, _, err := r.Enter(ctx, v.ID, 8, 800, ""); !errors.Is(err, voucher.ErrNotReplicated) {
		t.Fatalf("entry with the replica paused: %v, want not replicated", err)
	}
	replica.Resume(t)
	e, handled, err := r.Enter(ctx, v.ID, 8, 801, "")
	if err != nil || !handled || e.Ticket != 800 {
		t.Fatalf("pressed again: %+v %v %v; want the ticket of the first press, 800", e, handled, err)
	}
	testenv.WaitFor(t, 5*time.Second, "the entry on the replica", func() bool { return onReplica(8) == "800" })
}

// TestJudgeTable enumerates judge's table, one row per answer of the
// purchase script as the Reserver gives it (wrapped as it wraps them).
func TestJudgeTable(t *testing.T) {
	const ticket = 7
	for _, c := range []struct {
		answer string
		err    error
		want   verdict
	}{
		{"accepted", nil, drawn},
		{"purchased with this ticket", &voucher.PurchasedError{OrderID: ticket}, drawn},
		{"purchased with another order", &voucher.PurchasedError{OrderID: ticket + 1}, notDrawn},
		{"sold out", voucher.ErrSoldOut, notDrawn},
		{"sale ended", voucher.ErrEnded, notDrawn},
		{"in transit", fmt.Errorf("bucket 1: %w", voucher.ErrInTransit), askAgain},
		{"shard not ready", voucher.ErrNotReady, askAgain},
		{"no state", voucher.ErrNoState, askAgain},
		{"not started", &voucher.NotStartedError{Until: time.Second}, askAgain},
		{"not replicated", fmt.Errorf("order 7: %w", voucher.ErrNotReplicated), askAgain},
		{"wrong type", fmt.Errorf("purchase script: key %q: %w", "k", voucher.ErrWrongType), stopDraw},
		{"redis unreachable", fmt.Errorf("purchase: %w", errors.New("dial tcp: connection refused")), askAgain},
	} {
		if got := judge(c.err, ticket); got != c.want {
			t.Errorf("%s: judged %d, want %d", c.answer, got, c.want)
		}
	}
}

// TestDrawStopsOnWhatNeedsAnOperator: a buyers key of the wrong type
// (written by hand) cannot be bought through: the draw stops at once with
// that answer, for Run to log, instead of asking again for ever under its
// renewed lease; nothing is recorded done. A pause that outlasts GiveUp
// (the voucher's state gone) stops it too; once the state is back, the
// next pass draws it.
func TestDrawStopsOnWhatNeedsAnOperator(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := newEnv(t, "sqlite", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 5)
	if err := e.rdb.Set(ctx, e.keys.Buyers(e.v.ID), "by hand", 0).Err(); err != nil {
		t.Fatal(err)
	}
	patient := NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Retry: time.Millisecond, GiveUp: time.Hour}, quietLog)
	if err := patient.Draw(ctx, e.voucher(t)); !errors.Is(err, voucher.ErrWrongType) {
		t.Fatalf("Draw with a buyers key of the wrong type = %v, want ErrWrongType at once", err)
	}
	if err := e.rdb.Del(ctx, e.keys.Buyers(e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}

	state, err := e.rdb.Dump(ctx, e.keys.State(e.v.ID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.Del(ctx, e.keys.State(e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	d := NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Retry: time.Millisecond, GiveUp: 200 * time.Millisecond}, quietLog)
	if err := d.Draw(ctx, e.voucher(t)); !errors.Is(err, voucher.ErrNoState) {
		t.Fatalf("Draw without the voucher's state = %v, want ErrNoState after GiveUp", err)
	}
	if v := e.voucher(t); v.DrawDoneAt != nil {
		t.Fatal("a draw that stopped was recorded done")
	}
	if err := e.rdb.Restore(ctx, e.keys.State(e.v.ID), 0, state).Err(); err != nil {
		t.Fatal(err)
	}
	if err := d.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := Results(ctx, e.db, e.v.ID)
	if err != nil || r.Draw.Status != "done" || len(r.Entries) != 5 || Check(r) != nil {
		t.Fatalf("the draw once its state was back: %+v (%v, check %v)", r, err, Check(r))
	}
}
