package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// observed is one run() of the whole program on the shared real Redis and
// a fresh MariaDB database, with its stdout kept and its admin listener on
// a free port.
type observed struct {
	base, admin string
	logs        func() string
}

// startObserved runs the service with env over these defaults and waits
// for /healthz; cleanup stops it and checks it exited cleanly.
func startObserved(t testing.TB, env map[string]string) observed {
	t.Helper()
	def := map[string]string{
		"SECKILL_REDIS_URL":        testenv.RedisURL(t),
		"SECKILL_KEY_PREFIX":       testenv.Prefix(t),
		"SECKILL_TOKEN_SECRET":     testSecret,
		"SECKILL_LOG_LEVEL":        "info",
		"SECKILL_WORKER_BLOCK":     "100ms",
		"SECKILL_METRICS_INTERVAL": "50ms",
		"SECKILL_RATE_LIMIT":       "off",
		"SECKILL_DATA_DIR":         t.TempDir(),
		"SECKILL_ADDR":             freeAddr(t),
		"SECKILL_ADMIN_ADDR":       freeAddr(t),
	}
	for k, v := range env {
		def[k] = v
	}
	if def["SECKILL_MYSQL_DSN"] == "" {
		def["SECKILL_MYSQL_DSN"] = testenv.MySQLDSN(t)
	}
	o := observed{base: "http://" + def["SECKILL_ADDR"], admin: "http://" + def["SECKILL_ADMIN_ADDR"]}

	o.logs = runService(t, def)
	return o
}

// scrape reads url in Prometheus's text format.
func scrape(t testing.TB, url string, hdr ...string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return resp.StatusCode, mfs
}

// sample is the value of the series of name with the given label pairs,
// summed over the other labels; histograms give their count. ok is false
// when no such series exists.
func sample(mfs map[string]*dto.MetricFamily, name string, labels ...string) (sum float64, ok bool) {
	mf := mfs[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, s := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, l := range s.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		ok = true
		switch {
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Histogram != nil:
			sum += float64(s.Histogram.GetSampleCount())
		}
	}
	return sum, ok
}

// TestMetricsAfterBurst: a burst of purchases with every kind of answer,
// then the counters on /metrics say exactly what happened, the worker's
// counters match once it drained, and the queue gauges fall to zero.
func TestMetricsAfterBurst(t *testing.T) {
	t.Parallel()
	o := startObserved(t, nil)
	const stock, buyers, repeaters, bad, unknown = 20, 60, 15, 7, 3
	vid := createVoucher(t, o.base, stock)

	type press struct{ url, tok string }
	var presses []press
	for i := range buyers {
		tok := token(t, int64(50_000+i), auth.RoleUser)
		url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", o.base, vid)
		presses = append(presses, press{url, tok})
		if i < repeaters {
			presses = append(presses, press{url, tok})
		}
	}
	for i := range bad {
		presses = append(presses, press{o.base + "/api/v1/vouchers/not-a-number/orders", token(t, int64(60_000+i), auth.RoleUser)})
	}
	for i := range unknown {
		presses = append(presses, press{fmt.Sprintf("%s/api/v1/vouchers/%d/orders", o.base, 900_000_000+i), token(t, int64(61_000+i), auth.RoleUser)})
	}
	var mu sync.Mutex
	codes := map[string]int{}  // outcome -> answers
	status := map[string]int{} // HTTP status -> answers
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range presses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			st, body := call(t, "POST", p.url, p.tok, nil)
			code, _ := body["code"].(string)
			if st == http.StatusAccepted {
				code = "accepted"
			}
			mu.Lock()
			codes[code]++
			status[fmt.Sprint(st)]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if codes["accepted"] != stock || codes["bad_request"] != bad || codes["voucher_not_found"] != unknown ||
		codes["sold_out"]+codes["already_purchased"] != buyers+repeaters-stock {
		t.Fatalf("answers %v", codes)
	}

	// Drained: every accepted order written and acknowledged, and the
	// sampler saw the stream empty.
	var mfs map[string]*dto.MetricFamily
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, mfs = scrape(t, o.base+"/metrics")
		written, _ := sample(mfs, "seckill_orders_written_total")
		acked, _ := sample(mfs, "seckill_worker_messages_total", "outcome", "ack")
		length, _ := sample(mfs, "seckill_stream_length", "shard", "0")
		pending, _ := sample(mfs, "seckill_stream_pending", "shard", "0")
		lag, okLag := sample(mfs, "seckill_stream_lag", "shard", "0")
		if written == stock && acked == stock && okLag && length == 0 && pending == 0 && lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained within 15s: written %v acked %v length %v pending %v lag %v", written, acked, length, pending, lag)
		}
		time.Sleep(20 * time.Millisecond)
	}

	want := map[string]float64{}
	total := 0
	for code, n := range codes {
		want[code] = float64(n)
		total += n
	}
	for _, outcome := range []string{"accepted", "sold_out", "already_purchased", "bad_request", "voucher_not_found", "not_started", "ended", "not_ready", "unavailable"} {
		if got, _ := sample(mfs, "seckill_purchases_total", "outcome", outcome); got != want[outcome] {
			t.Errorf("seckill_purchases_total{outcome=%q} = %v, want %v", outcome, got, want[outcome])
		}
	}
	const route = "/api/v1/vouchers/:id/orders"
	for st, n := range status {
		if got, _ := sample(mfs, "seckill_http_requests_total", "route", route, "method", "POST", "status", st); got != float64(n) {
			t.Errorf("seckill_http_requests_total{route=%q,status=%s} = %v, want %d", route, st, got, n)
		}
	}
	// Refusals the instance answered from what Redis told it lately never
	// reach Redis either.
	local, _ := sample(mfs, "seckill_purchases_answered_locally_total")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"seckill_purchase_duration_seconds", nil, float64(total)},
		{"seckill_purchase_script_duration_seconds", nil, float64(total-bad) - local}, // a bad id never reaches Redis
		{"seckill_http_request_duration_seconds", []string{"route", route}, float64(total)},
		{"seckill_http_requests_total", []string{"route", "/api/v1/vouchers", "method", "POST", "status", "201"}, 1},
		{"seckill_orders_written_total", nil, stock},
		{"seckill_worker_messages_total", []string{"outcome", "ack"}, stock},
		{"seckill_worker_messages_total", []string{"outcome", "retry"}, 0},
		{"seckill_dead_letters_total", nil, 0},
		{"seckill_reclaimed_entries_total", nil, 0},
		{"seckill_redis_errors_total", nil, 0},
		{"seckill_mysql_errors_total", nil, 0},
		{"seckill_delay_queue_size", []string{"shard", "0"}, 0},
	} {
		if got, _ := sample(mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n, _ := sample(mfs, "seckill_worker_batch_size"); n < 1 {
		t.Errorf("no batch observed")
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "go_sql_open_connections", "seckill_redis_pool_connections"} {
		if _, ok := sample(mfs, name); !ok {
			t.Errorf("%s not exported", name)
		}
	}

	// Not through nginx; on the admin listener too.
	if st, _ := scrape(t, o.base+"/metrics", "X-Forwarded-For", "203.0.113.7"); st != http.StatusNotFound {
		t.Errorf("/metrics through a proxy answered %d, want 404", st)
	}
	if st, amfs := scrape(t, o.admin+"/metrics"); st != 200 || amfs["seckill_purchases_total"] == nil {
		t.Errorf("admin /metrics answered %d", st)
	}
}

// TestLogsHoldNoSecrets runs a service whose DSN has a password, logs in
// with a phone code, buys and looks around with the token, sends junk
// request ids, and then finds none of the secrets in any line it wrote.
func TestLogsHoldNoSecrets(t *testing.T) {
	t.Parallel()
	dsn, password := passwordDSN(t)
	outbox := t.TempDir() + "/outbox"
	o := startObserved(t, map[string]string{
		"SECKILL_MYSQL_DSN":    dsn,
		"SECKILL_LOG_LEVEL":    "debug",
		"SECKILL_LOGIN_SENDER": "file",
		"SECKILL_LOGIN_OUTBOX": outbox,
		"SECKILL_ADMIN_PHONES": "+8613800138000",
	})
	phone := "+8613800138000"
	if st, body := call(t, "POST", o.base+"/api/v1/auth/code", "", map[string]any{"phone": phone}); st != http.StatusAccepted {
		t.Fatalf("ask for a code: %d %v", st, body)
	}
	code := lastOutboxCode(t, outbox, phone)
	// A wrong code first: its answer is logged too.
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	if st, _ := call(t, "POST", o.base+"/api/v1/auth/login", "", map[string]any{"phone": phone, "code": wrong}); st != http.StatusUnauthorized {
		t.Fatalf("wrong code answered %d", st)
	}
	st, body := call(t, "POST", o.base+"/api/v1/auth/login", "", map[string]any{"phone": phone, "code": code})
	tok, _ := body["token"].(string)
	if st != http.StatusOK || tok == "" {
		t.Fatalf("login: %d %v", st, body)
	}
	vid := createVoucher(t, o.base, 5)
	st, body = call(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", o.base, vid), tok, nil)
	if st != http.StatusAccepted {
		t.Fatalf("purchase: %d %v", st, body)
	}
	call(t, "GET", fmt.Sprintf("%s/api/v1/orders/%s", o.base, body["order_id"]), tok, nil)
	call(t, "GET", o.base+"/api/v1/users/me/orders", tok, nil)
	// A forged token, a token in a query string, and a request id that
	// tries to smuggle one into the log.
	forged := tok[:len(tok)-4] + "AAAA"
	call(t, "GET", o.base+"/api/v1/users/me/orders", forged, nil)
	call(t, "GET", o.base+"/api/v1/users/me/orders?access_token="+tok, "", nil)
	req, _ := http.NewRequest("GET", o.base+"/healthz", nil)
	req.Header.Set("X-Request-ID", "Bearer "+tok[:40])
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		if rid := resp.Header.Get("X-Request-ID"); strings.Contains(rid, " ") || rid == "" {
			t.Errorf("request id %q taken from a junk header", rid)
		}
	}
	// The admin listener with the admin token from the login.
	call(t, "GET", o.admin+"/admin/dlq", tok, nil)

	logs := o.logs()
	if !strings.Contains(logs, `"msg":"request"`) || !strings.Contains(logs, `"route":"/api/v1/auth/login"`) {
		t.Fatalf("no access log lines captured:\n%s", logs)
	}
	for what, secret := range map[string]*regexp.Regexp{
		"bearer token":    regexp.MustCompile(regexp.QuoteMeta(tok)),
		"forged token":    regexp.MustCompile(regexp.QuoteMeta(forged)),
		"token signature": regexp.MustCompile(regexp.QuoteMeta(tok[strings.LastIndex(tok, ".")+1:])),
		"token secret":    regexp.MustCompile(regexp.QuoteMeta(testSecret)),
		"dsn password":    regexp.MustCompile(regexp.QuoteMeta(password)),
		"phone number":    regexp.MustCompile(regexp.QuoteMeta(phone)),
		// Six digits on their own: inside a longer number (a time, an id)
		// or a hex request id they are not the code.
		"login code": regexp.MustCompile(`(^|[^0-9a-f])` + code + `([^0-9a-f]|$)`),
		"wrong code": regexp.MustCompile(`(^|[^0-9a-f])` + wrong + `([^0-9a-f]|$)`),
	} {
		for line := range strings.Lines(logs) {
			if secret.MatchString(line) {
				t.Errorf("a log line holds the %s: %s", what, line)
			}
		}
	}
}

// lastOutboxCode reads the newest code sent to phone from the outbox.
func lastOutboxCode(t testing.TB, outbox, phone string) string {
	t.Helper()
	var code string
	testenv.WaitFor(t, 5*time.Second, "a login code for "+phone+" in the outbox", func() bool {
		f, err := openFile(outbox)
		if err != nil {
			return false
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if _, c, ok := strings.Cut(sc.Text(), "to "+phone+": your seckill login code is "); ok {
				code = strings.TrimSpace(c)
			}
		}
		return code != ""
	})
	return code
}

func openFile(path string) (*os.File, error) { return os.Open(path) }

// passwordDSN makes a database user with a random password on the test's
// fresh database and returns a DSN that logs in as that user.
func passwordDSN(t testing.TB) (dsn, password string) {
	t.Helper()
	base := testenv.MySQLDSN(t)
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatal(err)
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	user, password := "u"+hex.EncodeToString(b[:5]), "pw-"+hex.EncodeToString(b[:])
	db, err := sql.Open("mysql", base)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, q := range []string{
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, password),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'%%'", cfg.DBName, user),
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("make a database user: %v", err)
		}
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", base)
		if err != nil {
			t.Error(err)
			return
		}
		defer db.Close()
		if _, err := db.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user)); err != nil {
			t.Error(err)
		}
	})
	cfg.User, cfg.Passwd = user, password
	return cfg.FormatDSN(), password
}

// TestAccessLog: one JSON line per request with the request id nginx sent
// (or a new one), returned to the client, and the route template, status,
// latency and user.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	o := startObserved(t, nil)
	tok := token(t, 4242, auth.RoleUser)
	req, _ := http.NewRequest("GET", o.base+"/api/v1/orders/12345", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("X-Request-ID", "nginx-req:42.a_b")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-ID"); got != "nginx-req:42.a_b" {
		t.Errorf("request id answered %q, want nginx's", got)
	}
	resp, err = client.Get(o.base + "/api/v1/vouchers?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	made := resp.Header.Get("X-Request-ID")
	if len(made) < 16 {
		t.Errorf("generated request id %q", made)
	}

	lines := map[string]map[string]any{} // request id -> access log line
	testenv.WaitFor(t, 5*time.Second, "access log lines of the given and the generated request ids", func() bool {
		for line := range strings.Lines(o.logs()) {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "request" {
				if id, _ := rec["request_id"].(string); id != "" {
					lines[id] = rec
				}
			}
		}
		return lines["nginx-req:42.a_b"] != nil && lines[made] != nil
	})
	got := lines["nginx-req:42.a_b"]
	if got["route"] != "/api/v1/orders/:id" || got["method"] != "GET" || got["status"] != float64(404) || got["user_id"] != float64(4242) {
		t.Errorf("access log line %v", got)
	}
	if _, ok := got["latency_ms"].(float64); !ok {
		t.Errorf("access log line without latency_ms: %v", got)
	}
	if got := lines[made]; got["route"] != "/api/v1/vouchers" || got["status"] != float64(200) || got["user_id"] != float64(0) {
		t.Errorf("access log line %v", got)
	}
}
