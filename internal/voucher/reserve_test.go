package voucher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type scriptEnv struct {
	rdb   *redis.Client
	keys  Keys
	state *State
	res   *Reserver
}

func newScriptEnv(t testing.TB) scriptEnv {
	t.Helper()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 4)
	return scriptEnv{rdb: rdb, keys: keys, state: NewState(rdb, keys), res: NewReserver(rdb, keys)}
}

// put loads a voucher's state and marks its shard ready.
func (e scriptEnv) put(t testing.TB, id int64, stock int, begin, end time.Time) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.state.Load(ctx, Voucher{ID: id, Stock: stock, TotalStock: stock, BeginAt: begin, EndAt: end}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.state.MarkReady(ctx, e.keys.Shard(id)); err != nil {
		t.Fatal(err)
	}
}

func (e scriptEnv) stock(t testing.TB, id int64) int64 {
	t.Helper()
	n, err := e.rdb.HGet(context.Background(), e.keys.State(id), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (e scriptEnv) streamLen(t testing.TB, id int64) int64 {
	t.Helper()
	n, err := e.rdb.XLen(context.Background(), e.keys.Stream(e.keys.Shard(id))).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPurchaseScriptEdges(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	ctx := context.Background()
	now := time.Now()
	open, later := now.Add(-time.Hour), now.Add(time.Hour)

	t.Run("shard not ready", func(t *testing.T) {
		// Voucher 5 lives in shard 1, which nobody marked ready.
		if _, err := e.state.Load(ctx, Voucher{ID: 5, Stock: 3, BeginAt: open, EndAt: later}, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.res.Reserve(ctx, 5, 1, 100); !errors.Is(err, ErrNotReady) {
			t.Fatalf("err = %v, want ErrNotReady", err)
		}
		if e.stock(t, 5) != 3 || e.streamLen(t, 5) != 0 {
			t.Fatal("a refusal wrote state")
		}
	})
	t.Run("unknown voucher", func(t *testing.T) {
		e.put(t, 8, 1, open, later) // makes shard 0 ready
		if _, err := e.res.Reserve(ctx, 12, 1, 101); !errors.Is(err, ErrNoState) {
			t.Fatalf("err = %v, want ErrNoState", err)
		}
		if n, err := e.rdb.Exists(ctx, e.keys.State(12), e.keys.Buyers(12)).Result(); err != nil || n != 0 {
			t.Fatalf("a refusal created keys (%d, %v)", n, err)
		}
	})
	t.Run("before begin", func(t *testing.T) {
		e.put(t, 20, 5, now.Add(time.Minute), later)
		if _, err := e.res.Reserve(ctx, 20, 1, 102); !errors.Is(err, ErrNotStarted) {
			t.Fatalf("err = %v, want ErrNotStarted", err)
		}
		if e.stock(t, 20) != 5 || e.streamLen(t, 20) != 0 {
			t.Fatal("a refusal wrote state")
		}
	})
	t.Run("after end", func(t *testing.T) {
		e.put(t, 24, 5, now.Add(-2*time.Hour), now.Add(-time.Millisecond))
		if _, err := e.res.Reserve(ctx, 24, 1, 103); !errors.Is(err, ErrEnded) {
			t.Fatalf("err = %v, want ErrEnded", err)
		}
	})
	t.Run("stock zero", func(t *testing.T) {
		e.put(t, 28, 0, open, later)
		if _, err := e.res.Reserve(ctx, 28, 1, 104); !errors.Is(err, ErrSoldOut) {
			t.Fatalf("err = %v, want ErrSoldOut", err)
		}
		if e.stock(t, 28) != 0 || e.streamLen(t, 28) != 0 {
			t.Fatal("a refusal wrote state")
		}
	})
	t.Run("same user twice", func(t *testing.T) {
		e.put(t, 32, 5, open, later)
		first, err := e.res.Reserve(ctx, 32, 7, 105)
		if err != nil || first.OrderID != 105 || first.Replayed {
			t.Fatalf("first = %+v, %v", first, err)
		}
		_, err = e.res.Reserve(ctx, 32, 7, 106)
		var held *PurchasedError
		if !errors.As(err, &held) || held.OrderID != 105 {
			t.Fatalf("second: err = %v, want PurchasedError{105}", err)
		}
		if e.stock(t, 32) != 4 {
			t.Fatalf("stock = %d, want 4", e.stock(t, 32))
		}
	})
	t.Run("same order id twice", func(t *testing.T) {
		e.put(t, 36, 5, open, later)
		before := e.streamLen(t, 36)
		for i := range 2 {
			r, err := e.res.Reserve(ctx, 36, 8, 107)
			if err != nil || r.OrderID != 107 || r.Replayed != (i == 1) {
				t.Fatalf("call %d: %+v, %v", i, r, err)
			}
		}
		if e.stock(t, 36) != 4 {
			t.Fatalf("stock = %d, want 4: a retry reserved twice", e.stock(t, 36))
		}
		if got := e.streamLen(t, 36) - before; got != 1 {
			t.Fatalf("%d stream entries, want 1", got)
		}
	})
}

// TestPurchaseWrongTypeWritesNothing damages, one at a time, each key the
// purchase script writes, on a real Redis and on the embedded one: the
// purchase fails closed with ErrWrongType naming the key and writes nothing,
// so a retry is refused the same way (never told already_purchased for an
// order that does not exist), and once the key is removed the buyer buys.
func TestPurchaseWrongTypeWritesNothing(t *testing.T) {
	t.Parallel()
	set := func(e scriptEnv, k string) error { return e.rdb.Set(context.Background(), k, "junk", 0).Err() }
	cases := []struct {
		name string
		key  func(e scriptEnv, id int64) string
		junk func(e scriptEnv, key string) error
	}{
		{"state is a string", scriptEnv.stateOf, set},
		{"buyers is a string", scriptEnv.buyersOf, set},
		{"buyers is a list", scriptEnv.buyersOf, func(e scriptEnv, k string) error {
			return e.rdb.RPush(context.Background(), k, "7").Err()
		}},
		{"stream is a string", scriptEnv.streamOf, set},
		{"stream is a hash", scriptEnv.streamOf, func(e scriptEnv, k string) error {
			return e.rdb.HSet(context.Background(), k, "a", "b").Err()
		}},
		{"pending is a string", scriptEnv.pendingOf, set},
		{"pending is a stream", scriptEnv.pendingOf, func(e scriptEnv, k string) error {
			return e.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: k, Values: []string{"a", "b"}}).Err()
		}},
		{"pending is a set", scriptEnv.pendingOf, func(e scriptEnv, k string) error {
			return e.rdb.SAdd(context.Background(), k, "x").Err()
		}},
	}
	for _, backend := range []struct {
		name string
		env  func(t testing.TB) scriptEnv
	}{{"redis", newScriptEnv}, {"embedded", newEmbeddedScriptEnv}} {
		for _, tc := range cases {
			t.Run(backend.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				e := backend.env(t)
				ctx := context.Background()
				const id, user = 4, 9
				open, later := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
				e.put(t, id, 3, open, later)
				key := tc.key(e, id)
				if err := tc.junk(e, key); err != nil {
					t.Fatal(err)
				}
				before := e.look(t, id)
				// A retry of the same call, then a new press (a new order id).
				for try, orderID := range []int64{500, 500, 501} {
					_, err := e.res.Reserve(ctx, id, user, orderID)
					if after := e.look(t, id); after != before {
						t.Fatalf("try %d (%v) wrote:\nbefore %s\nafter  %s", try, err, before, after)
					}
					if !errors.Is(err, ErrWrongType) || !strings.Contains(err.Error(), key) {
						t.Fatalf("try %d: err = %v, want ErrWrongType naming %s", try, err, key)
					}
				}
				if err := e.rdb.Del(ctx, key).Err(); err != nil {
					t.Fatal(err)
				}
				if key == e.stateOf(id) {
					e.put(t, id, 3, open, later)
				}
				r, err := e.res.Reserve(ctx, id, user, 600)
				if err != nil || r.OrderID != 600 || r.Replayed || e.stock(t, id) != 2 {
					t.Fatalf("after the key was removed: %+v, %v", r, err)
				}
			})
		}
	}
}

// newEmbeddedScriptEnv is newScriptEnv on the in-process Redis that
// embedded mode runs the same scripts on.
func newEmbeddedScriptEnv(t testing.TB) scriptEnv {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	keys := NewKeys("", 4)
	return scriptEnv{rdb: rdb, keys: keys, state: NewState(rdb, keys), res: NewReserver(rdb, keys)}
}

// stateOf, buyersOf, streamOf and pendingOf are the keys a purchase of id writes.
func (e scriptEnv) stateOf(id int64) string   { return e.keys.State(id) }
func (e scriptEnv) buyersOf(id int64) string  { return e.keys.Buyers(id) }
func (e scriptEnv) streamOf(id int64) string  { return e.keys.Stream(e.keys.Shard(id)) }
func (e scriptEnv) pendingOf(id int64) string { return e.keys.Pending(e.keys.Shard(id)) }

// look describes every key a purchase of id may write: its type and
// contents, read in a way both Redis servers answer.
func (e scriptEnv) look(t testing.TB, id int64) string {
	t.Helper()
	ctx := context.Background()
	var b strings.Builder
	for _, k := range []string{e.stateOf(id), e.buyersOf(id), e.streamOf(id), e.pendingOf(id)} {
		typ, err := e.rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = e.rdb.Get(ctx, k).Result()
		case "hash":
			v, err = e.rdb.HGetAll(ctx, k).Result()
		case "list":
			v, err = e.rdb.LRange(ctx, k, 0, -1).Result()
		case "set":
			v, err = e.rdb.SMembers(ctx, k).Result()
		case "stream":
			v, err = e.rdb.XRange(ctx, k, "-", "+").Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s %v; ", k, typ, v)
	}
	return b.String()
}

func TestPurchaseMessageDecodes(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	ctx := context.Background()
	e.put(t, 44, 1, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if _, err := e.res.Reserve(ctx, 44, 77, 109); err != nil {
		t.Fatal(err)
	}
	entries, err := e.rdb.XRange(ctx, e.keys.Stream(e.keys.Shard(44)), "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("entries %v, %v", entries, err)
	}
	m, err := Decode(entries[0].Values)
	if err != nil {
		t.Fatal(err)
	}
	if m.OrderID != 109 || m.UserID != 77 || m.VoucherID != 44 || time.Since(m.AcceptedAt) > time.Minute {
		t.Fatalf("decoded %+v", m)
	}
	who, err := e.rdb.HGet(ctx, e.keys.Pending(e.keys.Shard(44)), "109").Result()
	if err != nil || who != "77:44" {
		t.Fatalf("pending index %q, %v", who, err)
	}
}

// TestPurchaseGated releases hundreds of buyers at once: exactly stock of
// them win, and one buyer pressing many times wins once.
func TestPurchaseGated(t *testing.T) {
	t.Parallel()
	e := newScriptEnv(t)
	ctx := context.Background()
	const buyers, stock = 500, 50
	e.put(t, 48, stock, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	e.put(t, 52, stock, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))

	var wins, oneUserWins, soldOut atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range buyers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			<-start
			_, err := e.res.Reserve(ctx, 48, int64(1000+i), int64(10_000+i))
			switch {
			case err == nil:
				wins.Add(1)
			case errors.Is(err, ErrSoldOut):
				soldOut.Add(1)
			default:
				t.Errorf("buyer %d: %v", i, err)
			}
		}()
		go func() {
			defer wg.Done()
			<-start
			var held *PurchasedError
			_, err := e.res.Reserve(ctx, 52, 5, int64(20_000+i))
			switch {
			case err == nil:
				oneUserWins.Add(1)
			case errors.As(err, &held):
			default:
				t.Errorf("repeat %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if wins.Load() != stock || soldOut.Load() != buyers-stock {
		t.Fatalf("%d won and %d sold out; want %d and %d", wins.Load(), soldOut.Load(), stock, buyers-stock)
	}
	if oneUserWins.Load() != 1 {
		t.Fatalf("one buyer won %d times", oneUserWins.Load())
	}
	if e.stock(t, 48) != 0 || e.stock(t, 52) != stock-1 {
		t.Fatalf("stocks %d and %d", e.stock(t, 48), e.stock(t, 52))
	}
	if n, _ := e.rdb.HLen(ctx, e.keys.Buyers(48)).Result(); n != stock {
		t.Fatalf("%d buyers recorded, want %d", n, stock)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	good := Message{OrderID: 1, UserID: 2, VoucherID: 3, AcceptedAt: time.UnixMilli(1_800_000_000_000)}.Encode()
	if m, err := Decode(good); err != nil || m.OrderID != 1 || m.UserID != 2 || m.VoucherID != 3 {
		t.Fatalf("good message: %+v, %v", m, err)
	}
	with := func(k string, v any) map[string]any {
		out := map[string]any{}
		for a, b := range good {
			out[a] = b
		}
		if v == nil {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	for name, vals := range map[string]map[string]any{
		"no version": with("v", nil), "version 2": with("v", "2"), "no order": with("order", nil),
		"zero user": with("user", "0"), "negative voucher": with("voucher", "-4"), "text at": with("at", "soon"),
		"overflow": with("order", "99999999999999999999"), "not a string": with("user", 5),
	} {
		if _, err := Decode(vals); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: err = %v, want ErrBadMessage", name, err)
		}
	}
}

// TestRepeatPressReadsNoState: a buyer who holds an order is answered
// from the buyers hash alone, on Redis and on the embedded one: with the
// voucher's state damaged, their repeat press still names their order,
// while another buyer, and a retry of the first press (which writes), are
// refused for the damaged key.
func TestRepeatPressReadsNoState(t *testing.T) {
	t.Parallel()
	for _, backend := range []struct {
		name string
		env  func(t testing.TB) scriptEnv
	}{{"redis", newScriptEnv}, {"embedded", newEmbeddedScriptEnv}} {
		t.Run(backend.name, func(t *testing.T) {
			t.Parallel()
			e := backend.env(t)
			ctx := context.Background()
			const id, user = 4, 9
			e.put(t, id, 3, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
			if r, err := e.res.Reserve(ctx, id, user, 500); err != nil || r.OrderID != 500 {
				t.Fatalf("first press: %+v, %v", r, err)
			}
			if err := e.rdb.Set(ctx, e.stateOf(id), "junk", 0).Err(); err != nil {
				t.Fatal(err)
			}
			var held *PurchasedError
			if _, err := e.res.Reserve(ctx, id, user, 501); !errors.As(err, &held) || held.OrderID != 500 {
				t.Fatalf("repeat press: %v, want already purchased (order 500)", err)
			}
			if _, err := e.res.Reserve(ctx, id, user+1, 502); !errors.Is(err, ErrWrongType) {
				t.Fatalf("another buyer: %v, want ErrWrongType", err)
			}
			// A retry of the first press itself writes its entry again:
			// it is refused for the damaged key, writing nothing.
			before := e.look(t, id)
			if _, err := e.res.Reserve(ctx, id, user, 500); !errors.Is(err, ErrWrongType) {
				t.Fatalf("retry of order 500: %v, want ErrWrongType", err)
			}
			if after := e.look(t, id); after != before {
				t.Fatalf("retry of order 500 wrote:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}
