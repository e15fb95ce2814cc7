package draw

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/bucket"
	"seckill/internal/lease"
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
	begin := closes.Add(-time.Second).Truncate(time.Millisecond)
	e.v = voucher.Voucher{Title: "fair", FaceValue: 100, TotalStock: stock, BeginAt: begin, EndAt: begin.Add(time.Hour),
		FairWindowMs: closes.Truncate(time.Millisecond).Sub(begin).Milliseconds(), DrawSalt: salt(t)}
	e.v.DrawCommitment = voucher.DrawCommitment(voucher.DrawSecretOf(testKey, e.v.DrawSalt))
	if err := voucher.NewStore(g).Create(ctx, &e.v); err != nil {
		t.Fatal(err)
	}
	e.load(t)
	return e
}

// load loads the voucher's state into Redis, every shard ready.
func (e env) load(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	st := voucher.NewState(e.rdb, e.keys)
	if _, err := st.Load(ctx, e.v, nil); err != nil {
		t.Fatal(err)
	}
	for shard := range e.keys.Shards() {
		if err := st.MarkReady(ctx, shard); err != nil {
			t.Fatal(err)
		}
	}
}

// testKey is the instances' draw key in these tests.
var testKey = []byte("the draw key of the tests")

func salt(t *testing.T) string {
	t.Helper()
	s, err := voucher.NewDrawSecret()
	if err != nil {
		t.Fatal(err)
	}
	return s
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
	return NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Retry: time.Millisecond, Key: testKey}, quietLog)
}

// secret is the voucher's draw secret, derived as the instances do.
func (e env) secret() string { return voucher.DrawSecretOf(testKey, e.v.DrawSalt) }

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
// the first 10 in the draw's order (HMAC under the secret of the closed
// list's digest and the user), each holding the order its ticket names;
// until the draw is done the database holds no secret (a dump shows the
// salt and the commitment only); the digest is published, the result
// recorded with every place, the secret revealed, and Check holds it; a
// result with two places swapped, a wrong secret, or an entry dropped
// fails Check.
func TestDrawBuysInItsOrder(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, dialect, 10, time.Now().Add(-time.Second))
			e.enterAll(t, 1, 50)
			if v := e.voucher(t); v.DrawSecret != "" || v.DrawCommitment != voucher.DrawCommitment(e.secret()) {
				t.Fatalf("before the draw the database holds secret %q, commitment %q; want none, the commitment", v.DrawSecret, v.DrawCommitment)
			}
			if err := e.drawer().Pass(ctx); err != nil {
				t.Fatal(err)
			}
			want := make([]Entry, 50)
			for i := range want {
				want[i] = Entry{UserID: int64(i + 1), Ticket: int64(1000 + i + 1)}
			}
			digest := e.voucher(t).DrawDigest
			if digest != Digest(want) {
				t.Fatalf("published digest %q, want %s", digest, Digest(want))
			}
			Order(e.secret(), digest, want)
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
			if r.Draw.Status != "done" || r.Draw.Secret != e.secret() || r.Draw.Digest != digest || len(r.Entries) != 50 {
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
			dropped := r
			dropped.Entries = append([]Entry(nil), r.Entries[:49]...)
			if err := Check(dropped); err == nil {
				t.Error("Check took a result with an entry dropped")
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

// TestRankAsOpenSSL: the digest and an entry's rank are what the
// published recipe computes with standard tools (printf '7:1007\n42:1042\n'
// | sha256sum; printf '%s' DIGEST:USER | openssl dgst -sha256 -hmac
// SECRET), so anyone can check a draw without this code; a draw done
// before digests were published ranked the user id alone. The order is
// by rank, not by user id or arrival, and one entry added to the closed
// list (here user 43) changes every rank: users 42 and 7 swap places.
func TestRankAsOpenSSL(t *testing.T) {
	t.Parallel()
	entries := []Entry{{UserID: 42, Ticket: 1042}, {UserID: 7, Ticket: 1007}}
	const digest = "934b605a1ca1041d7353a2dc7bd4d0e35622818a349faa7a2f5adc63c5f5256d"
	if got := Digest(entries); got != digest {
		t.Fatalf("Digest = %s, want %s (sha256sum)", got, digest)
	}
	for _, c := range []struct {
		digest string
		user   int64
		want   string
	}{
		{digest, 42, "2a9383f8cbce27239cc4653ee763374abf236861661ca1d0778319066c5daf96"},
		{digest, 7, "9a3e7eef82ef93867a0ac13237f9a37243f441c0be7ca9d75a51570eaf679460"},
		{"", 42, "6f8f6129bb820773bf89ea27a0744730c67a5f66fd8cdd06fd5e7b1312d3f819"},
		{"", 7, "3573b1e1517f933237db4b2df8b645571fa29ab4413291ebc8d1915f6c607451"},
	} {
		if got := Rank("00ff", c.digest, c.user); got != c.want {
			t.Errorf("Rank(00ff, %q, %d) = %s, want %s (openssl)", c.digest, c.user, got, c.want)
		}
	}
	Order("00ff", digest, entries)
	if entries[0].UserID != 42 || entries[0].Place != 0 || entries[1].Place != 1 {
		t.Fatalf("order %+v, want user 42 (rank 2a93...) first", entries)
	}
	grown := []Entry{{UserID: 42, Ticket: 1042}, {UserID: 7, Ticket: 1007}, {UserID: 43, Ticket: 1043}}
	Order("00ff", Digest(grown), grown)
	if i42, i7 := slices.IndexFunc(grown, func(e Entry) bool { return e.UserID == 42 }), slices.IndexFunc(grown, func(e Entry) bool { return e.UserID == 7 }); i7 > i42 {
		t.Fatalf("with user 43 added: %+v; want user 7 (rank aaaa...) before user 42 (rank cbde...)", grown)
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
		{"fenced by another token", voucher.ErrFenced, refence},
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
// that answer, for Run to log, instead of asking again until its
// deadline; nothing is recorded done. Once the key is removed, the next
// pass draws it.
func TestDrawStopsOnWhatNeedsAnOperator(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := newEnv(t, "sqlite", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 5)
	if err := e.rdb.Set(ctx, e.keys.Buyers(e.v.ID), "by hand", 0).Err(); err != nil {
		t.Fatal(err)
	}
	patient := NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Retry: time.Millisecond, Deadline: time.Hour, Key: testKey}, quietLog)
	if err := patient.Draw(ctx, e.voucher(t)); !errors.Is(err, voucher.ErrWrongType) {
		t.Fatalf("Draw with a buyers key of the wrong type = %v, want ErrWrongType at once", err)
	}
	if v := e.voucher(t); v.DrawDoneAt != nil {
		t.Fatal("a draw that stopped was recorded done")
	}
	if err := e.rdb.Del(ctx, e.keys.Buyers(e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := patient.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := Results(ctx, e.db, e.v.ID)
	if err != nil || r.Draw.Status != "done" || len(r.Entries) != 5 || Check(r) != nil {
		t.Fatalf("the draw once the key was removed: %+v (%v, check %v)", r, err, Check(r))
	}
}

// TestDrawEndsWhenBucketsCannotSettle: a voucher of two buckets one of
// whose units was lost in transit (bucket 1's alloc and stock one short:
// the allocs no longer add up to the stock) can never answer sold out:
// once the other units are bought every purchase is "in transit". The
// draw buys what it can, and at its deadline ends: the rest not won, the
// result recorded and checked, the draw done, the sale open. Without the
// deadline it asks again for ever (the test's context ends it).
func TestDrawEndsWhenBucketsCannotSettle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t, "mariadb", 6, time.Now().Add(-time.Second))
	// Two buckets, loaded as the warmer loads them.
	if err := e.db.Exec("UPDATE vouchers SET buckets = 2 WHERE id = ?", e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	e.v.Buckets = 2
	for shard := range e.keys.Shards() {
		if err := e.rdb.Del(ctx, e.keys.StateAt(shard, e.v.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.load(t)
	lost := e.keys.StateAt(e.keys.BucketShard(e.v.ID, 1, 2), e.v.ID)
	for _, f := range []string{"stock", voucher.FieldAlloc} {
		if err := e.rdb.HIncrBy(ctx, lost, f, -1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.enterAll(t, 1, 12)
	mover := bucket.NewMover(e.rdb, e.keys, bucket.Config{}, quietLog)
	reserver := voucher.NewReserver(e.rdb, e.keys, voucher.Lend(mover))
	d := NewDrawer(e.db, e.rdb, e.keys, reserver, DrawerConfig{Retry: time.Millisecond, Deadline: 500 * time.Millisecond, Key: testKey}, quietLog)
	if err := d.Draw(ctx, e.voucher(t)); err != nil {
		t.Fatalf("Draw of a voucher whose buckets cannot settle: %v; want it to end at its deadline", err)
	}
	r, err := Results(ctx, e.db, e.v.ID)
	if err != nil || r.Draw.Status != "done" || len(r.Entries) != 12 || Check(r) != nil {
		t.Fatalf("the draw that ended at its deadline: %+v (%v, check %v)", r, err, Check(r))
	}
	won := 0
	for _, en := range r.Entries {
		if en.Won {
			won++
		}
	}
	buyers := 0
	for b := range 2 {
		n, err := e.rdb.HLen(ctx, e.keys.BuyersAt(e.keys.BucketShard(e.v.ID, b, 2), e.v.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		buyers += int(n)
	}
	if won != 5 || buyers != 5 {
		t.Fatalf("%d won, %d buyers in Redis; want the 5 units the buckets hold", won, buyers)
	}
	if n, err := e.rdb.Exists(ctx, doneKey(e.keys, e.v.ID)).Result(); err != nil || n != 1 {
		t.Fatalf("draw done in Redis: %d, %v; want marked, the sale open", n, err)
	}
}

// TestStaleDrawerBuysNothing: a drawer paused mid-draw (its purchase
// held before it is sent) while its lease is lost and a newer drawer
// draws the voucher to the end: resumed, its purchase is refused as
// fenced, it cannot fence the buckets back (the fence only rises) and
// stops; nothing it sends is taken, and a purchase with its token for a
// buyer the draw never had is refused too, while the stock would allow it.
func TestStaleDrawerBuysNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEnv(t, "mariadb", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 5)
	paused := &pausing{Reserver: voucher.NewReserver(e.rdb, e.keys), at: make(chan string), resume: make(chan struct{})}
	stale := NewDrawer(e.db, e.rdb, e.keys, paused, DrawerConfig{Retry: time.Millisecond, Key: testKey}, quietLog)
	staleErr := make(chan error, 1)
	go func() { staleErr <- stale.Draw(ctx, e.voucher(t)) }()
	var token string
	select {
	case token = <-paused.at:
	case <-ctx.Done():
		t.Fatal("the first drawer never bought")
	}
	// Its lease gone (expired during the pause), a newer drawer draws.
	if err := e.rdb.Del(ctx, leaseKey(e.keys, e.v.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.drawer().Draw(ctx, e.voucher(t)); err != nil {
		t.Fatal(err)
	}
	before, stock := e.buyers(t), e.stock(t)
	close(paused.resume)
	// It stops: told by its fence, or by its lease's watchdog first.
	if err := <-staleErr; !errors.Is(err, errSuperseded) && !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the stale drawer's Draw = %v, want it stopped, superseded or its lease lost", err)
	}
	if !errors.Is(paused.sent, voucher.ErrFenced) {
		t.Fatalf("the stale drawer's held purchase = %v, want refused as fenced", paused.sent)
	}
	if err := stale.fence(ctx, e.v, token); !errors.Is(err, errSuperseded) {
		t.Fatalf("the stale drawer fencing again = %v, want refused: the fence only rises", err)
	}
	if _, err := paused.Reserver.ReserveAs(ctx, e.v.ID, 99, 9999, token); !errors.Is(err, voucher.ErrFenced) {
		t.Fatalf("a purchase with the stale token = %v, want refused as fenced", err)
	}
	if after := e.buyers(t); len(after) != len(before) || e.stock(t) != stock || stock != 5 {
		t.Fatalf("buyers %d then %d, stock %d then %d; want the newer draw's 5 and 5, unchanged", len(before), len(after), stock, e.stock(t))
	}
	r, err := Results(ctx, e.db, e.v.ID)
	if err != nil || r.Draw.Status != "done" || Check(r) != nil {
		t.Fatalf("the newer draw's result: %+v (%v, check %v)", r, err, Check(r))
	}
}

// pausing is a buyer whose first purchase waits, before it is sent, until
// resume closes: a drawer paused (SIGSTOP, a stalled VM) with a purchase
// on its way. The lease's watchdog does not see the pause: the purchase
// is then sent whatever became of the lease.
type pausing struct {
	*voucher.Reserver
	at     chan string
	resume chan struct{}
	once   sync.Once
	sent   error
}

func (p *pausing) ReserveAs(ctx context.Context, v, user, order int64, fence string) (voucher.Reservation, error) {
	first := false
	p.once.Do(func() { first = true })
	if !first {
		return p.Reserver.ReserveAs(ctx, v, user, order, fence)
	}
	p.at <- fence
	<-p.resume
	res, err := p.Reserver.ReserveAs(context.WithoutCancel(ctx), v, user, order, fence)
	p.sent = err
	return res, err
}

// stock reads bucket 0's stock.
func (e env) stock(t *testing.T) int64 {
	t.Helper()
	n, err := e.rdb.HGet(context.Background(), e.keys.State(e.v.ID), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDrawClosesOnRedisClock: an instance whose clock runs 5 s ahead of
// Redis's draws a voucher while buyers keep entering through its close:
// the drawer waits for Redis to say the draw closed before it reads the
// entries, so every buyer answered a ticket is in the draw, and no buyer
// whose answer came before the close was told it was closed (Redis and
// the test share this machine's clock).
func TestDrawClosesOnRedisClock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	closes := time.Now().Add(3 * time.Second)
	e := newEnv(t, "mariadb", 100, closes)
	closes = e.v.DrawClose()
	d := NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys),
		DrawerConfig{Every: 10 * time.Millisecond, Retry: time.Millisecond, Key: testKey,
			Now: func() time.Time { return time.Now().Add(5 * time.Second) }}, quietLog)
	drawing, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = d.Run(drawing) }()

	r := NewRouter(e.rdb, e.keys)
	var (
		mu      sync.Mutex
		entered = map[int64]bool{}
		wg      sync.WaitGroup
	)
	for w := range int64(4) {
		wg.Go(func() {
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			for u := w + 1; ; u += 4 {
				<-tick.C
				got, handled, err := r.Enter(ctx, e.v.ID, u, 1000+u, "")
				answered := time.Now()
				switch {
				case err != nil || !handled:
					t.Errorf("buyer %d: handled %v, %v", u, handled, err)
					return
				case got.Closed && answered.Before(closes):
					t.Errorf("buyer %d told the draw was closed at %s, before its close at %s", u, answered, closes)
					return
				case got.Closed:
					return
				}
				mu.Lock()
				entered[u] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	testenv.WaitFor(t, 30*time.Second, "the draw done", func() bool { return e.voucher(t).DrawDoneAt != nil })
	res, err := Results(ctx, e.db, e.v.ID)
	if err != nil || Check(res) != nil {
		t.Fatalf("result: %v, check %v", err, Check(res))
	}
	drawn := map[int64]bool{}
	for _, en := range res.Entries {
		drawn[en.UserID] = true
	}
	var left []int64
	for u := range entered {
		if !drawn[u] {
			left = append(left, u)
		}
	}
	if len(left) > 0 || len(drawn) != len(entered) {
		slices.Sort(left)
		t.Fatalf("%d buyers answered a ticket, %d drawn; left out: %v", len(entered), len(drawn), left)
	}
	t.Logf("%d entries, every one drawn", len(entered))
}

// TestClosedListHeldToItsDigest: a draw drawn again (the first cut short
// after publishing its digest) whose entry list changed in Redis since
// (an entry added by hand, or one dropped) refuses to draw and says why,
// its published digest kept; with the list as it was, it draws.
func TestClosedListHeldToItsDigest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "sqlite", 10, time.Now().Add(-time.Second))
	e.enterAll(t, 1, 30)
	v := e.voucher(t)
	first := e.drawer()
	token, err := first.closeOnRedis(ctx, v)
	if err != nil || token == "" {
		t.Fatalf("close: %q, %v", token, err)
	}
	entries, err := first.entries(ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := first.publishDigest(ctx, v, entries)
	if err != nil {
		t.Fatal(err)
	}
	for _, change := range []struct {
		what     string
		do, undo func() error
	}{
		{"an entry added", func() error { return e.rdb.HSet(ctx, entriesKey(e.keys, v.ID), 31, 1031).Err() },
			func() error { return e.rdb.HDel(ctx, entriesKey(e.keys, v.ID), "31").Err() }},
		{"an entry dropped", func() error { return e.rdb.HDel(ctx, entriesKey(e.keys, v.ID), "7").Err() },
			func() error { return e.rdb.HSet(ctx, entriesKey(e.keys, v.ID), 7, 1007).Err() }},
	} {
		if err := change.do(); err != nil {
			t.Fatal(err)
		}
		err := e.drawer().Draw(ctx, e.voucher(t))
		if err == nil || !strings.Contains(err.Error(), "changed since its digest") {
			t.Fatalf("%s: Draw = %v, want refused: the list is not the one its digest names", change.what, err)
		}
		if b := e.buyers(t); len(b) != 0 {
			t.Fatalf("%s: %d bought", change.what, len(b))
		}
		if got := e.voucher(t); got.DrawDigest != digest || got.DrawDoneAt != nil {
			t.Fatalf("%s: digest %s, done %v; want %s kept, not done", change.what, got.DrawDigest, got.DrawDoneAt, digest)
		}
		if err := change.undo(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.drawer().Draw(ctx, e.voucher(t)); err != nil {
		t.Fatal(err)
	}
	r, err := Results(ctx, e.db, v.ID)
	if err != nil || r.Draw.Digest != digest || len(r.Entries) != 30 || Check(r) != nil {
		t.Fatalf("the draw with its list as closed: %+v (%v, check %v)", r.Draw, err, Check(r))
	}
}

// TestSecretHeldToCommitment: the draw's secret is derived from the salt
// with the instances' key and must match the commitment stored at
// creation: a drawer with another key, or a salt edited in the database,
// does not draw (ErrCommitment), buys nothing and publishes nothing. The
// database refuses to change a commitment once set, on both dialects,
// while it takes the draw's other writes.
func TestSecretHeldToCommitment(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, dialect, 10, time.Now().Add(-time.Second))
			e.enterAll(t, 1, 5)
			other := NewDrawer(e.db, e.rdb, e.keys, voucher.NewReserver(e.rdb, e.keys), DrawerConfig{Key: []byte("another key")}, quietLog)
			if err := other.Draw(ctx, e.voucher(t)); !errors.Is(err, ErrCommitment) {
				t.Fatalf("Draw with another key = %v, want ErrCommitment", err)
			}
			if err := e.db.Exec("UPDATE vouchers SET draw_salt = ? WHERE id = ?", salt(t), e.v.ID).Error; err != nil {
				t.Fatal(err)
			}
			if err := e.drawer().Draw(ctx, e.voucher(t)); !errors.Is(err, ErrCommitment) {
				t.Fatalf("Draw with an edited salt = %v, want ErrCommitment", err)
			}
			if v, b := e.voucher(t), e.buyers(t); len(b) != 0 || v.DrawDigest != "" || v.DrawDoneAt != nil || v.DrawSecret != "" {
				t.Fatalf("after refused draws: %d bought, digest %q, done %v, secret %q; want nothing", len(b), v.DrawDigest, v.DrawDoneAt, v.DrawSecret)
			}
			swapped := voucher.DrawCommitment(voucher.DrawSecretOf(testKey, e.voucher(t).DrawSalt))
			for _, c := range []string{swapped, ""} {
				if err := e.db.Exec("UPDATE vouchers SET draw_commitment = ? WHERE id = ?", c, e.v.ID).Error; err == nil {
					t.Fatalf("the database took draw_commitment = %q over the one stored", c)
				}
			}
			if err := e.db.Exec("UPDATE vouchers SET draw_digest = 'x', draw_secret = 'y', title = 'renamed' WHERE id = ?", e.v.ID).Error; err != nil {
				t.Fatalf("a write leaving the commitment as it is: %v", err)
			}
			if got := e.voucher(t).DrawCommitment; got != e.v.DrawCommitment {
				t.Fatalf("commitment %s, want %s kept", got, e.v.DrawCommitment)
			}
		})
	}
}

// TestOnlyTheDrawerBuysUntilDone: between the close and the draw's end
// the purchase script itself sells to the drawer alone, in every bucket:
// a purchase that reaches it (an instance whose Router let it through,
// say one that just started and could not read bucket 0) is refused
// ErrDrawing, whichever bucket is the buyer's home, and takes nothing.
// Once the draw is done every bucket sells to anyone.
func TestOnlyTheDrawerBuysUntilDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "mariadb", 6, time.Now().Add(-time.Second))
	if err := e.db.Exec("UPDATE vouchers SET buckets = 2 WHERE id = ?", e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	e.v.Buckets = 2
	for shard := range e.keys.Shards() {
		if err := e.rdb.Del(ctx, e.keys.StateAt(shard, e.v.ID)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	e.load(t)
	e.enterAll(t, 1, 3)
	stocks := func() (sum int64) {
		for b := range 2 {
			n, err := e.rdb.HGet(ctx, e.keys.StateAt(e.keys.BucketShard(e.v.ID, b, 2), e.v.ID), "stock").Int64()
			if err != nil {
				t.Fatal(err)
			}
			sum += n
		}
		return sum
	}
	// A buyer of each home bucket.
	var buyers []int64
	for home := range 2 {
		u := int64(100)
		for voucher.Home(u, 2) != home {
			u++
		}
		buyers = append(buyers, u)
	}
	r := voucher.NewReserver(e.rdb, e.keys)
	for _, u := range buyers {
		if _, err := r.Reserve(ctx, e.v.ID, u, 5000+u); !errors.Is(err, voucher.ErrDrawing) {
			t.Fatalf("buyer %d (bucket %d) before the draw is done: %v, want ErrDrawing", u, voucher.Home(u, 2), err)
		}
	}
	if s := stocks(); s != 6 {
		t.Fatalf("stock %d after the refused purchases, want 6", s)
	}
	if err := e.drawer().Pass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, u := range buyers {
		if _, err := r.Reserve(ctx, e.v.ID, u, 5000+u); err != nil {
			t.Fatalf("buyer %d (bucket %d) once the draw is done: %v", u, voucher.Home(u, 2), err)
		}
	}
	if s := stocks(); s != 1 {
		t.Fatalf("stock %d, want 1: 3 entries won and 2 bought after", s)
	}
}
