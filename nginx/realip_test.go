//go:build linux

package nginx

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"seckill/internal/testenv"
)

// The clients of the tests below, each on a loopback address of its own;
// the balancers and nginx connect from 127.0.0.1.
const (
	buyerA   = "127.0.0.2"
	buyerB   = "127.0.0.3"
	outsider = "127.0.0.4" // reaches nginx without the balancer
	forged   = "127.0.0.9" // what a client claims to be in X-Forwarded-For
)

// clientFrom is an HTTP client whose connections leave from ip; preamble,
// when set, is written on each new connection before its first request.
func clientFrom(t *testing.T, ip string, preamble func(c net.Conn) string) *http.Client {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil || preamble == nil {
			return c, err
		}
		if _, err := io.WriteString(c, preamble(c)); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Timeout: client.Timeout, Transport: tr}
}

// proxyHeader is the PROXY protocol v1 header that says a connection comes
// from src and was made to dst.
func proxyHeader(src, dst *net.TCPAddr) string {
	return fmt.Sprintf("PROXY TCP4 %s %s %d %d\r\n", src.IP, dst.IP, src.Port, dst.Port)
}

// by is the headers and TCP peer of the last request that carried rid.
func (s *stub) by(rid string) (http.Header, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.seen) - 1; i >= 0; i-- {
		if s.seen[i].Get("X-Request-ID") == rid {
			return s.seen[i], s.peers[i]
		}
	}
	return nil, ""
}

// sawClient: the request rid reached the instance from nginx and named
// want as the client in both X-Forwarded-For and X-Real-IP.
func sawClient(t *testing.T, a *stub, rid, want string) {
	t.Helper()
	h, peer := a.by(rid)
	if h == nil {
		t.Errorf("%s did not reach the instance", rid)
		return
	}
	if h.Get("X-Forwarded-For") != want || h.Get("X-Real-IP") != want {
		t.Errorf("%s: the instance was told X-Forwarded-For %q, X-Real-IP %q; want the client %s",
			rid, h.Values("X-Forwarded-For"), h.Values("X-Real-IP"), want)
	}
	if host, _, _ := net.SplitHostPort(peer); host != "127.0.0.1" {
		t.Errorf("%s: the instance's peer is %s, want nginx on 127.0.0.1", rid, peer)
	}
}

// edge runs nginx from the template on addr (with listen parameters
// params) in front of one stub instance, two purchases per client address
// (1r/m, burst 1), trusting the balancer's word as realIPFrom and header
// say.
func edge(t *testing.T, addr, params, realIPFrom, header string) (*stub, string) {
	t.Helper()
	a := newStub(t, "a", "ok")
	v := vars(addr+params, a.addr())
	v["SECKILL_NGINX_PURCHASE_RATE"], v["SECKILL_NGINX_PURCHASE_BURST"] = "1r/m", "1"
	v["SECKILL_NGINX_REAL_IP_FROM"], v["SECKILL_NGINX_REAL_IP_HEADER"] = realIPFrom, header
	return a, startNginx(t, prefix(t, v), addr)
}

const purchase = "/api/v1/vouchers/1/orders"

// limitedApart: through the balancer (viaA and viaB are its two buyers'
// clients), buyer A uses up its purchases and is refused; a forged
// X-Forwarded-For and X-Real-IP neither free A from its limit nor change
// the address the instance is told; buyer B is not refused meanwhile. The
// instance sees each buyer's own address.
func limitedApart(t *testing.T, a *stub, lb string, viaA, viaB *http.Client) {
	t.Helper()
	for i, want := range []int{http.StatusAccepted, http.StatusAccepted, http.StatusTooManyRequests} {
		rid := "a-buy-" + strconv.Itoa(i)
		got := sendWith(t, viaA, "POST", lb+purchase, map[string]string{"X-Request-ID": rid}, nil)
		if got.status != want {
			t.Fatalf("buyer A's purchase %d: %d, want %d (two per address, then 429)", i, got.status, want)
		}
		if want == http.StatusAccepted {
			sawClient(t, a, rid, buyerA)
		}
	}
	lie := func(rid string) map[string]string {
		return map[string]string{"X-Request-ID": rid, "X-Forwarded-For": forged, "X-Real-IP": forged}
	}
	if got := sendWith(t, viaA, "POST", lb+purchase, lie("a-forged-buy"), nil); got.status != http.StatusTooManyRequests {
		t.Errorf("buyer A with a forged X-Forwarded-For: %d, want 429: the forged address got a fresh limit", got.status)
	}
	if got := sendWith(t, viaA, "GET", lb+"/api/v1/vouchers/1", lie("a-forged-get"), nil); got.status != http.StatusOK {
		t.Fatalf("buyer A's GET: %+v", got)
	}
	sawClient(t, a, "a-forged-get", buyerA)
	if got := sendWith(t, viaB, "POST", lb+purchase, map[string]string{"X-Request-ID": "b-buy"}, nil); got.status != http.StatusAccepted {
		t.Errorf("buyer B's purchase while A is refused: %d, want 202: the buyers share one limit", got.status)
	}
	sawClient(t, a, "b-buy", buyerB)
}

// balancerL7 runs a second nginx as an HTTP load balancer in front of
// target, appending its peer to X-Forwarded-For as cloud balancers and
// Ingress controllers do. It listens twice: lb is the balancer, cdn a hop
// in front of it (a CDN), so that a request through cdn reaches target
// after two hops.
func balancerL7(t *testing.T, target string) (lb, cdn string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"logs", "temp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lbAddr, cdnAddr := "127.0.0.1:"+testenv.FreePort(t), "127.0.0.1:"+testenv.FreePort(t)
	conf := fmt.Sprintf(`worker_processes 1;
pid nginx.pid;
error_log logs/error.log warn;
events { worker_connections 64; }
http {
    client_body_temp_path temp/client_body;
    proxy_temp_path temp/proxy;
    fastcgi_temp_path temp/fastcgi;
    uwsgi_temp_path temp/uwsgi;
    scgi_temp_path temp/scgi;
    access_log off;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    server {
        listen %s;
        location / { proxy_pass http://%s; }
    }
    server {
        listen %s;
        location / { proxy_pass http://%s; }
    }
}
`, lbAddr, target, cdnAddr, lbAddr)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return startNginx(t, dir, lbAddr), "http://" + cdnAddr
}

// TestBalancerInFront: an L7 balancer (nginx) in front of nginx, which
// trusts its address (set_real_ip_from, X-Forwarded-For): each buyer is
// limited and seen as itself, whatever it claims; through two listed hops
// still the buyer (real_ip_recursive); a client that reaches nginx without
// the balancer is its own address, whatever it claims.
func TestBalancerInFront(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + testenv.FreePort(t)
	a, base := edge(t, addr, "", "set_real_ip_from 127.0.0.1/32; set_real_ip_from ::1/128;", "X-Forwarded-For")
	lb, cdn := balancerL7(t, addr)
	viaA := clientFrom(t, buyerA, nil)
	limitedApart(t, a, lb, viaA, clientFrom(t, buyerB, nil))

	// X-Forwarded-For: "buyer A, the CDN", from the balancer.
	if got := sendWith(t, viaA, "POST", cdn+purchase, nil, nil); got.status != http.StatusTooManyRequests {
		t.Errorf("buyer A through two hops: %d, want 429 (A's limit): nginx took a hop for the client", got.status)
	}
	sendWith(t, viaA, "GET", cdn+"/api/v1/vouchers/1", map[string]string{"X-Request-ID": "a-cdn-get"}, nil)
	sawClient(t, a, "a-cdn-get", buyerA)

	// Straight to nginx, claiming to be buyer A: its own limit, its own
	// address.
	direct := clientFrom(t, outsider, nil)
	claim := map[string]string{"X-Request-ID": "outsider-buy", "X-Forwarded-For": buyerA, "X-Real-IP": buyerA}
	if got := sendWith(t, direct, "POST", base+purchase, claim, nil); got.status != http.StatusAccepted {
		t.Errorf("a client outside the balancer claiming to be buyer A: %d, want 202 on its own limit", got.status)
	}
	sawClient(t, a, "outsider-buy", outsider)
}

// balancerL4 runs a TCP load balancer in front of target that opens each
// connection to it with a PROXY protocol v1 header naming the client, as
// an L4 balancer does (AWS NLB, HAProxy in TCP mode).
func balancerL4(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	// track keeps c to close at the end; false once the end has come.
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			c.Close()
			return false
		}
		conns[c] = true
		return true
	}
	relay := func(down net.Conn) {
		defer wg.Done()
		defer down.Close()
		up, err := net.Dial("tcp", target)
		if err != nil || !track(up) {
			return
		}
		defer up.Close()
		if _, err := io.WriteString(up, proxyHeader(down.RemoteAddr().(*net.TCPAddr), down.LocalAddr().(*net.TCPAddr))); err != nil {
			return
		}
		done := make(chan struct{})
		go func() { _, _ = io.Copy(down, up); down.Close(); close(done) }()
		_, _ = io.Copy(up, down)
		up.Close()
		<-done
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !track(c) {
				return
			}
			wg.Add(1)
			go relay(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// TestProxyProtocolInFront: an L4 balancer in front of nginx, which
// listens with proxy_protocol and trusts the balancer's address
// (set_real_ip_from, real_ip_header proxy_protocol): each buyer is limited
// and seen as itself, whatever it writes in X-Forwarded-For; a client that
// reaches nginx without the balancer and sends a PROXY header of its own
// naming buyer A is its own address.
func TestProxyProtocolInFront(t *testing.T) {
	t.Parallel()
	addr := "127.0.0.1:" + testenv.FreePort(t)
	a, _ := edge(t, addr, " proxy_protocol", "set_real_ip_from 127.0.0.1/32;", "proxy_protocol")
	lb := balancerL4(t, addr)
	limitedApart(t, a, lb, clientFrom(t, buyerA, nil), clientFrom(t, buyerB, nil))

	direct := clientFrom(t, outsider, func(c net.Conn) string {
		return proxyHeader(&net.TCPAddr{IP: net.ParseIP(buyerA), Port: 40000}, c.RemoteAddr().(*net.TCPAddr))
	})
	if got := sendWith(t, direct, "POST", "http://"+addr+purchase, map[string]string{"X-Request-ID": "outsider-buy"}, nil); got.status != http.StatusAccepted {
		t.Errorf("a client outside the balancer with a PROXY header naming buyer A: %d, want 202 on its own limit", got.status)
	}
	sawClient(t, a, "outsider-buy", outsider)
}
