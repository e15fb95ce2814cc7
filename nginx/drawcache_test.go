//go:build linux

package nginx

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestDrawPagesCached: 300 pages asking a draw's public status at once
// through nginx reach the instance a handful of times (the answer's
// Cache-Control allows a second), and the answers are the instance's; a
// buyer's own entry, private, reaches it every time, and so does an answer
// without Cache-Control; once the second is over the status is asked again.
func TestDrawPagesCached(t *testing.T) {
	t.Parallel()
	var status, mine, errs atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/draw/me"):
			n := mine.Add(1)
			w.Header().Set("Cache-Control", "private, max-age=86400")
			fmt.Fprintf(w, `{"mine":%d}`, n)
		case r.URL.Path == "/api/v1/vouchers/7/draw":
			n := status.Add(1)
			w.Header().Set("Cache-Control", "public, max-age=1")
			w.Header().Set("ETag", fmt.Sprintf(`"s%d"`, n))
			time.Sleep(50 * time.Millisecond) // a slow answer: the others wait for it
			fmt.Fprintf(w, `{"status":%d}`, n)
		default: // an error of the same route shape: no Cache-Control
			errs.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"code":"unavailable"}`)
		}
	}))
	t.Cleanup(up.Close)
	listen := "127.0.0.1:" + testenv.FreePort(t)
	base := startNginx(t, prefix(t, vars(listen, strings.TrimPrefix(up.URL, "http://"))), listen)

	get := func(path string) (int, string) {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	const pages = 300
	start := make(chan struct{})
	bodies := make([]string, pages)
	var wg sync.WaitGroup
	for i := range pages {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, bodies[i] = get("/api/v1/vouchers/7/draw")
		}()
	}
	close(start)
	wg.Wait()
	if n := status.Load(); n > 3 {
		t.Errorf("%d pages reached the instance %d times, want a handful", pages, n)
	}
	t.Logf("%d pages at once reached the instance %d times", pages, status.Load())
	for i, b := range bodies {
		if !strings.HasPrefix(b, `{"status":`) {
			t.Fatalf("page %d read %q", i, b)
		}
	}
	for range 5 {
		get("/api/v1/vouchers/7/draw/me")
		if st, _ := get("/api/v1/vouchers/8/draw"); st != http.StatusServiceUnavailable {
			t.Errorf("an error answered %d through nginx", st)
		}
	}
	if mine.Load() != 5 || errs.Load() != 5 {
		t.Errorf("own entry reached the instance %d of 5 times, errors %d of 5: neither may be kept", mine.Load(), errs.Load())
	}
	before := status.Load()
	testenv.WaitFor(t, 5*time.Second, "the status asked of the instance again once its second is over", func() bool {
		get("/api/v1/vouchers/7/draw")
		return status.Load() > before
	})
}
