package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// get answers a GET with an optional bearer token: status and body.
func get(t testing.TB, url, tok string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWorkerServesProbes: an instance with SECKILL_ROLE=worker answers
// /healthz, /readyz (Redis, database, schema) and /metrics on SECKILL_ADDR,
// and nothing else there: no API, no profiles.
func TestWorkerServesProbes(t *testing.T) {
	t.Parallel()
	o := startObserved(t, map[string]string{"SECKILL_ROLE": "worker"})

	if st, body := get(t, o.base+"/healthz", ""); st != 200 {
		t.Errorf("/healthz answered %d %s", st, body)
	}
	if st, body := get(t, o.base+"/readyz", ""); st != 200 || body != `{"ready":true}` {
		t.Errorf("/readyz answered %d %s", st, body)
	}
	st, body := get(t, o.admin+"/admin/readyz", token(t, 1, auth.RoleAdmin))
	if st != 200 || !strings.Contains(body, `"redis":"up"`) || !strings.Contains(body, `"database":"up"`) || !strings.Contains(body, `"migrations":"current"`) {
		t.Errorf("/admin/readyz answered %d %s", st, body)
	}
	if st, mfs := scrape(t, o.base+"/metrics"); st != 200 || mfs["seckill_http_requests_total"] == nil || mfs["go_goroutines"] == nil {
		t.Errorf("/metrics answered %d with %d families", st, len(mfs))
	}
	// /metrics refuses what came through a proxy, as on the API.
	if st, _ := scrape(t, o.base+"/metrics", "X-Forwarded-For", "198.51.100.1"); st != 404 {
		t.Errorf("/metrics through a proxy answered %d, want 404", st)
	}
	admin := token(t, 1, auth.RoleAdmin)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/api/v1/vouchers", "/admin/dlq", "/"} {
		if st, _ := get(t, o.base+path, admin); st != 404 {
			t.Errorf("worker's main listener answered %s with %d, want 404", path, st)
		}
	}
}

// TestPprofNeedsAdminToken: the admin listener's profiles answer only an
// admin token, like its operator routes.
func TestPprofNeedsAdminToken(t *testing.T) {
	t.Parallel()
	o := startObserved(t, map[string]string{"SECKILL_ROLE": "worker"})
	admin, user := token(t, 1, auth.RoleAdmin), token(t, 2, auth.RoleUser)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1", "/debug/pprof/symbol"} {
		if st, body := get(t, o.admin+path, ""); st != 401 || strings.Contains(body, "seckill") {
			t.Errorf("%s without a token answered %d", path, st)
		}
		if st, _ := get(t, o.admin+path, user); st != 403 {
			t.Errorf("%s with a user token answered %d, want 403", path, st)
		}
		if st, _ := get(t, o.admin+path, admin); st != 200 {
			t.Errorf("%s with an admin token answered %d, want 200", path, st)
		}
	}
	// Scraping the admin listener needs no token and shows no profile.
	if st, mfs := scrape(t, o.admin+"/metrics"); st != 200 || mfs["go_goroutines"] == nil {
		t.Errorf("admin /metrics answered %d", st)
	}
}

// TestWorkerReadyzFollowsRedis: a worker-only instance whose Redis stops
// answering is live but not ready, says which check failed, and is ready
// again once Redis answers.
func TestWorkerReadyzFollowsRedis(t *testing.T) {
	t.Parallel()
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	o := startObserved(t, map[string]string{"SECKILL_ROLE": "worker", "SECKILL_REDIS_URL": rs.URL()})
	ready := func() (int, string) { return get(t, o.base+"/readyz", "") }
	if st, body := ready(); st != 200 {
		t.Fatalf("/readyz answered %d %s", st, body)
	}
	rs.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			rs.Resume(t)
		}
	}()
	testenv.WaitFor(t, 20*time.Second, "readyz says not ready", func() bool {
		st, _ := ready()
		return st == 503
	})
	// The public answer names nothing; the admin listener names the master.
	if st, body := ready(); st != 503 || body != `{"ready":false}` {
		t.Errorf("public /readyz with Redis paused answered %d %s, want only {\"ready\":false}", st, body)
	}
	st, body := get(t, o.admin+"/admin/readyz", token(t, 1, auth.RoleAdmin))
	if st != 503 || !strings.Contains(body, `"redis":"down"`) || !strings.Contains(body, `"database":"up"`) || !strings.Contains(body, rs.Addr) {
		t.Errorf("/admin/readyz with Redis paused answered %d %s, want redis down naming %s", st, body, rs.Addr)
	}
	if st, _ := get(t, o.base+"/healthz", ""); st != 200 {
		t.Errorf("/healthz answered %d while Redis is paused, want 200 (live)", st)
	}
	rs.Resume(t)
	resumed = true
	testenv.WaitFor(t, 20*time.Second, "readyz is ready again", func() bool {
		st, _ := ready()
		return st == 200
	})
}

// runUntil runs the whole program with env and returns its error; it fails
// the test if the program is still running after within (it is then
// stopped).
func runUntil(t testing.TB, env map[string]string, within time.Duration) (logs string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testenv.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"api"}, func(k string) string { return env[k] }, &out, &out) }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(within):
		cancel()
		<-done
		t.Fatalf("the service still runs after %v; log:\n%s", within, out.String())
		return "", nil
	}
}

// taken returns an address some other socket holds for the test.
func taken(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

// TestListenerTakenStopsStart: an address set in SECKILL_ADDR or
// SECKILL_ADMIN_ADDR that cannot be bound stops start-up with an error that
// names the setting; nothing is served.
func TestListenerTakenStopsStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, role, setting string
	}{
		{"admin", "all", "SECKILL_ADMIN_ADDR"},
		{"admin of a worker", "worker", "SECKILL_ADMIN_ADDR"},
		{"api", "api", "SECKILL_ADDR"},
		{"worker probes", "worker", "SECKILL_ADDR"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{
				"SECKILL_REDIS_URL":    testenv.RedisURL(t),
				"SECKILL_MYSQL_DSN":    testenv.MySQLDSN(t),
				"SECKILL_KEY_PREFIX":   testenv.Prefix(t),
				"SECKILL_TOKEN_SECRET": testSecret,
				"SECKILL_ROLE":         c.role,
				"SECKILL_ADDR":         freeAddr(t),
				"SECKILL_ADMIN_ADDR":   freeAddr(t),
			}
			env[c.setting] = taken(t)
			logs, err := runUntil(t, env, 30*time.Second)
			if err == nil || !strings.Contains(err.Error(), c.setting+"="+env[c.setting]) {
				t.Fatalf("start-up with %s taken returned %v, want an error naming it; log:\n%s", c.setting, err, logs)
			}
			for _, s := range []string{"SECKILL_ADDR", "SECKILL_ADMIN_ADDR"} {
				if s == c.setting {
					continue
				}
				if conn, err := net.Dial("tcp", env[s]); err == nil {
					conn.Close()
					t.Errorf("%s %s still accepts connections after a failed start", s, env[s])
				}
			}
		})
	}
}

// TestListenDefaultTaken: a default address that is taken is logged and
// left out (the sale goes on), unless the API needs it.
func TestListenDefaultTaken(t *testing.T) {
	t.Parallel()
	addr := taken(t)
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))

	ls, err := listen(config{Role: "all", Addr: "127.0.0.1:0", AdminAddr: addr}, log)
	if err != nil || ls.main == nil || ls.admin != nil {
		t.Fatalf("default admin address taken: %+v %v, want the main listener only", ls, err)
	}
	ls.close()
	if !strings.Contains(out.String(), "admin listener not started") || !strings.Contains(out.String(), "SECKILL_ADMIN_ADDR") {
		t.Errorf("log does not say the admin listener was left out and what to set:\n%s", &out)
	}

	ls, err = listen(config{Role: "worker", Addr: addr, AdminAddr: "off"}, log)
	if err != nil || ls.main != nil || ls.admin != nil {
		t.Fatalf("a worker's default address taken: %+v %v, want no listener and no error", ls, err)
	}

	if _, err := listen(config{Role: "api", Addr: addr, AdminAddr: "off"}, log); err == nil {
		t.Error("the API's default address taken: no error")
	}
	if _, err := listen(config{Role: "all", Addr: "127.0.0.1:0", AdminAddr: addr, AdminAddrGiven: true}, log); err == nil {
		t.Error("a given admin address taken: no error")
	}
}

// missingDatabase returns SECKILL_MYSQL_DSN for a database that does not
// exist yet on the test server, and a check of whether it exists now; it is
// dropped on cleanup.
func missingDatabase(t testing.TB) (dsn string, exists func() bool) {
	t.Helper()
	dsn, admin, name := testenv.MissingMySQLDatabase(t, "_fresh")
	return dsn, func() bool {
		var n int
		if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
}

// TestServiceCreatesDatabase: the service started on a MySQL server where
// the DSN's database does not exist creates it and migrates it; "api
// migrate" does too. Operator commands, which only read, do not create it.
func TestServiceCreatesDatabase(t *testing.T) {
	t.Parallel()
	t.Run("serve", func(t *testing.T) {
		t.Parallel()
		dsn, exists := missingDatabase(t)
		o := startObserved(t, map[string]string{"SECKILL_MYSQL_DSN": dsn})
		if st, body := get(t, o.base+"/readyz", ""); st != 200 {
			t.Errorf("/readyz answered %d %s", st, body)
		}
		if !exists() {
			t.Error("the database does not exist")
		}
		if !strings.Contains(o.logs(), "token --user 1 --admin") {
			t.Error("the first start on a new database does not say how to mint an admin token")
		}
	})
	t.Run("migrate", func(t *testing.T) {
		t.Parallel()
		dsn, exists := missingDatabase(t)
		env := map[string]string{"SECKILL_REDIS_URL": testenv.RedisURL(t), "SECKILL_KEY_PREFIX": testenv.Prefix(t), "SECKILL_MYSQL_DSN": dsn}
		getenv := func(k string) string { return env[k] }

		var out bytes.Buffer
		err := run(context.Background(), []string{"api", "dlq", "list"}, getenv, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "Unknown database") || !strings.Contains(err.Error(), "api migrate") {
			t.Errorf("dlq list on a missing database: %v, want unknown database and how to create it", err)
		}
		if exists() {
			t.Fatal("dlq list created the database")
		}
		out.Reset()
		var stderr bytes.Buffer
		if err := run(context.Background(), []string{"api", "migrate"}, getenv, &out, &stderr); err != nil {
			t.Fatalf("migrate: %v\n%s%s", err, &out, &stderr)
		}
		// The result alone on stdout, as JSON; the advice on stderr.
		var result struct {
			Applied       []int `json:"applied"`
			SchemaVersion int   `json:"schema_version"`
		}
		if err := json.Unmarshal(out.Bytes(), &result); err != nil || result.SchemaVersion == 0 || len(result.Applied) == 0 {
			t.Errorf("migrate printed %q on stdout (%v), want JSON with the versions applied and the schema's", &out, err)
		}
		if !exists() || !strings.Contains(stderr.String(), "token --user 1 --admin") {
			t.Errorf("migrate printed %q on stderr (want how the first admin gets in); database exists: %v", &stderr, exists())
		}
		out.Reset()
		if err := run(context.Background(), []string{"api", "dlq", "list"}, getenv, &out, &out); err != nil {
			t.Errorf("dlq list on the created database: %v", err)
		}
	})
}
