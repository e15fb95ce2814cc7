//go:build linux

// Package nginx holds the nginx configuration of seckill (seckill.conf.template
// and nginx.conf); these tests render it, check it with `nginx -t` and run it
// in front of stub instances to see that it does what its comments promise.
package nginx

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"seckill/internal/testenv"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// vars are the template's settings as scripts/cluster-up.sh fills them by
// default; tests override some.
func vars(listen string, upstreams ...string) map[string]string {
	var servers []string
	for _, u := range upstreams {
		servers = append(servers, "server "+u+" max_fails=1 fail_timeout=2s;")
	}
	return map[string]string{
		"SECKILL_NGINX_LISTEN":         listen,
		"SECKILL_UPSTREAM_SERVERS":     strings.Join(servers, " "),
		"SECKILL_NGINX_PURCHASE_RATE":  "20r/s",
		"SECKILL_NGINX_PURCHASE_BURST": "40",
		"SECKILL_NGINX_PROXY_TIMEOUT":  "5s",
		"SECKILL_NGINX_ACCESS_LOG":     "logs/access.log",
		"SECKILL_NGINX_REAL_IP_FROM":   "",
		"SECKILL_NGINX_REAL_IP_HEADER": "X-Forwarded-For",
		"SECKILL_NGINX_HSTS_MAX_AGE":   "0",
		"SECKILL_NGINX_CACHE_DIR":      "cache",
	}
}

var placeholder = regexp.MustCompile(`\$\{[A-Z0-9_]+\}`)

// render fills the template the way sed in cluster-up.sh and envsubst in the
// nginx image do, and fails on a placeholder left unfilled.
func render(t *testing.T, v map[string]string) string {
	t.Helper()
	b, err := os.ReadFile("seckill.conf.template")
	if err != nil {
		t.Fatal(err)
	}
	out := placeholder.ReplaceAllStringFunc(string(b), func(p string) string {
		name := p[2 : len(p)-1]
		val, ok := v[name]
		if !ok {
			t.Errorf("template placeholder %s has no value", p)
		}
		return val
	})
	return out
}

// prefix writes a runnable nginx prefix directory: nginx.conf, the rendered
// seckill.conf, logs/ and temp/.
func prefix(t *testing.T, v map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	// Run as root, nginx's workers are nobody: they must reach the
	// prefix to write the cache there.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	main, err := os.ReadFile("nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"logs", "temp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), main, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "seckill.conf"), []byte(render(t, v)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func nginxBin(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"nginx", "/usr/sbin/nginx"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("nginx not found (scripts/deps.sh installs it)")
	}
	t.Skip("nginx not found; install it (apt-get install nginx) to test the configuration")
	return ""
}

func nginxArgs(dir string, extra ...string) []string {
	return append([]string{"-p", dir + "/", "-e", "logs/error.log", "-c", filepath.Join(dir, "nginx.conf")}, extra...)
}

// TestConfigIsValid runs `nginx -t` on the configuration as the cluster
// script renders it.
func TestConfigIsValid(t *testing.T) {
	t.Parallel()
	bin := nginxBin(t)
	dir := prefix(t, vars("127.0.0.1:"+testenv.FreePort(t), "127.0.0.1:"+testenv.FreePort(t), "127.0.0.1:"+testenv.FreePort(t)))
	out, err := exec.Command(bin, nginxArgs(dir, "-t")...).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "test is successful") {
		t.Fatalf("nginx -t said:\n%s", out)
	}
}

// TestTemplateRules checks rules a reviewer should not have to re-derive:
// POSTs are never resent to a second instance, and the keep-alive upstream.
func TestTemplateRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("seckill.conf.template")
	if err != nil {
		t.Fatal(err)
	}
	var directives []string // the template without its comments
	for _, line := range strings.Split(string(b), "\n") {
		if code, _, _ := strings.Cut(line, "#"); strings.TrimSpace(code) != "" {
			directives = append(directives, strings.TrimSpace(code))
		}
	}
	conf := strings.Join(directives, "\n")
	if strings.Contains(conf, "non_idempotent") {
		t.Error("proxy_next_upstream must not resend POSTs (non_idempotent)")
	}
	for _, want := range []string{
		"proxy_next_upstream error timeout;", "keepalive 256;", `proxy_set_header Connection "";`,
		"proxy_http_version 1.1;", "limit_req_status 429;", "proxy_set_header X-Real-IP $remote_addr;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("template lacks %q", want)
		}
	}
}

// startNginx runs nginx on dir until the test ends and returns its base URL.
func startNginx(t *testing.T, dir, listen string) string {
	t.Helper()
	cmd := exec.Command(nginxBin(t), nginxArgs(dir, "-g", "daemon off;")...)
	log, err := os.Create(filepath.Join(dir, "logs", "stderr.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so the workers are stopped with the master; and
	// killed by the kernel if this test binary dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			for _, f := range []string{"stderr.log", "error.log"} {
				b, _ := os.ReadFile(filepath.Join(dir, "logs", f))
				t.Logf("nginx %s:\n%s", f, b)
			}
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if err == nil {
			c.Close()
			return "http://" + listen
		}
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(dir, "logs", "stderr.log"))
			t.Fatalf("nginx exited at start:\n%s", b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx does not listen on %s: %v", listen, err)
		}
	}
}

// stub is an instance stand-in that records what reached it.
type stub struct {
	name  string
	srv   *httptest.Server
	mu    sync.Mutex
	seen  []http.Header // headers of every request, in order
	peers []string      // the TCP peer of every request, in order
}

// newStub serves 202 on purchases, 429 with Retry-After 7 on paths ending
// in /limited and 200 elsewhere; hang and drop pick misbehaviours: hang
// never answers, drop closes the connection unanswered.
func newStub(t *testing.T, name string, mode string) *stub {
	t.Helper()
	s := &stub{name: name}
	stop := make(chan struct{})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, r.Header.Clone())
		s.peers = append(s.peers, r.RemoteAddr)
		s.mu.Unlock()
		switch mode {
		case "hang":
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		case "drop":
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("X-Request-ID", r.Header.Get("X-Request-ID"))
		w.Header().Set("X-Stub", name)
		w.Header().Set("Content-Type", "application/json")
		// Security headers as the instances set them (internal/web).
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		if strings.HasSuffix(r.URL.Path, "/limited") { // an instance's own limit
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"code":"rate_limited","message":"the instance's own limit"}`)
			return
		}
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusAccepted)
		}
		fmt.Fprintf(w, `{"stub":%q}`, name)
	}))
	t.Cleanup(func() { close(stop); s.srv.Close() })
	return s
}

func (s *stub) addr() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// requests returns the headers of the requests that carried request id rid.
func (s *stub) requests(rid string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.seen {
		if h.Get("X-Request-ID") == rid {
			n++
		}
	}
	return n
}

func (s *stub) last() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.seen) == 0 {
		return nil
	}
	return s.seen[len(s.seen)-1]
}

var client = &http.Client{Timeout: 20 * time.Second}

type answer struct {
	status int
	header http.Header
	code   string
	stub   string
}

func send(t *testing.T, method, url string, hdr map[string]string, body io.Reader) answer {
	t.Helper()
	return sendWith(t, client, method, url, hdr, body)
}

// sendWith is send through c, a client of its own (its own address).
func sendWith(t *testing.T, c *http.Client, method, url string, hdr map[string]string, body io.Reader) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var out struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Stub    string `json:"stub"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s %s: status %d, body is not JSON: %q", method, url, resp.StatusCode, b)
	}
	if resp.StatusCode >= 400 && (out.Code == "" || out.Message == "") {
		t.Errorf("%s %s: status %d without code and message: %s", method, url, resp.StatusCode, b)
	}
	return answer{status: resp.StatusCode, header: resp.Header, code: out.Code, stub: out.Stub}
}

// TestForwardsClientAndRequestID: the instance sees the TCP peer as the
// client, whatever the client claims, and one request id travels both ways.
func TestForwardsClientAndRequestID(t *testing.T) {
	t.Parallel()
	a := newStub(t, "a", "ok")
	listen := "127.0.0.1:" + testenv.FreePort(t)
	base := startNginx(t, prefix(t, vars(listen, a.addr())), listen)

	got := send(t, "GET", base+"/healthz", map[string]string{"X-Forwarded-For": "6.6.6.6", "X-Real-IP": "6.6.6.6"}, nil)
	if got.status != 200 || got.stub != "a" {
		t.Fatalf("GET /healthz: %+v", got)
	}
	h := a.last()
	if h.Get("X-Real-IP") != "127.0.0.1" || h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("instance saw X-Real-IP %q, X-Forwarded-For %q; want the TCP peer 127.0.0.1",
			h.Get("X-Real-IP"), h.Get("X-Forwarded-For"))
	}
	rid := h.Get("X-Request-ID")
	if len(rid) != 32 || got.header.Get("X-Request-ID") != rid || len(got.header.Values("X-Request-ID")) != 1 {
		t.Errorf("request id: instance saw %q, client got %q", rid, got.header.Values("X-Request-ID"))
	}
	if h.Get("Connection") == "close" {
		t.Error("nginx asked the instance to close the connection: no keep-alive upstream")
	}

	got = send(t, "GET", base+"/healthz", map[string]string{"X-Request-ID": "trace-42"}, nil)
	if a.last().Get("X-Request-ID") != "trace-42" || got.header.Get("X-Request-ID") != "trace-42" {
		t.Errorf("a plain client request id was not kept: %q", got.header.Get("X-Request-ID"))
	}
	got = send(t, "GET", base+"/healthz", map[string]string{"X-Request-ID": "no spaces <allowed>"}, nil)
	if rid := a.last().Get("X-Request-ID"); len(rid) != 32 || got.header.Get("X-Request-ID") != rid {
		t.Errorf("a hostile client request id was passed on: %q", rid)
	}
}

// TestNeverResendsAPurchase: an instance that took a POST and dropped the
// connection gets a JSON 502 back to the client; the POST never reaches the
// other instance. A GET in the same spot is tried on the other instance.
func TestNeverResendsAPurchase(t *testing.T) {
	t.Parallel()
	bad, good := newStub(t, "bad", "drop"), newStub(t, "good", "ok")
	listen := "127.0.0.1:" + testenv.FreePort(t)
	base := startNginx(t, prefix(t, vars(listen, bad.addr(), good.addr())), listen)

	hitBad := false
	for i := range 20 {
		rid := "buy-" + strconv.Itoa(i)
		got := send(t, "POST", base+"/api/v1/vouchers/1/orders", map[string]string{"X-Request-ID": rid}, nil)
		if bad.requests(rid) == 0 {
			if got.status != http.StatusAccepted || got.stub != "good" {
				t.Fatalf("purchase %s: %+v", rid, got)
			}
			continue
		}
		hitBad = true
		if got.status != http.StatusBadGateway || got.code != "bad_gateway" {
			t.Errorf("purchase dropped by an instance: got %d %q, want 502 bad_gateway", got.status, got.code)
		}
		if n := good.requests(rid); n != 0 {
			t.Errorf("purchase %s was resent to another instance (%d times)", rid, n)
		}
		break
	}
	if !hitBad {
		t.Fatal("no purchase reached the dropping instance in 20 tries")
	}

	// The dropping instance is marked failed for fail_timeout; a GET that
	// reaches it anyway after that is answered by the other one.
	for i := range 20 {
		rid := "get-" + strconv.Itoa(i)
		got := send(t, "GET", base+"/api/v1/vouchers/1", map[string]string{"X-Request-ID": rid}, nil)
		if got.status != 200 || got.stub != "good" {
			t.Fatalf("GET %s: %+v, want 200 from the good instance", rid, got)
		}
	}
}

// TestRateLimitAnswersJSON: past rate and burst, a client address gets a
// JSON 429 with Retry-After; other routes are not limited.
func TestRateLimitAnswersJSON(t *testing.T) {
	t.Parallel()
	a := newStub(t, "a", "ok")
	listen := "127.0.0.1:" + testenv.FreePort(t)
	v := vars(listen, a.addr())
	v["SECKILL_NGINX_PURCHASE_RATE"], v["SECKILL_NGINX_PURCHASE_BURST"] = "1r/m", "2"
	base := startNginx(t, prefix(t, v), listen)

	codes := map[int]int{}
	for range 6 {
		got := send(t, "POST", base+"/api/v1/vouchers/7/orders", nil, nil)
		codes[got.status]++
		if got.status == http.StatusTooManyRequests {
			if got.code != "rate_limited" || got.header.Get("Retry-After") == "" || got.header.Get("X-Request-ID") == "" {
				t.Errorf("429 answer: %+v", got)
			}
		}
	}
	if codes[http.StatusAccepted] != 3 || codes[http.StatusTooManyRequests] != 3 {
		t.Errorf("6 purchases at 1r/m burst 2: %v, want 3 accepted and 3 refused", codes)
	}
	for range 5 {
		if got := send(t, "GET", base+"/api/v1/vouchers/7", nil, nil); got.status != 200 {
			t.Fatalf("GET limited too: %+v", got)
		}
	}
}

// TestGatewayErrorsAnswerJSON: no instance up is a JSON 502; an instance that
// does not answer in time is a JSON 504, and the POST is not resent; an
// oversized body is a JSON 413.
func TestGatewayErrorsAnswerJSON(t *testing.T) {
	t.Parallel()
	t.Run("all instances down", func(t *testing.T) {
		t.Parallel()
		listen := "127.0.0.1:" + testenv.FreePort(t)
		base := startNginx(t, prefix(t, vars(listen, "127.0.0.1:"+testenv.FreePort(t), "127.0.0.1:"+testenv.FreePort(t))), listen)
		if got := send(t, "POST", base+"/api/v1/vouchers/1/orders", nil, nil); got.status != 502 || got.code != "bad_gateway" {
			t.Errorf("purchase with no instance: %+v", got)
		}
	})
	t.Run("instance too slow", func(t *testing.T) {
		t.Parallel()
		slow, other := newStub(t, "slow", "hang"), newStub(t, "slow2", "hang")
		listen := "127.0.0.1:" + testenv.FreePort(t)
		v := vars(listen, slow.addr(), other.addr())
		v["SECKILL_NGINX_PROXY_TIMEOUT"] = "1s"
		base := startNginx(t, prefix(t, v), listen)
		got := send(t, "POST", base+"/api/v1/vouchers/1/orders", map[string]string{"X-Request-ID": "slow-1"}, nil)
		if got.status != 504 || got.code != "gateway_timeout" {
			t.Errorf("purchase on a hung instance: %+v", got)
		}
		if n := slow.requests("slow-1") + other.requests("slow-1"); n != 1 {
			t.Errorf("a timed-out purchase reached instances %d times, want 1", n)
		}
	})
	t.Run("body too large", func(t *testing.T) {
		t.Parallel()
		a := newStub(t, "a", "ok")
		listen := "127.0.0.1:" + testenv.FreePort(t)
		base := startNginx(t, prefix(t, vars(listen, a.addr())), listen)
		got := send(t, "POST", base+"/api/v1/vouchers", nil, strings.NewReader(strings.Repeat("x", 100<<10)))
		if got.status != 413 || got.code != "body_too_large" {
			t.Errorf("100 KiB body: %+v", got)
		}
	})
}

// TestErrorLogIsQuiet guards the rendered configuration against warnings
// nginx prints at start (a duplicate directive, an unknown variable).
func TestErrorLogIsQuiet(t *testing.T) {
	t.Parallel()
	bin := nginxBin(t)
	dir := prefix(t, vars("127.0.0.1:"+testenv.FreePort(t), "127.0.0.1:"+testenv.FreePort(t)))
	out, err := exec.Command(bin, nginxArgs(dir, "-t")...).CombinedOutput()
	if err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "[warn]") || strings.Contains(line, "[emerg]") {
			t.Errorf("nginx -t: %s", line)
		}
	}
}
