package testenv

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy in the test process: the database's moving address
// (a virtual IP, a load balancer, a DNS name) that an operator points at
// the new primary after a failover. Clients connect to Addr; each
// connection is relayed to the target of the moment it was accepted.
type Proxy struct {
	Addr string // 127.0.0.1:port

	ln     net.Listener
	ctx    context.Context // cancelled on close: ends the dials in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the proxy

	mu     sync.Mutex
	target string
	gen    int                   // bumped by MoveTo: a connection dialled for an older target is dropped
	conns  map[net.Conn]struct{} // both ends of every relayed connection
	closed bool
}

// StartProxy listens on a free loopback port and relays every connection
// to target. When the target refuses a connection, or closes one (it died),
// the proxy closes the client's side too, so the client sees what it would
// see without a proxy. It is stopped on cleanup, its connections closed,
// and the test fails if any of its goroutines is still running 5 s later.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("start proxy: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		Addr: ln.Addr().String(), ln: ln, ctx: ctx, cancel: cancel,
		target: target, conns: map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		if err := p.close(5 * time.Second); err != nil {
			tb.Error(err)
		}
	})
	return p
}

// MoveTo points the proxy at target: new connections go there, and every
// connection open now is closed, as when a virtual IP moves to another
// host and the old one's connections break. A connection being dialled
// for the old target is closed too.
func (p *Proxy) MoveTo(target string) {
	p.mu.Lock()
	p.target = target
	p.gen++
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// Target returns the address new connections go to.
func (p *Proxy) Target() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.target
}

// accept serves connections until the listener is closed. Any accept error
// stops it: on loopback in a test the only expected one is the close, and a
// proxy that refuses connections shows in the test that uses it.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// relay connects client to the current target and copies both ways until
// either side closes or fails, then closes both.
func (p *Proxy) relay(client net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target, gen := p.target, p.gen
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", target)
	cancel()
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(gen, client, server) {
		_ = client.Close()
		_ = server.Close()
		return
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(server, client)
		p.drop(client, server)
	}()
	_, _ = io.Copy(client, server)
	p.drop(client, server)
	<-done
}

// track records a relayed connection, unless the proxy has moved since it
// was accepted, or closed.
func (p *Proxy) track(gen int, client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || gen != p.gen {
		return false
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	return true
}

// drop closes both ends of a connection, which ends both copies.
func (p *Proxy) drop(client, server net.Conn) {
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
	_ = client.Close()
	_ = server.Close()
}

// close stops accepting, closes every connection and waits up to grace for
// every goroutine to end.
func (p *Proxy) close(grace time.Duration) error {
	_ = p.ln.Close()
	p.cancel()
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-time.After(grace):
		return fmt.Errorf("proxy %s: goroutines still running %s after its close", p.Addr, grace)
	}
}
