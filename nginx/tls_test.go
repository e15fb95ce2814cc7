//go:build linux

package nginx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
)

func opensslBin(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl not found")
		}
		t.Skip("openssl not found; install it to test the TLS configuration")
	}
	return bin
}

// selfSigned makes a throwaway certificate and key for 127.0.0.1 with
// openssl, valid for a day: ECDSA P-256, or RSA 2048 with keyType "rsa".
func selfSigned(t *testing.T, keyType string) (crt, key string) {
	t.Helper()
	bin := opensslBin(t)
	dir := t.TempDir()
	crt, key = filepath.Join(dir, "seckill.crt"), filepath.Join(dir, "seckill.key")
	newKey := []string{"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"}
	if keyType == "rsa" {
		newKey = []string{"-newkey", "rsa:2048"}
	}
	args := append(append([]string{"req", "-x509"}, newKey...), "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
		"-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", crt)
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("openssl req: %v\n%s", err, out)
	}
	return crt, key
}

// replaceOnce replaces old, which must be in s exactly once: a change to
// tls.conf that this test no longer fits fails it instead of passing by.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("tls.conf has %q %d times, want once", old, n)
	}
	return strings.Replace(s, old, new, 1)
}

// tlsNginx runs nginx set up for TLS as docs/operating.md says: the
// template rendered with a listen address ending in "ssl" and an HSTS
// max-age, tls.conf (its certificate paths set) included in the http
// context before seckill.conf, in front of instance a. nginx -t accepts
// it. It returns the HTTPS and the plain HTTP address.
func tlsNginx(t *testing.T, crt, key string, a *stub) (listen, plain string) {
	t.Helper()
	bin := nginxBin(t)
	listen = "127.0.0.1:" + testenv.FreePort(t)
	plain = "127.0.0.1:" + testenv.FreePort(t)
	v := vars(listen+" ssl", a.addr())
	v["SECKILL_NGINX_HSTS_MAX_AGE"] = "31536000"
	dir := prefix(t, v)

	b, err := os.ReadFile("tls.conf")
	if err != nil {
		t.Fatal(err)
	}
	conf := replaceOnce(t, string(b), "/etc/nginx/tls/seckill.crt", crt)
	conf = replaceOnce(t, conf, "/etc/nginx/tls/seckill.key", key)
	conf = replaceOnce(t, conf, "listen 80;", "listen "+plain+";")
	if err := os.WriteFile(filepath.Join(dir, "tls.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	mainConf, err := os.ReadFile(filepath.Join(dir, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	withTLS := replaceOnce(t, string(mainConf), "include seckill.conf;", "include tls.conf;\n    include seckill.conf;")
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(withTLS), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, nginxArgs(dir, "-t")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "test is successful") {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	startNginx(t, dir, listen)
	return listen, plain
}

// TestTLS: with TLS set up as docs/operating.md says, HTTPS reaches the
// instance, which is told the scheme, and answers carry HSTS, nginx's own
// errors too; plain HTTP gets a redirect and reaches nothing. The guide
// shows tls.conf as it is.
func TestTLS(t *testing.T) {
	t.Parallel()
	crt, key := selfSigned(t, "ec")
	a := newStub(t, "a", "ok")
	listen, plain := tlsNginx(t, crt, key, a)
	pem, err := os.ReadFile(crt)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("the certificate openssl made does not parse")
	}
	c := &http.Client{
		Timeout:   client.Timeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	resp, err := c.Get("https://" + listen + "/healthz")
	if err != nil {
		t.Fatalf("GET over TLS: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"stub":"a"`) {
		t.Fatalf("GET over TLS: %d %s", resp.StatusCode, body)
	}
	if proto := a.last().Get("X-Forwarded-Proto"); proto != "https" {
		t.Errorf("the instance was told X-Forwarded-Proto %q, want https", proto)
	}
	if hsts := resp.Header.Values("Strict-Transport-Security"); len(hsts) != 1 || hsts[0] != "max-age=31536000" {
		t.Errorf("HTTPS answer: Strict-Transport-Security %q, want max-age=31536000", hsts)
	}
	resp, err = c.Get("https://" + listen + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get("Strict-Transport-Security") != "max-age=31536000" {
		t.Errorf("nginx's own 404 over HTTPS: %d, Strict-Transport-Security %q", resp.StatusCode, resp.Header.Get("Strict-Transport-Security"))
	}

	a.mu.Lock()
	before := len(a.seen)
	a.mu.Unlock()
	resp, err = c.Get("http://" + plain + "/api/v1/vouchers")
	if err != nil {
		t.Fatalf("GET over plain HTTP: %v", err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusMovedPermanently || !strings.HasPrefix(loc, "https://") || !strings.HasSuffix(loc, "/api/v1/vouchers") {
		t.Errorf("plain HTTP: %d, Location %q; want 301 to the same path over https", resp.StatusCode, loc)
	}
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("the redirect lacks nosniff or Referrer-Policy: %v", resp.Header)
	}
	a.mu.Lock()
	after := len(a.seen)
	a.mu.Unlock()
	if after != before {
		t.Errorf("a plain HTTP request reached the instance")
	}

	b, err := os.ReadFile("tls.conf")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string // tls.conf without its header comment
	for _, line := range strings.Split(string(b), "\n") {
		if len(lines) == 0 && strings.HasPrefix(line, "#") {
			continue
		}
		lines = append(lines, line)
	}
	if shown := "```nginx\n" + strings.Join(lines, "\n") + "```\n"; !strings.Contains(string(doc), shown) {
		t.Errorf("docs/operating.md does not show tls.conf as it is; want the block\n%s", shown)
	}
}

// TestTLSSuites asks the TLS listener with `openssl s_client` for one suite
// at a time, as a scanner does, with an RSA certificate (every suite below
// would be possible with it): TLS 1.2 without forward secrecy and CBC
// suites are refused; ECDHE with AES-GCM or ChaCha20-Poly1305, and TLS
// 1.3, are accepted.
func TestTLSSuites(t *testing.T) {
	t.Parallel()
	bin := opensslBin(t)
	crt, key := selfSigned(t, "rsa")
	listen, _ := tlsNginx(t, crt, key, newStub(t, "a", "ok"))
	for _, tc := range []struct {
		proto, suite string
		accepted     bool
	}{
		{"-tls1_2", "AES128-GCM-SHA256", false},       // RSA key exchange: no forward secrecy
		{"-tls1_2", "AES256-SHA256", false},           // neither
		{"-tls1_2", "ECDHE-RSA-AES128-SHA", false},    // CBC
		{"-tls1_2", "ECDHE-RSA-AES256-SHA384", false}, // CBC
		{"-tls1_2", "ECDHE-RSA-AES128-GCM-SHA256", true},
		{"-tls1_2", "ECDHE-RSA-AES256-GCM-SHA384", true},
		{"-tls1_2", "ECDHE-RSA-CHACHA20-POLY1305", true},
		{"-tls1_3", "", true},
	} {
		args := []string{"s_client", "-connect", listen, "-servername", "localhost", "-brief", tc.proto}
		if tc.suite != "" {
			args = append(args, "-cipher", tc.suite)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Stdin = strings.NewReader("") // close at once after the handshake
		out, err := cmd.CombinedOutput()
		cancel()
		got := err == nil && strings.Contains(string(out), "CONNECTION ESTABLISHED")
		if got && tc.suite != "" && !strings.Contains(string(out), "Ciphersuite: "+tc.suite) {
			t.Errorf("openssl %s -cipher %s: another suite was agreed:\n%s", tc.proto, tc.suite, out)
		}
		if got != tc.accepted {
			t.Errorf("openssl %s %s: accepted %v, want %v\n%s", tc.proto, tc.suite, got, tc.accepted, out)
		}
	}
}
