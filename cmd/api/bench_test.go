package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/idgen"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	"seckill/lua"
)

// benchSale puts a voucher with more stock than any run sells on sale in
// the shared Redis.
func benchSale(b *testing.B) (*redis.Client, voucher.Keys, int64) {
	return benchVoucher(b, 1<<30)
}

// benchVoucher puts a voucher of stock units on sale in the shared Redis.
func benchVoucher(b *testing.B, stock int) (*redis.Client, voucher.Keys, int64) {
	b.Helper()
	rdb := testenv.Redis(b)
	keys := voucher.NewKeys(testenv.Prefix(b), 1)
	st := voucher.NewState(rdb, keys)
	ctx := context.Background()
	v := voucher.Voucher{ID: 1, Stock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if _, err := st.Load(ctx, v, nil); err != nil {
		b.Fatal(err)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		b.Fatal(err)
	}
	return rdb, keys, v.ID
}

// benchShop is the API's router as run builds it for a purchase: access
// log (at warn, as measured deployments run), recovery, body limit,
// metrics, headers, token check, the handler with its observer and, when
// refusalsTTL is above 0, the instance's local refusals.
type benchShop struct {
	r      *gin.Engine
	tokens []string
	path   string
}

// benchUsers is how many buyers a benchmark has tokens for.
const benchUsers = 1 << 16

func newBenchShop(b *testing.B, rdb *redis.Client, keys voucher.Keys, vid int64, refusalsTTL time.Duration, opts ...voucher.ReserveOption) *benchShop {
	b.Helper()
	log := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	signer, _ := auth.NewSigner([]byte(testSecret))
	ids, err := idgen.Lease(context.Background(), rdb, idgen.Config{KeyPrefix: keys.Prefix()}, log)
	if err != nil {
		b.Fatal(err)
	}
	m := metrics.New()
	vouchers := voucher.NewHTTP(voucher.NewStore(nil), voucher.NewState(rdb, keys), voucher.NewReserver(rdb, keys, opts...), ids, log)
	vouchers.Observe(m)
	if refusalsTTL > 0 {
		vouchers.Refuse(voucher.NewRefusals(rdb, keys, voucher.RefusalsConfig{TTL: refusalsTTL}, log))
	}
	r := apiEngine(log, m, deps{
		log: log, rdb: rdb, signer: signer, keys: keys, vouchers: vouchers,
		orders: order.NewHTTP(nil, nil, rdb, keys, log),
		health: &health{rdb: rdb},
	})
	// Tokens are minted up front: a client sends the same token many times.
	s := &benchShop{r: r, tokens: make([]string, benchUsers), path: fmt.Sprintf("/api/v1/vouchers/%d/orders", vid)}
	for i := range s.tokens {
		s.tokens[i], _ = signer.Mint(auth.Identity{UserID: int64(i + 1), Role: auth.RoleUser}, time.Hour)
	}
	return s
}

// buy is one purchase by buyer i (mod benchUsers): the status.
func (s *benchShop) buy(i int64) int {
	req := httptest.NewRequest(http.MethodPost, s.path, nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens[i%benchUsers])
	w := httptest.NewRecorder()
	s.r.ServeHTTP(w, req)
	return w.Code
}

// run fires b.N purchases, many in flight as under a stampede, buyer
// first+1, first+2, ...; each must be answered want.
func (s *benchShop) run(b *testing.B, first int64, want int) {
	var n atomic.Int64
	n.Store(first)
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if code := s.buy(n.Add(1)); code != want {
				b.Fatalf("status %d, want %d", code, want)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
}

// BenchmarkPurchase is the real purchase route (see benchShop). Every
// request is a new buyer, so every one reserves and appends to the stream.
// Concurrent purchases are coalesced into pipelines, as they are by
// default.
func BenchmarkPurchase(b *testing.B) { benchPurchase(b) }

// BenchmarkPurchaseUncoalesced is BenchmarkPurchase with one round trip
// per purchase; run the two alternated over several rounds and compare
// medians.
func BenchmarkPurchaseUncoalesced(b *testing.B) { benchPurchase(b, voucher.Coalesce(0)) }

func benchPurchase(b *testing.B, opts ...voucher.ReserveOption) {
	rdb, keys, vid := benchSale(b)
	s := newBenchShop(b, rdb, keys, vid, 200*time.Millisecond, opts...)
	// Buyers past benchUsers reuse tokens and are refused as repeats.
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if code := s.buy(n.Add(1)); code != http.StatusAccepted && code != http.StatusConflict {
				b.Fatalf("status %d", code)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
}

// BenchmarkPurchaseSoldOutLocal: purchases of a sold-out voucher by new
// buyers, answered from the instance's memory (the refusal is kept for an
// hour, so no purchase renews it during the run).
func BenchmarkPurchaseSoldOutLocal(b *testing.B) {
	rdb, keys, vid := benchVoucher(b, 0)
	s := newBenchShop(b, rdb, keys, vid, time.Hour)
	if code := s.buy(0); code != http.StatusConflict {
		b.Fatalf("first purchase: %d, want 409", code)
	}
	s.run(b, 1, http.StatusConflict)
}

// BenchmarkPurchaseRepeat: repeat presses of buyers who hold an order,
// with the default bound on local answers (200ms): most go to Redis.
func BenchmarkPurchaseRepeat(b *testing.B) {
	rdb, keys, vid := benchSale(b)
	s := newBenchShop(b, rdb, keys, vid, 200*time.Millisecond)
	const holders = 1000
	for i := range int64(holders) {
		if code := s.buy(i); code != http.StatusAccepted {
			b.Fatalf("buyer %d: %d, want 202", i, code)
		}
	}
	s.tokens = s.tokens[:holders]
	s.runRepeat(b, holders)
}

// runRepeat is run over the first holders buyers only.
func (s *benchShop) runRepeat(b *testing.B, holders int64) {
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if code := s.buy(n.Add(1) % holders); code != http.StatusConflict {
				b.Fatalf("status %d, want 409", code)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
}

// BenchmarkPurchaseCeiling is the least a Gin server can do per purchase
// with this design: one route that runs the same script with go-redis.
// BenchmarkPurchase over this is the overhead of everything else.
func BenchmarkPurchaseCeiling(b *testing.B) {
	rdb, keys, vid := benchSale(b)
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	script := lua.Purchase()
	var seq atomic.Int64
	skeys := []string{keys.Ready(0), keys.State(vid), keys.Buyers(vid), keys.Stream(0), keys.Pending(0)}
	r.POST("/buy", func(c *gin.Context) {
		n := seq.Add(1)
		res, err := script.Run(c.Request.Context(), rdb, skeys, vid, n%(1<<16)+1, n).Slice()
		if err != nil {
			c.Status(http.StatusServiceUnavailable)
			return
		}
		c.JSON(http.StatusAccepted, gin.H{"code": res[0]})
	})
	b.ReportAllocs()
	// Many requests in flight, as under a stampede, not one per core.
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/buy", nil)
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != http.StatusAccepted {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "purchases/s")
}
