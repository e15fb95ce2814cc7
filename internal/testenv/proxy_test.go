package testenv_test

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// greeter is a TCP server that writes its name to every connection, then
// holds it open until the client closes it or the server dies.
type greeter struct {
	Addr string

	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startGreeter(t *testing.T, name string) *greeter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &greeter{Addr: ln.Addr().String(), ln: ln}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.mu.Lock()
			g.conns = append(g.conns, c)
			g.mu.Unlock()
			_, _ = c.Write([]byte(name + "\n"))
		}
	}()
	t.Cleanup(g.die)
	return g
}

// die closes the listener and every connection: the server is gone, and
// its port refuses connections.
func (g *greeter) die() {
	_ = g.ln.Close()
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		_ = c.Close()
	}
}

// dialGreeting connects to addr and returns the connection, closed on t's
// cleanup, and the line that greeted it, or the error that ended the read.
func dialGreeting(t *testing.T, addr string) (net.Conn, string, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	line, err := readLine(c)
	return c, line, err
}

func readLine(c net.Conn) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

// closed fails the test unless a read on c ends because the other side
// closed it (not because nothing came within the deadline).
func closed(t *testing.T, c net.Conn, why string) {
	t.Helper()
	line, err := readLine(c)
	switch {
	case err == nil:
		t.Fatalf("%s: read %q, want the connection closed", why, line)
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.Fatalf("%s: connection still open after 5 s", why)
	}
}

func TestProxyMovesAndCloses(t *testing.T) {
	t.Parallel()
	a, b := startGreeter(t, "A"), startGreeter(t, "B")
	p := testenv.StartProxy(t, a.Addr)

	old, line, err := dialGreeting(t, p.Addr)
	if err != nil || line != "A\n" {
		t.Fatalf("through the proxy: %q, %v; want A", line, err)
	}

	p.MoveTo(b.Addr)
	if p.Target() != b.Addr {
		t.Fatalf("Target() = %s after MoveTo(%s)", p.Target(), b.Addr)
	}
	closed(t, old, "connection opened before MoveTo")
	c, line, err := dialGreeting(t, p.Addr)
	if err != nil || line != "B\n" {
		t.Fatalf("after MoveTo: %q, %v; want B", line, err)
	}

	b.die()
	closed(t, c, "connection to a target that died")
	_, line, err = dialGreeting(t, p.Addr) // b's port now refuses
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection to a refusing target: read %q, %v; want it closed", line, err)
	}

	p.MoveTo(a.Addr)
	if _, line, err = dialGreeting(t, p.Addr); err != nil || line != "A\n" {
		t.Fatalf("after MoveTo back: %q, %v; want A", line, err)
	}

	// Stopped on cleanup: the connections it holds are closed, and its
	// port refuses new ones.
	var held net.Conn
	var addr string
	t.Run("cleanup", func(st *testing.T) {
		p := testenv.StartProxy(st, a.Addr)
		addr = p.Addr
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			st.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() }) // the parent's: still open when the proxy stops
		if line, err := readLine(c); err != nil || line != "A\n" {
			st.Fatalf("through the proxy: %q, %v; want A", line, err)
		}
		held = c
	})
	closed(t, held, "connection open when the proxy stopped")
	if c, err := net.Dial("tcp", addr); err == nil {
		_ = c.Close()
		t.Fatal("a stopped proxy accepts connections")
	}
}
