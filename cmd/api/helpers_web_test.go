package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/fleet"
	"seckill/internal/testenv"
)

// webService is one run() of the whole program for the browser-facing
// tests, on the shared real Redis and a fresh MariaDB database, with its log
// kept for checks and the login codes written to an outbox file.
type webService struct {
	base   string
	prefix string // Redis key prefix
	dsn    string
	outbox string
	logs   func() string
}

// startWeb runs the service with env on top of these defaults and waits for
// /healthz; cleanup stops it and checks that it exited cleanly.
func startWeb(t testing.TB, env map[string]string) webService {
	t.Helper()
	dir := t.TempDir()
	s := webService{prefix: testenv.Prefix(t), outbox: filepath.Join(dir, "outbox")}
	def := map[string]string{
		"SECKILL_REDIS_URL":    testenv.RedisURL(t),
		"SECKILL_KEY_PREFIX":   s.prefix,
		"SECKILL_TOKEN_SECRET": testSecret,
		"SECKILL_LOG_LEVEL":    "info",
		"SECKILL_WORKER_BLOCK": "100ms",
		"SECKILL_LOGIN_SENDER": "file",
		"SECKILL_LOGIN_OUTBOX": s.outbox,
		"SECKILL_DATA_DIR":     dir,
		"SECKILL_ADMIN_ADDR":   "off", // no fixed port shared by parallel tests
	}
	for k, v := range env {
		def[k] = v
	}
	if _, ok := env["SECKILL_MYSQL_DSN"]; !ok {
		def["SECKILL_MYSQL_DSN"] = testenv.MySQLDSN(t)
	}
	s.dsn = def["SECKILL_MYSQL_DSN"]
	addr := freeAddr(t)
	def["SECKILL_ADDR"] = addr
	s.base = "http://" + addr
	s.logs = runService(t, def)
	return s
}

// answer is a decoded HTTP answer.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (a answer) code() string { s, _ := a.body["code"].(string); return s }

// send makes one request with raw bytes and headers ("Authorization" etc.).
func send(t testing.TB, method, url string, body []byte, hdr map[string]string) answer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(b)}
	_ = json.Unmarshal(b, &a.body)
	return a
}

func sendJSON(t testing.TB, method, url, tok string, v any) answer {
	t.Helper()
	var b []byte
	if v != nil {
		b, _ = json.Marshal(v)
	}
	hdr := map[string]string{"Content-Type": "application/json"}
	if tok != "" {
		hdr["Authorization"] = "Bearer " + tok
	}
	return send(t, method, url, b, hdr)
}

var codeLine = regexp.MustCompile(`dev sms to (\+[0-9]+): your seckill login code is ([0-9]{6})`)

// lastCode reads the newest code sent to phone from the outbox.
func lastCode(t testing.TB, outbox, phone string) string {
	t.Helper()
	f, err := os.Open(outbox)
	if err != nil {
		t.Fatalf("outbox: %v", err)
	}
	defer f.Close()
	code := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := codeLine.FindStringSubmatch(sc.Text()); m != nil && m[1] == phone {
			code = m[2]
		}
	}
	if code == "" {
		t.Fatalf("no code for %s in the outbox", phone)
	}
	return code
}

// login asks for a code, reads it from the outbox and logs in.
func (s webService) login(t testing.TB, phone string) (tok string, userID int64, role string) {
	t.Helper()
	if a := sendJSON(t, "POST", s.base+"/api/v1/auth/code", "", map[string]string{"phone": phone}); a.status != 202 {
		t.Fatalf("code for %s: %d %s", phone, a.status, a.raw)
	}
	a := sendJSON(t, "POST", s.base+"/api/v1/auth/login", "", map[string]string{"phone": phone, "code": lastCode(t, s.outbox, phone)})
	if a.status != 200 {
		t.Fatalf("login %s: %d %s", phone, a.status, a.raw)
	}
	tok, _ = a.body["token"].(string)
	uid, _ := a.body["user_id"].(float64)
	role, _ = a.body["role"].(string)
	return tok, int64(uid), role
}

func (s webService) db(t testing.TB) *gorm.DB {
	t.Helper()
	g, err := db.OpenMySQL(s.dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	return g
}

// snapshot is what a refused request must leave as it was: every Redis key
// of the service (but the id lease and the list of running instances, which
// renew themselves, the shards' records of the database, which the
// database watcher writes at its first check, and the expiry streams,
// whose groups the expirers make as they start: what start-up writes
// after /healthz answers) and the row counts and stock of the database.
type snapshot struct {
	redis map[string]string
	rows  map[string]int64
	stock int64
}

func (s webService) snapshot(t testing.TB, rdb *redis.Client, g *gorm.DB) snapshot {
	t.Helper()
	ctx := context.Background()
	snap := snapshot{redis: map[string]string{}, rows: map[string]int64{}}
	var keys []string
	iter := rdb.Scan(ctx, 0, s.prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if !strings.Contains(k, ":idgen:") && k != fleet.Key(s.prefix) && !strings.HasSuffix(k, ":db") && !strings.HasSuffix(k, ":expiries") {
			keys = append(keys, k)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	for _, k := range keys {
		// A stream's dump holds its consumers' seen-times, which every
		// read changes: compare its length and last id instead.
		if typ, _ := rdb.Type(ctx, k).Result(); typ == "stream" {
			info, err := rdb.XInfoStream(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			snap.redis[k] = fmt.Sprintf("stream len=%d last=%s", info.Length, info.LastGeneratedID)
			continue
		}
		v, err := rdb.Dump(ctx, k).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		snap.redis[k] = v
	}
	for _, table := range []string{"vouchers", "orders", "dead_letters", "users"} {
		var n int64
		if err := g.Table(table).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		snap.rows[table] = n
	}
	if err := g.Raw("SELECT COALESCE(SUM(stock), 0) FROM vouchers").Scan(&snap.stock).Error; err != nil {
		t.Fatal(err)
	}
	return snap
}

// diff names what changed between two snapshots.
func (a snapshot) diff(b snapshot) []string {
	var out []string
	for k, v := range a.redis {
		if w, ok := b.redis[k]; !ok {
			out = append(out, "redis key removed: "+k)
		} else if w != v {
			out = append(out, "redis key changed: "+k)
		}
	}
	for k := range b.redis {
		if _, ok := a.redis[k]; !ok {
			out = append(out, "redis key added: "+k)
		}
	}
	for k, v := range a.rows {
		if b.rows[k] != v {
			out = append(out, k+" rows: "+strconv.FormatInt(v, 10)+" -> "+strconv.FormatInt(b.rows[k], 10))
		}
	}
	if a.stock != b.stock {
		out = append(out, "database stock changed")
	}
	return out
}
