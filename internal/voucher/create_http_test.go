package voucher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/testenv"
	schema "seckill/sql"
)

// createAnswer is what Create answered.
type createAnswer struct {
	status int
	body   string
	// Set on 201.
	Voucher struct {
		ID      int64 `json:"id"`
		Buckets *int  `json:"buckets"`
		Stock   int64 `json:"stock"`
	} `json:"voucher"`
	RedisReady bool `json:"redis_ready"`
	// Set on an error.
	apierr.Body
}

// postCreate sends a voucher of stock 10 on sale now, with the buckets
// field given as raw JSON ("" leaves it out), to h.Create.
func postCreate(t *testing.T, h *HTTP, buckets string) createAnswer {
	t.Helper()
	now := time.Now().UTC()
	body := map[string]any{
		"title": "hot", "face_value": 500, "stock": 10,
		"begin_at": now.Add(-time.Minute).Format(time.RFC3339), "end_at": now.Add(time.Hour).Format(time.RFC3339),
	}
	if buckets != "" {
		body["buckets"] = json.RawMessage(buckets)
	}
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/vouchers", h.Create)
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/vouchers", bytes.NewReader(b)))
	a := createAnswer{status: rec.Code, body: rec.Body.String()}
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("buckets %s: %d %s: not JSON: %v", buckets, rec.Code, rec.Body, err)
	}
	return a
}

// shownBuckets is the buckets field of voucher id in the public answers:
// GET /vouchers/{id} and GET /vouchers (nil when absent).
func shownBuckets(t *testing.T, h *HTTP, id int64) (show, list *int) {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.GET("/vouchers/:id", h.Show)
	r.GET("/vouchers", h.List)
	get := func(path string, into any) {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), into); err != nil {
			t.Fatalf("GET %s: %s: %v", path, rec.Body, err)
		}
	}
	type shown struct {
		ID      int64 `json:"id"`
		Buckets *int  `json:"buckets"`
	}
	var one shown
	get("/vouchers/"+strconv.FormatInt(id, 10), &one)
	var page struct{ Vouchers []shown }
	get("/vouchers?limit=100", &page)
	for _, v := range page.Vouchers {
		if v.ID == id {
			list = v.Buckets
		}
	}
	return one.Buckets, list
}

// migratedDB is a fresh database of dialect with the schema applied.
func migratedDB(t *testing.T, dialect string) *gorm.DB {
	t.Helper()
	g := testenv.DB(t, dialect)
	if _, err := schema.Apply(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

// prefixKeys lists the Redis keys under prefix.
func prefixKeys(t *testing.T, rdb redis.UniversalClient, prefix string) []string {
	t.Helper()
	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestCreateBuckets: on both databases and a real Redis with 4 shards,
// a voucher created without buckets (or with null) has 1, exactly as
// before; 3 and 4 (one per shard) are stored and shown to the admin, and
// to everyone in the voucher's public answers (one voucher, the list);
// "auto" on a single server is 1. Past the bound (0, 5 with 4 shards, 65,
// an integer too large for any int) is 422 invalid_voucher naming the
// bound and SECKILL_SHARDS, and a value of another type 400 bad_request:
// neither writes a row or a Redis key.
func TestCreateBuckets(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "mariadb"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			g := migratedDB(t, dialect)
			rdb := testenv.Redis(t)
			prefix := testenv.Prefix(t)
			h := NewHTTP(NewStore(g), NewState(rdb, NewKeys(prefix, 4)), nil, nil, slog.New(slog.DiscardHandler))

			for _, raw := range []string{"0", "-1", "5", "65", "99999999999999999999999"} {
				a := postCreate(t, h, raw)
				if a.status != http.StatusUnprocessableEntity || a.Code != "invalid_voucher" ||
					!strings.Contains(a.Message, "between 1 and 4") || !strings.Contains(a.Message, "SECKILL_SHARDS is 4") {
					t.Errorf("buckets %s: %d %s, want 422 invalid_voucher naming the bound 4 and SECKILL_SHARDS", raw, a.status, a.body)
				}
			}
			for _, raw := range []string{`"many"`, "2.5", "3.0", "1e1", "true", `"AUTO"`, `"3"`, "[3]", "{}"} {
				a := postCreate(t, h, raw)
				if a.status != http.StatusBadRequest || a.Code != "bad_request" || !strings.Contains(a.Message, "buckets") {
					t.Errorf("buckets %s: %d %s, want 400 bad_request about buckets", raw, a.status, a.body)
				}
			}
			var rows int64
			if err := g.Model(&Voucher{}).Count(&rows).Error; err != nil {
				t.Fatal(err)
			}
			if keys := prefixKeys(t, rdb, prefix); rows != 0 || len(keys) != 0 {
				t.Fatalf("refused creations left %d voucher rows and Redis keys %v", rows, keys)
			}

			store := NewStore(g)
			for _, c := range []struct {
				raw  string
				want int
			}{{"", 1}, {"null", 1}, {"1", 1}, {"3", 3}, {"4", 4}, {`"auto"`, 1}} {
				a := postCreate(t, h, c.raw)
				if a.status != http.StatusCreated || !a.RedisReady || a.Voucher.Buckets == nil || *a.Voucher.Buckets != c.want {
					t.Errorf("buckets %q: %d %s, want 201 showing buckets %d", c.raw, a.status, a.body, c.want)
					continue
				}
				v, err := store.Get(context.Background(), a.Voucher.ID)
				if err != nil || v.Buckets != c.want {
					t.Errorf("buckets %q: stored %d (%v), want %d", c.raw, v.Buckets, err, c.want)
				}
				if show, list := shownBuckets(t, h, a.Voucher.ID); show == nil || *show != c.want || list == nil || *list != c.want {
					t.Errorf("buckets %q: GET /vouchers/{id} shows buckets %v, the list %v; want %d in both", c.raw, deref(show), deref(list), c.want)
				}
			}
		})
	}
}

// TestCreateBucketsBoundIsMaxBuckets: with more shards than MaxBuckets the
// bound is MaxBuckets; the refusal comes before the store is reached (it
// has no database: reaching it would panic).
func TestCreateBucketsBoundIsMaxBuckets(t *testing.T) {
	t.Parallel()
	h := NewHTTP(NewStore(nil), NewState(nil, NewKeys("", 100)), nil, nil, slog.New(slog.DiscardHandler))
	a := postCreate(t, h, "65")
	if a.status != http.StatusUnprocessableEntity || a.Code != "invalid_voucher" || !strings.Contains(a.Message, "between 1 and 64") {
		t.Fatalf("buckets 65 with 100 shards: %d %s, want 422 invalid_voucher naming the bound 64", a.status, a.body)
	}
}

// TestCreateBucketsAutoOnCluster: on a real cluster of three masters,
// "auto" is one bucket per master serving the shards (3 with 3 or 6
// shards; 2 with 2 shards, which sit on two of the masters), and what is
// stored is what is shown.
func TestCreateBucketsAutoOnCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	rdb := cl.Client(t)
	g := migratedDB(t, "sqlite")
	store := NewStore(g)
	for _, c := range []struct{ shards, want int }{{3, 3}, {6, 3}, {2, 2}} {
		h := NewHTTP(store, NewState(rdb, NewClusterKeys(testenv.Prefix(t), c.shards)), nil, nil, slog.New(slog.DiscardHandler))
		a := postCreate(t, h, `"auto"`)
		if a.status != http.StatusCreated || a.Voucher.Buckets == nil || *a.Voucher.Buckets != c.want {
			t.Errorf("auto with %d shards on 3 masters: %d %s, want 201 with buckets %d", c.shards, a.status, a.body, c.want)
			continue
		}
		if v, err := store.Get(context.Background(), a.Voucher.ID); err != nil || v.Buckets != c.want {
			t.Errorf("auto with %d shards: stored %d (%v), want %d", c.shards, v.Buckets, err, c.want)
		}
	}
}

// TestCreateBucketsAutoRedisDown: when the cluster's masters cannot be
// counted, "auto" answers 503 unavailable and writes no row.
func TestCreateBucketsAutoRedisDown(t *testing.T) {
	t.Parallel()
	g := migratedDB(t, "sqlite")
	down := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:" + testenv.FreePort(t)}, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = down.Close() })
	h := NewHTTP(NewStore(g), NewState(down, NewClusterKeys("", 2)), nil, nil, slog.New(slog.DiscardHandler))
	a := postCreate(t, h, `"auto"`)
	if a.status != http.StatusServiceUnavailable || a.Code != "unavailable" || !strings.Contains(a.Message, "auto") {
		t.Fatalf("auto with Redis down: %d %s, want 503 unavailable", a.status, a.body)
	}
	var rows int64
	if err := g.Model(&Voucher{}).Count(&rows).Error; err != nil || rows != 0 {
		t.Fatalf("auto with Redis down left %d rows (%v)", rows, err)
	}
}

// TestPurchaseInTransitIsBusy: a purchase refused because units are
// moving between buckets answers 503 busy with Retry-After: 1, wrapped or
// not, and never sold_out, even joined with ErrSoldOut.
func TestPurchaseInTransitIsBusy(t *testing.T) {
	t.Parallel()
	h := NewHTTP(nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	for _, err := range []error{
		ErrInTransit,
		errors.Join(errors.New("borrow for voucher 1"), ErrInTransit),
		errors.Join(ErrSoldOut, ErrInTransit),
	} {
		var outcome string
		a := answerOf(func(c *gin.Context) { outcome = h.answer(c, 1, 0, err) })
		var body apierr.Body
		_ = json.Unmarshal([]byte(a.body), &body)
		if a.status != http.StatusServiceUnavailable || body.Code != "busy" || outcome != "busy" || !a.aborted ||
			a.header.Get("Retry-After") != "1" || a.header.Get("X-Before") != "kept" {
			t.Errorf("answer to %v: %+v (outcome %s), want 503 busy with Retry-After: 1", err, a, outcome)
		}
	}
}

// TestPurchasePausesSayWhenToRetry: every 503 a refused purchase answers
// carries Retry-After: 1 (a buyer of a bucket whose master fails over
// presses again in a second); refusals that are final carry none.
func TestPurchasePausesSayWhenToRetry(t *testing.T) {
	t.Parallel()
	// A database that cannot be read: a voucher Redis knows nothing of
	// cannot be explained, and is a pause too.
	g := migratedDB(t, "sqlite")
	sqlDB, err := g.DB()
	if err != nil {
		t.Fatal(err)
	}
	_ = sqlDB.Close()
	h := NewHTTP(NewStore(g), nil, nil, nil, slog.New(slog.DiscardHandler))
	for _, c := range []struct {
		err   error
		code  string
		pause bool
	}{
		{ErrInTransit, "busy", true},
		{ErrNotReady, "not_ready", true},
		{fmt.Errorf("order 1: %w", ErrNotReplicated), "not_replicated", true},
		{ErrWrongType, "unavailable", true},
		{ErrNoState, "unavailable", true},
		{errors.New("dial tcp 127.0.0.1:7001: connect: connection refused"), "unavailable", true},
		{ErrSoldOut, "sold_out", false},
		{ErrNotStarted, "not_started", false},
		{ErrEnded, "ended", false},
		{&PurchasedError{OrderID: 7}, "already_purchased", false},
	} {
		var outcome string
		a := answerOf(func(g *gin.Context) { outcome = h.answer(g, 1, 0, c.err) })
		if outcome != c.code || (a.status == http.StatusServiceUnavailable) != c.pause {
			t.Errorf("answer to %v: %d %s, want %s (a pause: %v)", c.err, a.status, outcome, c.code, c.pause)
		}
		if got, want := a.header.Get("Retry-After"), map[bool]string{true: "1"}[c.pause]; got != want {
			t.Errorf("answer to %v (%d %s): Retry-After %q, want %q", c.err, a.status, outcome, got, want)
		}
	}
}

// deref is *p, or "absent".
func deref(p *int) any {
	if p == nil {
		return "absent"
	}
	return *p
}
