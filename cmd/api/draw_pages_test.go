package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// drawnVoucher creates a fair voucher whose draw closes in a second and a
// half, enters users into it, and waits until the draw is done.
func drawnVoucher(t testing.TB, base string, users ...int64) int64 {
	t.Helper()
	now := time.Now().UTC()
	begin := now.Add(-time.Minute).Truncate(time.Millisecond)
	st, v := call(t, "POST", base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "drawn", "face_value": 1000, "stock": 1, "fair_window_ms": now.Add(1500 * time.Millisecond).Sub(begin).Milliseconds(),
		"begin_at": begin.Format(time.RFC3339Nano), "end_at": now.Add(time.Hour).Format(time.RFC3339Nano),
	})
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher: %d %v", st, v)
	}
	id := int64(v["voucher"].(map[string]any)["id"].(float64))
	for _, u := range users {
		if st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, id), token(t, u, auth.RoleUser), nil); st != http.StatusAccepted {
			t.Fatalf("user %d enters: %d %v", u, st, body)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "the draw done", func() bool {
		_, body := call(t, "GET", fmt.Sprintf("%s/api/v1/vouchers/%d/draw", base, id), "", nil)
		d, _ := body["draw"].(map[string]any)
		return d != nil && d["status"] == "done"
	})
	return id
}

// TestDrawPagesLimitedPerAddress: the draw's pages (its status, the
// buyer's entry, its list) are limited per client address as purchases
// are, by SECKILL_LIMIT_DRAW_IP, one bucket for the three: an address past
// it is answered 429 too_many_requests with Retry-After, before the
// token is looked at; another address has its own.
func TestDrawPagesLimitedPerAddress(t *testing.T) {
	t.Parallel()
	o := startObserved(t, map[string]string{
		"SECKILL_RATE_LIMIT": "on", "SECKILL_LIMIT_DRAW_IP": "3/1m", "SECKILL_TRUSTED_PROXIES": "none",
	})
	id := drawnVoucher(t, o.base, 7)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", o.base, id)
	ask := func(from, url, tok string) (int, http.Header) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := clientFrom(t, from).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	tok := token(t, 7, auth.RoleUser)
	for i, step := range []struct {
		from, url, tok string
		want           int
	}{
		{"127.0.0.2", draw, "", 200},
		{"127.0.0.2", draw + "/entries", "", 200},
		{"127.0.0.2", draw + "/me", tok, 200},
		{"127.0.0.2", draw, "", 429},
		{"127.0.0.2", draw + "/entries", "", 429},
		{"127.0.0.2", draw + "/me", "", 429}, // before the token
		{"127.0.0.3", draw, "", 200},
		{"127.0.0.3", draw + "/me", tok, 200},
	} {
		st, h := ask(step.from, step.url, step.tok)
		if st != step.want {
			t.Errorf("step %d: %s from %s answered %d, want %d", i, step.url, step.from, st, step.want)
		}
		if st == 429 && h.Get("Retry-After") == "" {
			t.Errorf("step %d: 429 without Retry-After", i)
		}
	}
}

// TestReadyzWhileDatabaseBusy: an API instance stays ready while its
// database is busy serving pages, and says so. With draw_entries locked
// (a database stalled under the pages' reads), 60 visitors of a done
// draw's list hold at most 8 of the pool's 32 connections (the rest
// answered 503 busy), and the voucher's own route still reads the
// database at once. With orders locked instead and 60 buyers reading
// their orders, the pool is exhausted: the readiness probe, on a
// connection of its own, still finds the database up, and /readyz
// answers 200.
func TestReadyzWhileDatabaseBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The instance's reads wait for the locks below for a minute (the
	// test DSN's 10 s would let them go while the probe is checked).
	dsn := strings.Replace(testenv.MySQLDSN(t), "lock_wait_timeout=10", "lock_wait_timeout=60", 1)
	o := startObserved(t, map[string]string{"SECKILL_MYSQL_DSN": dsn, "SECKILL_ROLE": "api"})
	id := drawnVoucher(t, o.base, 7, 8, 9)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", o.base, id)

	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lock, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
				t.Error(err)
			}
		}
	}
	defer unlock()
	inUse := func() (float64, float64) {
		_, mfs := scrape(t, o.admin+"/metrics")
		n, _ := sample(mfs, "go_sql_in_use_connections")
		w, _ := sample(mfs, "go_sql_wait_count_total")
		return n, w
	}
	// The probe's checks, as its metrics say (the admin listener's
	// /admin/readyz takes an admin token, whose version is read from the
	// database through the pool).
	checks := func() map[string]float64 {
		_, mfs := scrape(t, o.admin+"/metrics")
		out := map[string]float64{}
		for _, c := range []string{"redis", "shards", "database", "migrations"} {
			out[c], _ = sample(mfs, "seckill_ready_check", "check", c)
		}
		return out
	}

	// The pages alone, on a stalled table.
	if _, err := lock.ExecContext(ctx, "LOCK TABLES draw_entries WRITE"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var busy, served atomic.Int64
	for i := range 60 {
		wg.Go(func() {
			st, _ := call(t, "GET", fmt.Sprintf("%s/entries?after=%d&limit=1", draw, i), "", nil)
			switch st {
			case http.StatusServiceUnavailable:
				busy.Add(1)
			case http.StatusOK:
				served.Add(1)
			}
		})
	}
	most := 0.0
	testenv.WaitFor(t, 20*time.Second, "52 visitors answered busy", func() bool {
		n, _ := inUse()
		most = max(most, n)
		return busy.Load() >= 52
	})
	start := time.Now()
	if st, _ := call(t, "GET", fmt.Sprintf("%s/api/v1/vouchers/%d", o.base, id), "", nil); st != 200 || time.Since(start) > time.Second {
		t.Errorf("the voucher's route answered %d in %v while the pages waited, want 200 at once", st, time.Since(start))
	}
	// The instance's own loops (the drawer, the database watcher) may
	// hold one or two meanwhile.
	if n, _ := inUse(); max(most, n) > 8+2 {
		t.Errorf("the draw's pages held %.0f of the pool's connections, want at most 8", max(most, n))
	}
	if st, body := get(t, o.base+"/readyz", ""); st != 200 {
		t.Errorf("/readyz while the pages waited: %d %s", st, body)
	}

	// Then every connection of the pool taken: the pages let go (their
	// reads done), orders locked instead, and 60 buyers reading theirs.
	if _, err := lock.ExecContext(ctx, "LOCK TABLES orders WRITE"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if served.Load() != 60-busy.Load() {
		t.Errorf("pages: %d served and %d answered 503 of 60", served.Load(), busy.Load())
	}
	for u := range 60 {
		wg.Go(func() { call(t, "GET", o.base+"/api/v1/users/me/orders", token(t, int64(100+u), auth.RoleUser), nil) })
	}
	var full time.Time
	testenv.WaitFor(t, 20*time.Second, "the pool exhausted", func() bool {
		if n, w := inUse(); n >= 32 && w > 0 {
			full = time.Now()
			return true
		}
		return false
	})
	// A probe made after it: /readyz probes again once the last probe
	// is older than readyFor.
	testenv.WaitFor(t, 10*time.Second, "a probe made while the pool is exhausted", func() bool {
		if st, body := get(t, o.base+"/readyz", ""); st != 200 {
			t.Fatalf("/readyz with the pool exhausted: %d %s", st, body)
		}
		return time.Since(full) > 2*readyFor
	})
	if n, _ := inUse(); n < 32 {
		t.Fatalf("the pool was let go of before the probe (%.0f in use): the test proves nothing", n)
	}
	if c := checks(); c["database"] != 1 || c["migrations"] != 1 || c["redis"] != 1 {
		t.Errorf("with the pool exhausted the probe found %v; want the database up on the probe's own connection", c)
	}
	if st, body := get(t, o.base+"/readyz", ""); st != 200 {
		t.Errorf("/readyz with the pool exhausted: %d %s", st, body)
	}
	unlock()
	wg.Wait()
	if st, body := call(t, "GET", draw+"/entries?after=0", "", nil); st != 200 {
		t.Errorf("a page once the tables are let go: %d %v", st, body)
	}
	t.Logf("pages: %d served, %d answered 503; at most %.0f connections held by the pages", served.Load(), busy.Load(), most)
}

// TestReadyzAPIWithoutDatabase: an instance that serves the API stays
// ready while its database does not answer (paused): its purchases need
// Redis only, and a database down is every instance's, so readiness
// would take them all out of rotation and stop the sale for nothing. The
// probe says the database is down and its schema unknown, on the admin
// listener and in seckill_ready_check. A worker-only instance, which
// writes with the database, is not ready meanwhile.
func TestReadyzAPIWithoutDatabase(t *testing.T) {
	t.Parallel()
	m := testenv.StartMariaDB(t)
	dsn := m.CreateDatabase(t)
	rdb := testenv.RedisURL(t)
	prefix := testenv.Prefix(t)
	shared := map[string]string{"SECKILL_MYSQL_DSN": dsn, "SECKILL_REDIS_URL": rdb, "SECKILL_KEY_PREFIX": prefix}
	api := startObserved(t, with(shared, "SECKILL_ROLE", "api"))
	worker := startObserved(t, with(shared, "SECKILL_ROLE", "worker"))
	vid := createVoucher(t, api.base, 10)
	for _, o := range []observed{api, worker} {
		if st, body := get(t, o.base+"/readyz", ""); st != 200 {
			t.Fatalf("/readyz before: %d %s", st, body)
		}
	}

	m.Pause(t)
	defer m.Resume(t)
	// (The admin listener's /admin/readyz takes an admin token, whose
	// version is read from the database: the metrics say it meanwhile.)
	checks := func() (database, migrations float64) {
		_, mfs := scrape(t, api.admin+"/metrics")
		database, _ = sample(mfs, "seckill_ready_check", "check", "database")
		migrations, _ = sample(mfs, "seckill_ready_check", "check", "migrations")
		return database, migrations
	}
	testenv.WaitFor(t, 20*time.Second, "the probes to find the database down", func() bool {
		if st, body := get(t, api.base+"/readyz", ""); st != 200 || body != `{"ready":true}` {
			t.Fatalf("the API's /readyz with its database paused: %d %s, want ready", st, body)
		}
		database, migrations := checks()
		return database == 0 && migrations == 0
	})
	if st, body := call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", api.base, vid), token(t, 5, auth.RoleUser), nil); st != http.StatusAccepted {
		t.Errorf("a purchase with the database paused: %d %v, want 202", st, body)
	}
	testenv.WaitFor(t, 20*time.Second, "the worker's /readyz to answer 503", func() bool {
		st, _ := get(t, worker.base+"/readyz", "")
		return st == http.StatusServiceUnavailable
	})
	m.Resume(t)
	testenv.WaitFor(t, 30*time.Second, "the worker ready again", func() bool {
		st, _ := get(t, worker.base+"/readyz", "")
		return st == 200
	})
}

// with is env and one more setting.
func with(env map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for k, v := range env {
		out[k] = v
	}
	return out
}
