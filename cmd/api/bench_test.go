package main

import (
	"context"
	"fmt"
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
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	"seckill/lua"
)

// benchSale puts a voucher with more stock than any run sells on sale in
// the shared Redis.
func benchSale(b *testing.B) (*redis.Client, voucher.Keys, int64) {
	b.Helper()
	rdb := testenv.Redis(b)
	keys := voucher.NewKeys(testenv.Prefix(b), 1)
	st := voucher.NewState(rdb, keys)
	ctx := context.Background()
	v := voucher.Voucher{ID: 1, Stock: 1 << 30, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if _, err := st.Load(ctx, v, nil); err != nil {
		b.Fatal(err)
	}
	if err := st.MarkReady(ctx, 0); err != nil {
		b.Fatal(err)
	}
	return rdb, keys, v.ID
}

// BenchmarkPurchase is the real purchase route: router, access log, token
// check, id, the purchase script, the JSON answer. Every request is a new
// buyer, so every one reserves and appends to the stream. Concurrent
// purchases are coalesced into pipelines, as they are by default.
func BenchmarkPurchase(b *testing.B) { benchPurchase(b) }

// BenchmarkPurchaseUncoalesced is BenchmarkPurchase with one round trip
// per purchase; run the two alternated over several rounds and compare
// medians.
func BenchmarkPurchaseUncoalesced(b *testing.B) { benchPurchase(b, voucher.Coalesce(0)) }

func benchPurchase(b *testing.B, opts ...voucher.ReserveOption) {
	rdb, keys, vid := benchSale(b)
	log := slog.New(slog.DiscardHandler)
	signer, _ := auth.NewSigner([]byte(testSecret))
	ids, err := idgen.Lease(context.Background(), rdb, idgen.Config{KeyPrefix: keys.Prefix()}, log)
	if err != nil {
		b.Fatal(err)
	}
	r := newEngine(log)
	addRoutes(r, deps{
		log: log, rdb: rdb, signer: signer, keys: keys,
		vouchers: voucher.NewHTTP(voucher.NewStore(nil), voucher.NewState(rdb, keys), voucher.NewReserver(rdb, keys, opts...), ids, log),
		orders:   order.NewHTTP(nil, nil, rdb, keys, log),
		health:   &health{rdb: rdb},
	})
	// Tokens are minted up front: a client sends the same token many times.
	const users = 1 << 16
	tokens := make([]string, users)
	for i := range tokens {
		tokens[i], _ = signer.Mint(auth.Identity{UserID: int64(i + 1), Role: auth.RoleUser}, time.Hour)
	}
	path := fmt.Sprintf("/api/v1/vouchers/%d/orders", vid)
	var n atomic.Int64
	b.ReportAllocs()
	// Many requests in flight, as under a stampede, not one per core.
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req := httptest.NewRequest(http.MethodPost, path, nil)
			req.Header.Set("Authorization", "Bearer "+tokens[i%users])
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != http.StatusAccepted && w.Code != http.StatusConflict {
				b.Fatalf("status %d: %s", w.Code, w.Body.String())
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
