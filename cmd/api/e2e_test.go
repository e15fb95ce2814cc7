package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const testSecret = "e2e-secret-e2e-secret-e2e-secret-0123"

// service is one running instance of run().
type service struct {
	base string
}

// startService runs the whole program with env (and the test defaults
// below) on a free port and waits for /healthz.
func startService(t testing.TB, env map[string]string) service {
	t.Helper()
	addr := freeAddr(t)
	env["SECKILL_ADDR"] = addr
	env["SECKILL_TOKEN_SECRET"] = testSecret
	env["SECKILL_LOG_LEVEL"] = "warn"
	env["SECKILL_WORKER_BLOCK"] = "100ms"
	if _, ok := env["SECKILL_ADMIN_ADDR"]; !ok {
		env["SECKILL_ADMIN_ADDR"] = "off" // no fixed port shared by parallel tests
	}
	runService(t, env)
	return service{base: "http://" + addr}
}

// runService runs the whole program with exactly env, as main does, and
// waits for /healthz on SECKILL_ADDR. Cleanup stops it like SIGTERM does
// and checks it exited cleanly; on failure the service's log is shown.
// It returns the log so far.
func runService(t testing.TB, env map[string]string) (logs func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out testenv.Buffer
	logs = out.String
	go func() {
		done <- run(ctx, []string{"api"}, func(k string) string { return env[k] }, &out, &out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("service exited with %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("service did not stop within 30s")
		}
		if t.Failed() {
			t.Logf("service log:\n%s", logs())
		}
	})
	base := "http://" + env["SECKILL_ADDR"]
	testenv.WaitFor(t, 30*time.Second, "the service answering 200 on /healthz", func() bool {
		select {
		case err := <-done:
			t.Fatalf("service exited at start: %v\n%s", err, logs())
		default:
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return logs
}

func freeAddr(t testing.TB) string { return "127.0.0.1:" + testenv.FreePort(t) }

func token(t testing.TB, user int64, role string) string {
	t.Helper()
	s, err := auth.NewSigner([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Mint(auth.Identity{UserID: user, Role: role}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

var client = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 2000, MaxIdleConnsPerHost: 2000, MaxConnsPerHost: 0},
}

// call sends a request and decodes the JSON answer into a map.
func call(t testing.TB, method, url, tok string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, url, err)
		return 0, nil
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Errorf("%s %s: status %d, body not JSON: %v", method, url, resp.StatusCode, err)
	}
	return resp.StatusCode, out
}

func createVoucher(t testing.TB, base string, stock int) int64 {
	t.Helper()
	status, body := call(t, "POST", base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "flash", "face_value": 500, "stock": stock,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if status != http.StatusCreated || body["redis_ready"] != true {
		t.Fatalf("create voucher: %d %v", status, body)
	}
	return int64(body["voucher"].(map[string]any)["id"].(float64))
}

type sale struct {
	accepted map[int64]int64 // order id -> user
	refused  []int64         // users who only got refusals
	codes    map[string]int
}

// stampede releases every buyer at once; repeaters press twice. Buyer i
// goes to bases[i % len(bases)].
func stampede(t testing.TB, bases []string, voucherID int64, buyers, repeaters int) sale {
	t.Helper()
	type result struct {
		user   int64
		status int
		code   string
		order  int64
	}
	tokens := make([]string, buyers)
	for i := range tokens {
		tokens[i] = token(t, int64(10_000+i), auth.RoleUser)
	}
	results := make(chan result, buyers+repeaters)
	start := make(chan struct{})
	var wg sync.WaitGroup
	press := func(i int) {
		defer wg.Done()
		<-start
		url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", bases[i%len(bases)], voucherID)
		status, body := call(t, "POST", url, tokens[i], nil)
		r := result{user: int64(10_000 + i), status: status}
		r.code, _ = body["code"].(string)
		if s, ok := body["order_id"].(string); ok {
			r.order, _ = strconv.ParseInt(s, 10, 64)
		}
		results <- r
	}
	for i := range buyers {
		wg.Add(1)
		go press(i)
		if i < repeaters {
			wg.Add(1)
			go press(i)
		}
	}
	close(start)
	wg.Wait()
	close(results)

	s := sale{accepted: map[int64]int64{}, codes: map[string]int{}}
	won := map[int64]bool{}
	var all []result
	for r := range results {
		all = append(all, r)
		switch {
		case r.status == http.StatusAccepted:
			s.codes["accepted"]++
			if prev, dup := s.accepted[r.order]; dup {
				t.Errorf("order id %d accepted twice (users %d and %d)", r.order, prev, r.user)
			}
			if won[r.user] {
				t.Errorf("user %d accepted twice", r.user)
			}
			s.accepted[r.order], won[r.user] = r.user, true
		case r.status == http.StatusConflict && (r.code == "sold_out" || r.code == "already_purchased"):
			s.codes[r.code]++
		default:
			t.Errorf("user %d: unexpected answer %d %q", r.user, r.status, r.code)
		}
	}
	for _, r := range all {
		if !won[r.user] {
			s.refused = append(s.refused, r.user)
		}
	}
	return s
}

// drainAndVerify waits until every invariant holds, and fails with the last
// report when they do not within the deadline.
func drainAndVerify(t testing.TB, g *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, voucherID int64, s sale) verify.Report {
	t.Helper()
	var rep verify.Report
	deadline := time.Now().Add(60 * time.Second)
	for {
		var err error
		rep, err = verify.Check(context.Background(), g, rdb, keys, verify.Input{
			VoucherID: voucherID, Accepted: s.accepted, Refused: s.refused, Group: orderGroup,
		})
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() && rep.DeadLetters == 0 {
			return rep
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline did not drain to a consistent state:\n%s", rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFlashSale: stock 100, 1,000 distinct buyers released at once, 200 of
// them pressing twice, through two instances on the same Redis and MySQL
// (so order ids from two id workers meet too).
func TestFlashSale(t *testing.T) {
	t.Parallel()
	prefix := testenv.Prefix(t)
	env := func() map[string]string {
		return map[string]string{
			"SECKILL_REDIS_URL": testenv.RedisURL(t), "SECKILL_MYSQL_DSN": dsn(t), "SECKILL_KEY_PREFIX": prefix,
		}
	}
	e1 := env()
	a := startService(t, e1)
	e2 := env()
	e2["SECKILL_MYSQL_DSN"] = e1["SECKILL_MYSQL_DSN"]
	b := startService(t, e2)

	const stock, buyers, repeaters = 100, 1000, 200
	vid := createVoucher(t, a.base, stock)
	s := stampede(t, []string{a.base, b.base}, vid, buyers, repeaters)
	if len(s.accepted) != stock {
		t.Fatalf("%d accepted, want %d; answers %v", len(s.accepted), stock, s.codes)
	}
	if s.codes["sold_out"]+s.codes["already_purchased"] != buyers+repeaters-stock {
		t.Fatalf("answers %v", s.codes)
	}

	g, err := db.OpenMySQL(e1["SECKILL_MYSQL_DSN"], 4)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	rep := drainAndVerify(t, g, testenv.Redis(t), voucher.NewKeys(prefix, 1), vid, s)
	if rep.Orders != stock || rep.RedisStock != 0 || rep.DBStock != 0 {
		t.Fatalf("after drain: %s", rep)
	}
	t.Logf("answers %v; %s", s.codes, rep)

	// Every accepted order of a free voucher reads as paid, for its owner only.
	for id, user := range s.accepted {
		status, body := call(t, "GET", fmt.Sprintf("%s/api/v1/orders/%d", b.base, id), token(t, user, auth.RoleUser), nil)
		if status != 200 || body["status"] != "paid" {
			t.Fatalf("order %d: %d %v", id, status, body)
		}
		if status, _ := call(t, "GET", fmt.Sprintf("%s/api/v1/orders/%d", a.base, id), token(t, user+1_000_000, auth.RoleUser), nil); status != 404 {
			t.Fatalf("another user read order %d: status %d", id, status)
		}
	}
}

// dsn returns a fresh database on the shared MySQL.
func dsn(t testing.TB) string { return testenv.MySQLDSN(t) }

// TestFlashSaleEmbedded runs the same sale on the embedded default: the
// in-process Redis and an SQLite file.
func TestFlashSaleEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	redisAddr := freeAddr(t)
	svc := startService(t, map[string]string{"SECKILL_DATA_DIR": dir, "SECKILL_EMBEDDED_REDIS_ADDR": redisAddr})

	const stock, buyers, repeaters = 100, 1000, 200
	vid := createVoucher(t, svc.base, stock)
	s := stampede(t, []string{svc.base}, vid, buyers, repeaters)
	if len(s.accepted) != stock {
		t.Fatalf("%d accepted, want %d; answers %v", len(s.accepted), stock, s.codes)
	}
	g, err := db.OpenSQLite(filepath.Join(dir, "seckill.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	rep := drainAndVerify(t, g, rdb, voucher.NewKeys("", 1), vid, s)
	if rep.Orders != stock || rep.RedisStock != 0 {
		t.Fatalf("after drain: %s", rep)
	}
}
