// Command ceiling is the least a Gin server can do per purchase with
// seckill's design: one route that runs the same purchase script
// (seckill/lua) on the same keys (seckill/internal/voucher) with go-redis.
// No token check, no id lease, no access log, no JSON error mapping. The
// load generator's bench compares an instance against it: the gap is the
// cost of everything else an instance does.
//
//	go run ./loadtest/ceiling --addr 127.0.0.1:18090 --redis redis://127.0.0.1:16379/0
//	go run ./loadtest/ceiling --redis 'redis-cluster://127.0.0.1:7000?addr=127.0.0.1:7001' --shards 8
//
// It takes POST /api/v1/vouchers (any body; puts a voucher with the given
// stock on sale in Redis only) and POST /api/v1/vouchers/{id}/orders, whose
// buyer is the X-Loadtest-User header the load generator sends. Its keys live
// under a prefix of their own, so it can share the deployment's Redis: one
// server or a Redis Cluster, whose masters its --shards spread the vouchers
// over as the service's shards do.
//
// Under /bare it serves the same two routes without Redis: a voucher's
// stock and buyers live in the server's memory, and a purchase answers the
// service's JSON (202 with an order id, 409 sold_out, 409 already_purchased
// naming the buyer's order). With a token secret (--secret,
// SECKILL_TOKEN_SECRET) a /bare purchase checks the buyer's bearer token
// with the service's own middleware (internal/auth) and takes the buyer
// from it, as the service does; without, from X-Loadtest-User. It is the
// HTTP stack's own ceiling: what Gin answers when nothing is asked of Redis.
//
// Under /gin it serves the same two routes with nothing behind them: no
// token, no stock, no buyers; a purchase answers 202 with a new order id.
// It is a bare Gin answer, the floor /bare is measured against
// (loadtest/README.md, "wrk and bench").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/redisconn"
	"seckill/internal/voucher"
	"seckill/lua"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ceiling:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("ceiling", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:18090", "listen address")
	redisURL := fs.String("redis", getenv("SECKILL_REDIS_URL"), "Redis (SECKILL_REDIS_URL)")
	pool := fs.Int("pool", 256, "Redis connections (per node on a cluster), as SECKILL_REDIS_POOL")
	shards := fs.Int("shards", envInt(getenv, "SECKILL_SHARDS", 1), "shards the vouchers spread over (SECKILL_SHARDS)")
	pprofAddr := fs.String("pprof", "", "serve net/http/pprof on this loopback address, to compare profiles with an instance's")
	secret := fs.String("secret", getenv("SECKILL_TOKEN_SECRET"), "token secret: /bare purchases check the bearer token as the service does (SECKILL_TOKEN_SECRET); empty: the buyer is X-Loadtest-User")
	prefix := fs.String("key-prefix", fmt.Sprintf("ceiling%d", time.Now().UnixNano()), "key prefix (a fresh one per start)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	rdb, err := redisconn.Open(*redisURL, redisconn.Tuning{PoolSize: *pool})
	if err != nil {
		return fmt.Errorf("--redis: %w", err)
	}
	defer rdb.Close()
	log := slog.New(slog.NewTextHandler(stdout, nil))

	keys := voucher.KeysFor(*prefix, *shards, redisconn.IsCluster(rdb))
	state := voucher.NewState(rdb, keys)
	for shard := range keys.Shards() {
		if err := state.MarkReady(ctx, shard); err != nil {
			return err
		}
	}
	var orders atomic.Int64
	sale := &redisSale{rdb: rdb, keys: keys, state: state, script: lua.Purchase(), orders: &orders}

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "up"}) })
	r.POST("/api/v1/vouchers", sale.createVoucher)
	r.POST("/api/v1/vouchers/:id/orders", sale.purchase)
	var signer *auth.Signer
	if *secret != "" {
		if signer, err = auth.NewSigner([]byte(*secret)); err != nil {
			return fmt.Errorf("--secret: %w", err)
		}
	}
	bareRoutes(r.Group("/bare"), signer, &orders)
	ginRoutes(r.Group("/gin"), &orders)

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 120 * time.Second}
	log.Info("ceiling server listening", "addr", ln.Addr().String(), "key_prefix", *prefix, "bare_token_check", signer != nil, "shards", keys.Shards(), "redis_cluster", redisconn.IsCluster(rdb))
	if *pprofAddr != "" {
		psrv, err := servePprof(*pprofAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--pprof: %w", err)
		}
		defer psrv.Close()
	}
	return serve(ctx, srv, ln)
}

// servePprof serves net/http/pprof's CPU profile on addr.
func servePprof(addr string) (*http.Server, error) {
	pln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = psrv.Serve(pln) }()
	return psrv, nil
}

// serve serves srv on ln until ctx ends, then shuts it down within 5s.
func serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// redisSale serves the service's voucher and purchase routes on Redis
// with the service's purchase script and nothing around it.
type redisSale struct {
	rdb      redis.UniversalClient
	keys     voucher.Keys
	state    *voucher.State
	script   *redis.Script
	vouchers atomic.Int64
	orders   *atomic.Int64
}

// createVoucher loads a voucher of the stock asked into Redis.
func (s *redisSale) createVoucher(c *gin.Context) {
	var req struct {
		Stock int `json:"stock"`
	}
	if err := json.NewDecoder(c.Request.Body).Decode(&req); err != nil || req.Stock <= 0 {
		c.JSON(http.StatusBadRequest, gin.H{"code": "bad_request", "message": "want {\"stock\": n}"})
		return
	}
	v := voucher.Voucher{ID: s.vouchers.Add(1), Stock: req.Stock, TotalStock: req.Stock,
		BeginAt: time.Now().Add(-time.Minute), EndAt: time.Now().Add(24 * time.Hour)}
	if _, err := s.state.Load(c.Request.Context(), v, nil); err != nil {
		c.JSON(http.StatusServiceUnavailable, gin.H{"code": "unavailable", "message": err.Error()})
		return
	}
	c.JSON(http.StatusCreated, gin.H{"voucher": gin.H{"id": v.ID}, "redis_ready": true})
}

// purchase runs the purchase script for the buyer X-Loadtest-User names
// (else a new one) and answers as the service does.
func (s *redisSale) purchase(c *gin.Context) {
	vid, _ := strconv.ParseInt(c.Param("id"), 10, 64)
	user, err := strconv.ParseInt(c.GetHeader("X-Loadtest-User"), 10, 64)
	if err != nil || user <= 0 {
		user = s.orders.Load() + 1
	}
	n := s.orders.Add(1)
	shard := s.keys.Shard(vid)
	res, err := s.script.Run(c.Request.Context(), s.rdb,
		[]string{s.keys.Ready(shard), s.keys.State(vid), s.keys.Buyers(vid), s.keys.Stream(shard), s.keys.Pending(shard)},
		vid, user, n).Slice()
	if err != nil || len(res) != 2 {
		c.JSON(http.StatusServiceUnavailable, gin.H{"code": "unavailable", "message": "purchase script failed"})
		return
	}
	switch res[0] {
	case int64(0), int64(1):
		c.JSON(http.StatusAccepted, gin.H{"order_id": strconv.FormatInt(n, 10), "status": "pending"})
	case int64(2):
		c.JSON(http.StatusConflict, gin.H{"code": "already_purchased", "message": "you already hold an order for this voucher", "order_id": fmt.Sprint(res[1])})
	case int64(3):
		c.JSON(http.StatusConflict, gin.H{"code": "sold_out", "message": "sold out"})
	default:
		c.JSON(http.StatusConflict, gin.H{"code": fmt.Sprint("code_", res[0]), "message": "refused"})
	}
}

// envInt reads an integer setting from the environment, def when unset or
// not a number.
func envInt(getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil {
		return n
	}
	return def
}

// bareVoucher is a /bare voucher: its stock and who holds which order.
type bareVoucher struct {
	stock  atomic.Int64
	buyers [bareShards]bareBuyers
}

// bareShards spreads a /bare voucher's buyers over locks.
const bareShards = 64

// bareBuyers maps buyers to their orders. Its map holds no pointer, so the
// garbage collector does not scan it: a sync.Map of boxed ids and order
// strings, growing by one entry per new buyer, made the collector's
// marking a fifth of /bare's CPU (loadtest/README.md, "wrk and bench"), a
// cost the service, whose buyers live in Redis, does not have.
type bareBuyers struct {
	sync.Mutex
	m map[int64]int64 // user id -> order id
}

// held returns the order user holds, if any.
func (v *bareVoucher) held(user int64) (int64, bool) {
	b := &v.buyers[uint64(user)%bareShards]
	b.Lock()
	defer b.Unlock()
	order, ok := b.m[user]
	return order, ok
}

// hold records order as user's unless user holds one already: then it
// returns that one and false.
func (v *bareVoucher) hold(user, order int64) (int64, bool) {
	b := &v.buyers[uint64(user)%bareShards]
	b.Lock()
	defer b.Unlock()
	if held, ok := b.m[user]; ok {
		return held, false
	}
	if b.m == nil {
		b.m = map[int64]int64{}
	}
	b.m[user] = order
	return order, true
}

// bareRoutes serves the voucher and purchase routes from memory (see the
// package comment). With a signer the purchase route checks the bearer
// token with the service's middleware and takes the buyer from it.
func bareRoutes(g *gin.RouterGroup, signer *auth.Signer, orders *atomic.Int64) {
	var vouchers sync.Map // voucher id -> *bareVoucher
	var ids atomic.Int64
	g.POST("/api/v1/vouchers", func(c *gin.Context) {
		var req struct {
			Stock int64 `json:"stock"`
		}
		if err := json.NewDecoder(c.Request.Body).Decode(&req); err != nil || req.Stock <= 0 {
			c.JSON(http.StatusBadRequest, gin.H{"code": "bad_request", "message": "want {\"stock\": n}"})
			return
		}
		v := &bareVoucher{}
		v.stock.Store(req.Stock)
		id := ids.Add(1)
		vouchers.Store(id, v)
		c.JSON(http.StatusCreated, gin.H{"voucher": gin.H{"id": id}, "redis_ready": true})
	})
	buyer := func(c *gin.Context) { c.Next() }
	if signer != nil {
		buyer = signer.Middleware()
	}
	g.POST("/api/v1/vouchers/:id/orders", buyer, func(c *gin.Context) {
		vid, _ := strconv.ParseInt(c.Param("id"), 10, 64)
		found, ok := vouchers.Load(vid)
		if !ok {
			c.JSON(http.StatusNotFound, gin.H{"code": "not_found", "message": "no such voucher"})
			return
		}
		v := found.(*bareVoucher)
		user := auth.From(c).UserID
		if signer == nil {
			user, _ = strconv.ParseInt(c.GetHeader("X-Loadtest-User"), 10, 64)
		}
		if held, ok := v.held(user); ok {
			c.JSON(http.StatusConflict, gin.H{"code": "already_purchased", "message": "you already hold an order for this voucher", "order_id": strconv.FormatInt(held, 10)})
			return
		}
		soldOut := v.stock.Load() <= 0
		if !soldOut && v.stock.Add(-1) < 0 {
			v.stock.Add(1)
			soldOut = true
		}
		if soldOut {
			c.JSON(http.StatusConflict, gin.H{"code": "sold_out", "message": "this voucher is sold out"})
			return
		}
		order, won := v.hold(user, orders.Add(1))
		if !won {
			v.stock.Add(1)
			c.JSON(http.StatusConflict, gin.H{"code": "already_purchased", "message": "you already hold an order for this voucher", "order_id": strconv.FormatInt(order, 10)})
			return
		}
		c.JSON(http.StatusAccepted, gin.H{"order_id": strconv.FormatInt(order, 10), "status": "pending"})
	})
}

// ginRoutes serves the voucher and purchase routes with nothing behind
// them (see the package comment): every purchase is accepted.
func ginRoutes(g *gin.RouterGroup, orders *atomic.Int64) {
	var ids atomic.Int64
	g.POST("/api/v1/vouchers", func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"voucher": gin.H{"id": ids.Add(1)}, "redis_ready": true})
	})
	g.POST("/api/v1/vouchers/:id/orders", func(c *gin.Context) {
		c.JSON(http.StatusAccepted, gin.H{"order_id": strconv.FormatInt(orders.Add(1), 10), "status": "pending"})
	})
}
