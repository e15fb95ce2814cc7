package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
)

// clock is a settable time source, so no test sleeps.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestParseRule(t *testing.T) {
	t.Parallel()
	good := map[string]Rule{"5/1s": {5, time.Second}, "10/1m": {10, time.Minute}, " 3/500ms ": {3, 500 * time.Millisecond}, "off": {}, "0": {}}
	for s, want := range good {
		got, err := ParseRule(s)
		if err != nil || got != want {
			t.Errorf("ParseRule(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "5", "x/1s", "5/x", "-1/1s", "5/0s", "5/-1s", "5/48h", "9999999/1s", "1/1ns"} {
		if _, err := ParseRule(s); err == nil {
			t.Errorf("ParseRule(%q) accepted", s)
		}
	}
}

func TestBucket(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 3, Per: 3 * time.Second}, c.now)
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d refused within the burst", i)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait != time.Second {
		t.Fatalf("4th: ok=%v wait=%v; want refused, 1s", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key shares the bucket")
	}
	c.add(999 * time.Millisecond)
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("allowed before a token was back")
	}
	c.add(time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("refused after a token was back")
	}
	c.add(time.Hour)
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("after refill: request %d refused", i)
		}
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("bucket holds more than its burst after a long idle time")
	}
}

func TestOffAllowsAll(t *testing.T) {
	t.Parallel()
	var nilLimiter *Limiter
	for _, l := range []*Limiter{New(Rule{}, nil), nilLimiter} {
		for range 1000 {
			if ok, _ := l.Allow("x"); !ok {
				t.Fatal("an off limiter refused")
			}
		}
	}
}

// TestConcurrentBurst releases 500 goroutines on one key at once: exactly
// the burst gets through.
func TestConcurrentBurst(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 7, Per: time.Hour}, c.now)
	var wins atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 500 {
		wg.Go(func() {
			<-start
			if ok, _ := l.Allow("user:1"); ok {
				wins.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if wins.Load() != 7 {
		t.Fatalf("%d allowed, want 7", wins.Load())
	}
}

// TestManyKeysBounded floods distinct keys: memory stays bounded and a key
// that was refused is not reset by the flood more than eviction allows.
func TestManyKeysBounded(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 1, Per: time.Hour}, c.now)
	for i := range 2 * shards * maxKeysPerShard {
		l.Allow("k" + strconv.Itoa(i))
		if i%1000 == 0 {
			c.add(time.Millisecond)
		}
	}
	total := 0
	for i := range l.shard {
		total += len(l.shard[i].buckets)
	}
	if total > shards*maxKeysPerShard {
		t.Fatalf("%d buckets kept, bound is %d", total, shards*maxKeysPerShard)
	}
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 1, Per: 90 * time.Second}, c.now)
	r := gin.New()
	r.GET("/x", Middleware(l, func(c *gin.Context) string { return c.Query("k") }), func(c *gin.Context) { c.Status(204) })
	do := func(k string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x?k="+k, nil))
		return w
	}
	if w := do("a"); w.Code != 204 {
		t.Fatalf("first: %d", w.Code)
	}
	w := do("a")
	if w.Code != 429 || w.Header().Get("Retry-After") != "90" || !strings.Contains(w.Body.String(), `"code":"too_many_requests"`) {
		t.Fatalf("second: %d %q %s", w.Code, w.Header().Get("Retry-After"), w.Body.String())
	}
	for range 5 {
		if w := do(""); w.Code != 204 {
			t.Fatalf("empty key limited: %d", w.Code)
		}
	}
}
