package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

const bucketsSecret = "0123456789abcdef0123456789abcdef"

// TestParseRunBuckets: --buckets and --skew reach the load's
// configuration, default to one bucket and no skew, and are refused
// before any work when the load could not use them.
func TestParseRunBuckets(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	cfg, _, err := parseRun([]string{"--buckets", "3", "--skew", "0.8", "--secret", bucketsSecret}, getenv, io.Discard)
	if err != nil || cfg.Buckets != "3" || cfg.Skew != 0.8 {
		t.Fatalf("buckets %q, skew %v, %v", cfg.Buckets, cfg.Skew, err)
	}
	if cfg, _, err = parseRun(nil, getenv, io.Discard); err != nil || cfg.Buckets != "1" || cfg.Skew != 0 {
		t.Fatalf("defaults: buckets %q, skew %v, %v", cfg.Buckets, cfg.Skew, err)
	}
	for _, args := range [][]string{{"--buckets", "0"}, {"--buckets", "many"}, {"--skew", "1.5"}, {"--buckets", "auto", "--skew", "0.5"}} {
		if _, _, err := parseRun(args, getenv, io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
		if err := run(context.Background(), append([]string{"loadtest", "stampede"}, args...), getenv, io.Discard, io.Discard); err == nil || strings.Contains(err.Error(), "--redis") {
			t.Errorf("stampede %v: %v, want the bucket flags refused first", args, err)
		}
	}
}

// TestBenchCreatesBuckets: bench creates every voucher of its runs with
// --buckets (the field left out for 1) and says the count in its results.
func TestBenchCreatesBuckets(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ buckets, field string }{{"1", ""}, {"3", "3"}, {"auto", `"auto"`}} {
		var mu sync.Mutex
		var fields []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/api/v1/vouchers" {
				var body map[string]json.RawMessage
				_ = json.NewDecoder(r.Body).Decode(&body)
				mu.Lock()
				fields = append(fields, string(body["buckets"]))
				id := len(fields)
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"voucher":{"id":%d},"redis_ready":true}`, id)
				return
			}
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprint(w, `{"order_id":"1","status":"pending"}`)
		}))
		var stdout bytes.Buffer
		err := run(context.Background(), []string{"loadtest", "bench", "--mode", "success", "--rounds", "2", "--requests", "50", "--warmup", "0",
			"-c", "2", "--vouchers", "2", "--buckets", c.buckets, "--target", "t=" + srv.URL, "--pids", "t=none", "--secret", bucketsSecret, "--json", "-"},
			func(string) string { return "" }, &stdout, io.Discard)
		srv.Close()
		if err != nil {
			t.Fatalf("--buckets %s: %v", c.buckets, err)
		}
		if len(fields) != 4 || strings.Join(fields, ",") != strings.Repeat(c.field+",", 3)+c.field {
			t.Errorf("--buckets %s: 2 runs of 2 vouchers created with buckets %q, want %s each", c.buckets, fields, c.field)
		}
		out := stdout.String()
		var res []benchResult
		if err := json.Unmarshal([]byte(out[strings.Index(out, "\n[")+1:]), &res); err != nil || len(res) != 1 || res[0].Buckets != c.buckets {
			t.Errorf("--buckets %s: results %+v, %v", c.buckets, res, err)
		}
	}
}

// TestBenchBuyersNewInEveryRun: no token of one bench run (one voucher)
// reaches the target again in another run, of any round or mode, so every
// measured purchase of --mode success is a buyer the server has never
// seen (a server caches the tokens it verified).
func TestBenchBuyersNewInEveryRun(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	vouchers := 0
	runOf := map[string]string{} // token -> the voucher it first bought
	var reused []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/api/v1/vouchers" {
			vouchers++
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"voucher":{"id":%d},"redis_ready":true}`, vouchers)
			return
		}
		tok := r.Header.Get("Authorization")
		if first, ok := runOf[tok]; ok && first != r.URL.Path {
			reused = append(reused, tok)
		}
		runOf[tok] = r.URL.Path
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, `{"order_id":"1","status":"pending"}`)
	}))
	defer srv.Close()
	err := run(context.Background(), []string{"loadtest", "bench", "--mode", "success,sold-out", "--stock", "5", "--rounds", "2", "--requests", "40", "--warmup", "5",
		"-c", "2", "--target", "a=" + srv.URL, "--pids", "a=none", "--secret", bucketsSecret},
		func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if vouchers != 4 || len(runOf) == 0 {
		t.Fatalf("%d vouchers, %d tokens; want 4 runs", vouchers, len(runOf))
	}
	if len(reused) > 0 {
		t.Errorf("%d tokens came back in a later run, e.g. %.40s...", len(reused), reused[0])
	}
}
