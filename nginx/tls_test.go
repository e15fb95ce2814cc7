//go:build linux

package nginx

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"seckill/internal/testenv"
)

// selfSigned makes a throwaway certificate and key for 127.0.0.1 with
// openssl, valid for a day.
func selfSigned(t *testing.T) (crt, key string) {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl not found")
		}
		t.Skip("openssl not found; install it to test the TLS configuration")
	}
	dir := t.TempDir()
	crt, key = filepath.Join(dir, "seckill.crt"), filepath.Join(dir, "seckill.key")
	out, err := exec.Command(bin, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
		"-keyout", key, "-out", crt).CombinedOutput()
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

// TestTLS sets TLS up as docs/operating.md says: the template rendered with
// a listen address ending in "ssl", tls.conf (its certificate paths set)
// included in the http context before seckill.conf. nginx -t accepts it;
// HTTPS reaches the instance, which is told the scheme; plain HTTP gets a
// redirect and reaches nothing. The guide shows tls.conf as it is.
func TestTLS(t *testing.T) {
	t.Parallel()
	bin := nginxBin(t)
	crt, key := selfSigned(t)
	a := newStub(t, "a", "ok")
	listen := "127.0.0.1:" + testenv.FreePort(t)
	plain := "127.0.0.1:" + testenv.FreePort(t)
	dir := prefix(t, vars(listen+" ssl", a.addr()))

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
	a.mu.Lock()
	after := len(a.seen)
	a.mu.Unlock()
	if after != before {
		t.Errorf("a plain HTTP request reached the instance")
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
