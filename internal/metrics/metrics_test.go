package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The hooks are the observers the packages declare.
var (
	_ voucher.Observer = (*Metrics)(nil)
	_ order.Observer   = (*Metrics)(nil)
	_ mq.Observer      = (*Metrics)(nil)
)

// value reads one series from the registry; labels are name, value pairs.
// A histogram reads as its sample count.
func value(t *testing.T, m *Metrics, name string, labels ...string) float64 {
	t.Helper()
	v, ok := lookup(t, m, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

func lookup(t *testing.T, m *Metrics, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				if !hasLabel(s, labels[i], labels[i+1]) {
					continue next
				}
			}
			switch {
			case s.Counter != nil:
				return s.Counter.GetValue(), true
			case s.Gauge != nil:
				return s.Gauge.GetValue(), true
			case s.Histogram != nil:
				return float64(s.Histogram.GetSampleCount()), true
			}
		}
	}
	return 0, false
}

func hasLabel(s *dto.Metric, name, val string) bool {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == val
		}
	}
	return false
}

func TestHooksCount(t *testing.T) {
	t.Parallel()
	m := New()
	m.Purchase("accepted", time.Millisecond, 500*time.Microsecond)
	m.Purchase("accepted", time.Millisecond, 500*time.Microsecond)
	m.Purchase("sold_out", time.Millisecond, 500*time.Microsecond)
	m.Purchase("bad_request", time.Millisecond, 0)
	m.Purchase("who_knows", time.Millisecond, 0)
	m.Batch(3, 2*time.Millisecond)
	m.Written(2)
	m.DeadLettered("out_of_stock")
	m.DeadLettered("made_up")
	m.LockConflicts(4)
	m.Reclaimed(5)
	m.Outcomes(6, 1, 2)
	m.RedisError("ack")
	m.MySQLError("write")

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"seckill_purchases_total", []string{"outcome", "accepted"}, 2},
		{"seckill_purchases_total", []string{"outcome", "sold_out"}, 1},
		{"seckill_purchases_total", []string{"outcome", "bad_request"}, 1},
		{"seckill_purchases_total", []string{"outcome", "other"}, 1},
		{"seckill_purchases_total", []string{"outcome", "ended"}, 0},
		{"seckill_purchase_duration_seconds", nil, 5},
		{"seckill_purchase_script_duration_seconds", nil, 3}, // not when the script did not run
		{"seckill_worker_batch_size", nil, 1},
		{"seckill_order_write_duration_seconds", nil, 1},
		{"seckill_orders_written_total", nil, 2},
		{"seckill_dead_letters_total", []string{"reason", "out_of_stock"}, 1},
		{"seckill_dead_letters_total", []string{"reason", "other"}, 1},
		{"seckill_lock_conflicts_total", nil, 4},
		{"seckill_reclaimed_entries_total", nil, 5},
		{"seckill_worker_messages_total", []string{"outcome", "ack"}, 6},
		{"seckill_worker_messages_total", []string{"outcome", "retry"}, 1},
		{"seckill_worker_messages_total", []string{"outcome", "pending"}, 2},
		{"seckill_redis_errors_total", []string{"op", "ack"}, 1},
		{"seckill_redis_errors_total", []string{"op", "read"}, 0},
		{"seckill_mysql_errors_total", []string{"op", "write"}, 1},
	} {
		if got := value(t, m, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestHotPathAllocatesNothing: a purchase's hook and the per-request HTTP
// series lookup (after the first request of a route) allocate nothing.
func TestHotPathAllocatesNothing(t *testing.T) {
	m := New()
	m.httpSeriesOf("/api/v1/vouchers/:id/orders", "POST", 202)
	if n := testing.AllocsPerRun(1000, func() { m.Purchase("accepted", time.Millisecond, time.Microsecond) }); n != 0 {
		t.Errorf("Purchase allocates %v times", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		s := m.httpSeriesOf("/api/v1/vouchers/:id/orders", "POST", 202)
		s.requests.Inc()
		s.took.Observe(0.001)
	}); n != 0 {
		t.Errorf("HTTP series lookup allocates %v times", n)
	}
}

func TestGinBoundsLabels(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	m := New()
	r := gin.New()
	r.Use(m.Gin())
	r.GET("/things/:id", func(c *gin.Context) { c.String(http.StatusTeapot, "x") })
	for _, req := range []*http.Request{
		httptest.NewRequest("GET", "/things/1", nil),
		httptest.NewRequest("GET", "/things/2", nil),
		httptest.NewRequest("GET", "/nowhere/12345", nil),
		httptest.NewRequest("BREW", "/things/3", nil),
	} {
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	if got := value(t, m, "seckill_http_requests_total", "route", "/things/:id", "method", "GET", "status", "418"); got != 2 {
		t.Errorf("route series %v, want 2", got)
	}
	if got := value(t, m, "seckill_http_requests_total", "route", "unmatched", "method", "GET", "status", "404"); got != 1 {
		t.Errorf("unmatched series %v, want 1", got)
	}
	if got := value(t, m, "seckill_http_requests_total", "route", "unmatched", "method", "other"); got != 1 {
		t.Errorf("unusual method series %v, want 1", got)
	}
	if got := value(t, m, "seckill_http_request_duration_seconds", "route", "/things/:id", "method", "GET"); got != 2 {
		t.Errorf("latency samples %v, want 2", got)
	}
}

// TestHandler serves the text format to a direct scrape and 404 to a
// request that came through a proxy.
func TestHandler(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	m := New()
	m.Purchase("accepted", time.Millisecond, time.Millisecond)
	r := gin.New()
	r.GET("/metrics", m.Handler())

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `seckill_purchases_total{outcome="accepted"} 1`) || !strings.Contains(body, "go_goroutines ") {
		t.Fatalf("direct scrape: %d\n%.2000s", w.Code, body)
	}
	for _, h := range []string{"X-Forwarded-For", "X-Real-IP"} {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set(h, "203.0.113.9")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != 404 || strings.Contains(w.Body.String(), "seckill_") {
			t.Errorf("through a proxy (%s): %d %s", h, w.Code, w.Body.String())
		}
	}
}

// TestLint: names, units and help texts follow Prometheus's conventions.
func TestLint(t *testing.T) {
	t.Parallel()
	m := New()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "seckill_") {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
	for name := range m.Families() {
		if !strings.HasPrefix(name, "seckill_") {
			t.Errorf("family %s lacks the seckill_ prefix", name)
		}
	}
}

// TestSampler reads a stream with pending and undelivered entries and a
// delay queue with an overdue member from a real Redis.
func TestSampler(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	p := testenv.Prefix(t)
	stream, delayed, empty := p+":{0}:orders", p+":{0}:delayed", p+":{1}:orders"
	ready, gone := p+":{0}:ready", p+":{1}:ready"
	if err := rdb.Set(ctx, ready, "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	const group = "writers"
	for i := range 5 {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": i}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := mq.EnsureGroup(ctx, rdb, stream, group); err != nil {
		t.Fatal(err)
	}
	// Two delivered and not acknowledged: pending 2, lag 3.
	if err := rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: group, Consumer: "c", Streams: []string{stream, ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_900_000_000_000)
	q := mq.NewDelayQueue(rdb, delayed, stream)
	if err := q.Schedule(ctx, mq.Payload(map[string]string{"a": "1"}), now.Add(-3*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := q.Schedule(ctx, mq.Payload(map[string]string{"a": "2"}), now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	m := New()
	s := NewSampler(rdb, m, SamplerConfig{
		Group: group, Now: func() time.Time { return now },
		Shards: []Shard{{Stream: stream, Delay: q, Ready: ready}, {Stream: empty, Ready: gone}},
	}, slog.New(slog.DiscardHandler))
	if err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, shard string
		want        float64
	}{
		{"seckill_stream_length", "0", 5},
		{"seckill_stream_pending", "0", 2},
		{"seckill_stream_lag", "0", 3},
		{"seckill_delay_queue_size", "0", 2},
		{"seckill_delay_queue_oldest_overdue_seconds", "0", 3},
		{"seckill_stream_length", "1", 0}, // no such stream yet
		{"seckill_stream_lag", "1", 0},
		{"seckill_shard_ready", "0", 1},
		{"seckill_shard_ready", "1", 0}, // marker missing: not ready
	} {
		if got := value(t, m, c.name, "shard", c.shard); got != c.want {
			t.Errorf("%s{shard=%s} = %v, want %v", c.name, c.shard, got, c.want)
		}
	}

	// Deleting an undelivered entry leaves Redis unable to tell the lag;
	// the sampler counts what follows the group's position.
	ids, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.XDel(ctx, stream, ids[3].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Sample(ctx); err != nil {
		t.Fatal(err)
	}
	if got := value(t, m, "seckill_stream_lag", "shard", "0"); got != 2 {
		t.Errorf("lag after a deletion = %v, want 2", got)
	}
	if got := value(t, m, "seckill_redis_errors_total", "op", "sample"); got != 0 {
		t.Errorf("sample errors %v", got)
	}
}

// TestSamplerRunStops: Run samples at once and returns when ctx is done.
func TestSamplerRunStops(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream := testenv.Prefix(t) + ":{0}:orders"
	if err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": 1}}).Err(); err != nil {
		t.Fatal(err)
	}
	m := New()
	s := NewSampler(rdb, m, SamplerConfig{Group: "g", Shards: []Shard{{Stream: stream}}, Every: time.Hour}, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for v, _ := lookup(t, m, "seckill_stream_length", "shard", "0"); v != 1; v, _ = lookup(t, m, "seckill_stream_length", "shard", "0") {
		if time.Now().After(deadline) {
			t.Fatal("no sample within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
