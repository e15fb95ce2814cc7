package voucher

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// seqIDs hands out order ids from a counter, which instances of one test
// share.
type seqIDs struct{ n *atomic.Int64 }

func (s seqIDs) Next() (int64, error) { return s.n.Add(1), nil }

// localCounts counts purchases by outcome, and those answered locally.
type localCounts struct {
	mu           sync.Mutex
	all, locally map[string]int
}

func (o *localCounts) Purchase(outcome string, _, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all[outcome]++
}

func (o *localCounts) AnsweredLocally(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.locally[outcome]++
}

func (o *localCounts) local(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.locally[outcome]
}

// shop is one serving instance's purchase route, with its own Refusals.
type shop struct {
	h    http.Handler
	ref  *Refusals
	obs  *localCounts
	stop context.CancelFunc
}

// newShop builds an instance's purchase route on rdb. With ttl > 0 it has
// Refusals with that bound, subscribed (Run) before it returns when
// subscribe is true. The caller's identity is the X-User header.
func newShop(t testing.TB, rdb redis.UniversalClient, keys Keys, ids *atomic.Int64, ttl time.Duration, subscribe bool) *shop {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	s := &shop{obs: &localCounts{all: map[string]int{}, locally: map[string]int{}}, stop: func() {}}
	h := NewHTTP(NewStore(nil), NewState(rdb, keys), NewReserver(rdb, keys), seqIDs{ids}, log)
	h.Observe(s.obs)
	if ttl > 0 {
		s.ref = NewRefusals(rdb, keys, RefusalsConfig{TTL: ttl}, log)
		h.Refuse(s.ref)
	}
	if ttl > 0 && subscribe {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = s.ref.Run(ctx) }()
		s.stop = func() { cancel(); <-done }
		t.Cleanup(s.stop)
		testenv.WaitFor(t, 5*time.Second, "events subscription", func() bool { return s.ref.Subscriptions() > 0 })
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/vouchers/:id/purchase", func(c *gin.Context) {
		user, _ := strconv.ParseInt(c.GetHeader("X-User"), 10, 64)
		c.Set("seckill.identity", auth.Identity{UserID: user, Role: auth.RoleUser})
	}, h.Purchase)
	s.h = r
	return s
}

// buy is one purchase of voucher v by user: the status and the body.
func (s *shop) buy(v, user int64) (int, string) {
	req := httptest.NewRequest(http.MethodPost, "/vouchers/"+strconv.FormatInt(v, 10)+"/purchase", nil)
	req.Header.Set("X-User", strconv.FormatInt(user, 10))
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func (s *shop) mustBuy(t testing.TB, v, user int64, want int) string {
	t.Helper()
	code, body := s.buy(v, user)
	if code != want {
		t.Fatalf("user %d buys voucher %d: %d %s, want %d", user, v, code, body, want)
	}
	return body
}

// giveBack does what the order writer does for a dead letter: release.lua's
// effect (the unit back, the buyer entry gone), then the event.
func giveBack(t testing.TB, rdb redis.UniversalClient, keys Keys, v, user int64) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.HIncrBy(ctx, keys.State(v), "stock", 1).Err(); err != nil {
		t.Fatal(err)
	}
	// The order given back, when the buyer holds one (0: none named).
	order, err := rdb.HGet(ctx, keys.Buyers(v), strconv.FormatInt(user, 10)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if err := rdb.HDel(ctx, keys.Buyers(v), strconv.FormatInt(user, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	NewEvents(rdb, keys, slog.New(slog.DiscardHandler)).GivenBack(ctx, v, user, order)
}

// TestLocalRefusalsSameAnswers: a refusal answered locally has the status
// and body Redis's answer had, and counts as answered locally.
func TestLocalRefusalsSameAnswers(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	var ids atomic.Int64
	s := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	now := time.Now()
	e.put(t, 1, 1, now.Add(-time.Hour), now.Add(time.Hour))
	bought := s.mustBuy(t, 1, 100, http.StatusAccepted)

	for _, tc := range []struct {
		name, outcome string
		user          int64
		want          int
	}{
		{"sold out", "sold_out", 101, http.StatusConflict},
		{"already purchased", "already_purchased", 100, http.StatusConflict},
	} {
		before := s.obs.local(tc.outcome)
		// The first from Redis (or, for the buyer, from the acceptance),
		// the next from memory.
		first := s.mustBuy(t, 1, tc.user, tc.want)
		second := s.mustBuy(t, 1, tc.user, tc.want)
		if first != second {
			t.Errorf("%s: local answer %s, Redis's %s", tc.name, second, first)
		}
		if got := s.obs.local(tc.outcome) - before; got < 1 {
			t.Errorf("%s: %d answered locally, want 1 or more", tc.name, got)
		}
	}
	// The held answer names the order the buyer was given.
	var accepted struct {
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal([]byte(bought), &accepted); err != nil {
		t.Fatal(err)
	}
	if _, body := s.buy(1, 100); !strings.Contains(body, `"order_id":"`+accepted.OrderID+`"`) {
		t.Errorf("already_purchased body %s does not name the order %s", body, accepted.OrderID)
	}
	// A local sold_out takes no script run and no order id.
	n := ids.Load()
	s.mustBuy(t, 1, 102, http.StatusConflict)
	if ids.Load() != n {
		t.Errorf("a local refusal took an order id")
	}
}

// TestGivenBackSoldThroughEveryInstance: two instances sold out and
// remember it (for an hour: only the event can make them forget); two
// reservations are given back, as for two dead letters: each instance sells
// one, and each to a buyer of the dead letters, whom it remembered as
// holding an order.
func TestGivenBackSoldThroughEveryInstance(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	var ids atomic.Int64
	a := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	b := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	now := time.Now()
	e.put(t, 1, 2, now.Add(-time.Hour), now.Add(time.Hour))
	a.mustBuy(t, 1, 1, http.StatusAccepted)
	b.mustBuy(t, 1, 2, http.StatusAccepted)
	for _, s := range []*shop{a, b} {
		s.mustBuy(t, 1, 3, http.StatusConflict) // sold out, learnt
		s.mustBuy(t, 1, 3, http.StatusConflict) // and answered locally
		for _, u := range []int64{1, 2} {
			s.mustBuy(t, 1, u, http.StatusConflict) // already purchased
			s.mustBuy(t, 1, u, http.StatusConflict)
		}
		if s.obs.local("sold_out") == 0 || s.obs.local("already_purchased") == 0 {
			t.Fatalf("nothing answered locally: %v", s.obs.locally)
		}
	}
	giveBack(t, e.rdb, e.keys, 1, 1)
	giveBack(t, e.rdb, e.keys, 1, 2)
	for _, c := range []struct {
		s    *shop
		user int64
	}{{b, 1}, {a, 2}} {
		testenv.WaitFor(t, 2*time.Second, "a buyer of a dead letter buys again", func() bool {
			code, _ := c.s.buy(1, c.user)
			return code == http.StatusAccepted
		})
	}
	a.mustBuy(t, 1, 4, http.StatusConflict)
	b.mustBuy(t, 1, 4, http.StatusConflict)
	if e.stock(t, 1) != 0 {
		t.Fatalf("stock %d, want 0", e.stock(t, 1))
	}
}

// TestMissedEventRightAfterBound: an instance not subscribed (its
// subscription closed) misses the give-back; its sold_out still expires
// after the bound, and a buyer then gets the unit through it.
func TestMissedEventRightAfterBound(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	var ids atomic.Int64
	const bound = 300 * time.Millisecond
	s := newShop(t, e.rdb, e.keys, &ids, bound, true)
	now := time.Now()
	e.put(t, 1, 1, now.Add(-time.Hour), now.Add(time.Hour))
	s.mustBuy(t, 1, 1, http.StatusAccepted)
	s.stop() // the subscription is gone: the event below is missed
	s.mustBuy(t, 1, 2, http.StatusConflict)
	giveBack(t, e.rdb, e.keys, 1, 1)
	testenv.WaitFor(t, bound+time.Second, "the given-back unit sold after the bound", func() bool {
		code, _ := s.buy(1, 2)
		return code == http.StatusAccepted
	})
}

// TestNotStartedNeverStaleAtOpening: purchases of a voucher beginning
// shortly are refused from memory only while the begin is more than the
// bound away; the first purchase sent after the begin is accepted.
func TestNotStartedNeverStaleAtOpening(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	var ids atomic.Int64
	const bound = 200 * time.Millisecond
	s := newShop(t, e.rdb, e.keys, &ids, bound, true)
	begin := time.Now().Add(600 * time.Millisecond).Truncate(time.Millisecond)
	e.put(t, 1, 1000, begin, begin.Add(time.Hour))
	user := int64(0)
	testenv.WaitFor(t, 5*time.Second, "a purchase accepted after the begin", func() bool {
		user++
		sent := time.Now()
		code, body := s.buy(1, user)
		switch {
		case code == http.StatusAccepted:
			return true
		case code != http.StatusForbidden:
			t.Fatalf("%d %s, want 403 not_started or 202", code, body)
		case sent.After(begin.Add(2 * time.Millisecond)): // Redis's clock is this machine's
			t.Fatalf("a purchase sent %s after the begin was refused: %s", sent.Sub(begin), body)
		}
		return false
	})
	if s.obs.local("not_started") == 0 {
		t.Fatalf("no not_started answered locally while the begin was far")
	}
}

// TestResubscribeDropsEverything: an instance whose subscription is cut
// (CLIENT KILL) subscribes again and forgets what it knew, since it may
// have missed events.
func TestResubscribeDropsEverything(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{}) // its own: CLIENT KILL cuts every subscriber
	rdb := srv.Client(t)
	keys := NewKeys("cut", 1)
	st := NewState(rdb, keys)
	ctx := context.Background()
	now := time.Now()
	if _, err := st.Load(ctx, Voucher{ID: 1, Stock: 0, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var ids atomic.Int64
	s := newShop(t, rdb, keys, &ids, time.Hour, true)
	s.mustBuy(t, 1, 1, http.StatusConflict)
	if err := s.ref.Lookup(1, 2); err == nil {
		t.Fatal("sold out not remembered")
	}
	if err := rdb.Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "subscribed again", func() bool { return s.ref.Subscriptions() >= 2 })
	if err := s.ref.Lookup(1, 2); err != nil {
		t.Fatalf("after a cut subscription: %v remembered, want nothing", err)
	}
	// And events flow again.
	s.mustBuy(t, 1, 1, http.StatusConflict)
	giveBack(t, rdb, keys, 1, 7)
	testenv.WaitFor(t, 2*time.Second, "the given-back unit sold", func() bool {
		code, _ := s.buy(1, 2)
		return code == http.StatusAccepted
	})
}

// TestLocalRefusalsEmbedded: the same on the embedded Redis (miniredis),
// which has pub/sub too.
func TestLocalRefusalsEmbedded(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	keys := NewKeys("embedded", 1)
	st := NewState(rdb, keys)
	ctx := context.Background()
	now := time.Now()
	if _, err := st.Load(ctx, Voucher{ID: 1, Stock: 1, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	var ids atomic.Int64
	s := newShop(t, rdb, keys, &ids, time.Hour, true)
	s.mustBuy(t, 1, 1, http.StatusAccepted)
	s.mustBuy(t, 1, 2, http.StatusConflict)
	s.mustBuy(t, 1, 2, http.StatusConflict)
	if s.obs.local("sold_out") == 0 {
		t.Fatal("nothing answered locally")
	}
	giveBack(t, rdb, keys, 1, 1)
	testenv.WaitFor(t, 2*time.Second, "the given-back unit sold", func() bool {
		code, _ := s.buy(1, 2)
		return code == http.StatusAccepted
	})
}

// BenchmarkPurchaseSoldOut: a sold-out purchase through the handler, each
// by a new buyer, with local refusals and without (a Redis round trip
// each).
func BenchmarkPurchaseSoldOut(b *testing.B) {
	for _, mode := range []struct {
		name string
		ttl  time.Duration
	}{{"refusals=off", 0}, {"refusals=200ms", 200 * time.Millisecond}} {
		b.Run(mode.name, func(b *testing.B) {
			srv := testenv.StartRedis(b, testenv.RedisOptions{})
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			b.Cleanup(func() { _ = rdb.Close() })
			keys := NewKeys("bench", 1)
			st := NewState(rdb, keys)
			ctx := context.Background()
			now := time.Now()
			if _, err := st.Load(ctx, Voucher{ID: 1, Stock: 0, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}, nil); err != nil {
				b.Fatal(err)
			}
			if err := st.MarkReady(ctx, 0); err != nil {
				b.Fatal(err)
			}
			var ids, users atomic.Int64
			s := newShop(b, rdb, keys, &ids, mode.ttl, true)
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if code, body := s.buy(1, users.Add(1)); code != http.StatusConflict {
						b.Fatalf("%d %s", code, body)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
			b.ReportMetric(float64(b.N-s.obs.local("sold_out"))/float64(b.N), "redis/op")
		})
	}
}

// orderOf is the order id an answer's body names, "" when none.
func orderOf(t testing.TB, body string) string {
	t.Helper()
	var b struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	return b.OrderID
}

// TestAnnouncedBuyerAlreadyPurchasedEverywhere: a buyer who bought through
// instance A asks instance B, which keeps the voucher as sold out (for an
// hour: nothing but the announcement can tell it of the buyer). B answers
// already_purchased with the buyer's order as soon as A's announcement
// arrives, and never sold_out after that.
func TestAnnouncedBuyerAlreadyPurchasedEverywhere(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	var ids atomic.Int64
	a := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	b := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	now := time.Now()
	e.put(t, 1, 1, now.Add(-time.Hour), now.Add(time.Hour))
	order := orderOf(t, a.mustBuy(t, 1, 1, http.StatusAccepted))
	b.mustBuy(t, 1, 2, http.StatusConflict)
	if err := b.ref.Lookup(1, 3); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("B keeps %v for the voucher, want sold out", err)
	}
	answer := func() string {
		code, body := b.buy(1, 1)
		if code != http.StatusConflict {
			t.Fatalf("B: %d %s, want 409", code, body)
		}
		return body
	}
	testenv.WaitFor(t, 2*time.Second, "B answers already_purchased", func() bool {
		return strings.Contains(answer(), `"already_purchased"`)
	})
	for range 20 {
		body := answer()
		if !strings.Contains(body, `"already_purchased"`) || orderOf(t, body) != order {
			t.Fatalf("B after the announcement: %s, want already_purchased with order %s", body, order)
		}
	}
	if b.obs.local("already_purchased") == 0 {
		t.Fatal("B asked Redis: the announcement was not what answered")
	}
}

// TestAnnouncementsBatched: a burst of purchases through one instance is
// announced in a few PUBLISHes, and every instance then knows each buyer's
// order.
func TestAnnouncementsBatched(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	ctx := context.Background()
	ps := e.rdb.Subscribe(ctx, e.keys.Events())
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the subscription confirmed
		t.Fatal(err)
	}
	var ids atomic.Int64
	a := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	b := newShop(t, e.rdb, e.keys, &ids, time.Hour, true)
	const buyers = 600
	now := time.Now()
	e.put(t, 1, buyers, now.Add(-time.Hour), now.Add(time.Hour))
	orders := make([]string, buyers+1)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for u := 1; u <= buyers; u++ {
		wg.Go(func() {
			<-start
			code, body := a.buy(1, int64(u))
			if code != http.StatusAccepted {
				t.Errorf("buyer %d: %d %s", u, code, body)
				return
			}
			orders[u] = orderOf(t, body)
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	publishes, entries := 0, 0
	for entries < buyers {
		select {
		case m := <-ps.Channel():
			f := strings.Fields(m.Payload)
			if f[0] != eventAccepted {
				continue
			}
			publishes++
			entries += (len(f) - 2) / 3
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d purchases announced", entries, buyers)
		}
	}
	if entries != buyers || publishes > buyers/10 {
		t.Fatalf("%d purchases announced in %d publishes, want %d in at most %d", entries, publishes, buyers, buyers/10)
	}
	t.Logf("%d purchases announced in %d publishes", entries, publishes)
	for u := 1; u <= buyers; u++ {
		testenv.WaitFor(t, 2*time.Second, "B knows the buyer", func() bool {
			var held *PurchasedError
			return errors.As(b.ref.Lookup(1, int64(u)), &held) && strconv.FormatInt(held.OrderID, 10) == orders[u]
		})
	}
}
