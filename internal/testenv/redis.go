package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions configures a dedicated Redis.
type RedisOptions struct {
	// AppendOnly turns on the AOF with an fsync per write, so that a killed
	// server loses nothing it acknowledged. Off, the server persists nothing.
	AppendOnly bool
	// ExtraArgs are appended to the redis-server command line.
	ExtraArgs []string
}

// RedisServer is a redis-server owned by one test, which may kill, pause and
// restart it to see how the code under test copes.
type RedisServer struct {
	Addr string // 127.0.0.1:port
	Dir  string // working directory: AOF files and redis.log
	server
}

// StartRedis starts a dedicated Redis for a fault test, which cannot share a
// server it is about to kill. It is stopped on cleanup.
func StartRedis(tb testing.TB, opt RedisOptions) *RedisServer {
	tb.Helper()
	bin, err := lookBin("redis-server")
	if err != nil {
		unavailable(tb, fmt.Errorf("%w; install redis-server (apt-get install redis-server)", err))
	}
	// A free port can be taken by another process before Redis binds it
	// (the tests run packages side by side): then another is tried.
	var s *RedisServer
	for try := 0; ; try++ {
		s, err = startRedis(bin, tb.TempDir(), opt)
		if err == nil || try == 2 || !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	if err != nil {
		tb.Fatalf("start redis: %v", err)
	}
	tb.Cleanup(s.close)
	return s
}

func startRedis(bin, dir string, opt RedisOptions) (*RedisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--save", "",
	}
	if opt.AppendOnly {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, opt.ExtraArgs...)

	s := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir}
	s.name = "redis"
	// While Redis replays its AOF, PING answers LOADING, an error: waiting for
	// a clean PING also waits for the data to be back.
	s.run = func() (*proc, error) {
		p, err := startProc(dir, filepath.Join(dir, "redis.log"), bin, args...)
		if err != nil {
			return nil, err
		}
		if err := p.waitReady(5*time.Second, func(ctx context.Context) error { return pingRedis(ctx, s.Addr) }); err != nil {
			_ = p.stop(syscall.SIGKILL, time.Second)
			return nil, err
		}
		return p, nil
	}
	if s.proc, err = s.run(); err != nil {
		return nil, err
	}
	return s, nil
}

// pingRedis sends a PING over a bare connection; go-redis would log each
// refused dial while the server starts. It fails on -LOADING too.
func pingRedis(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if reply != "+PONG\r\n" {
		return fmt.Errorf("PING: %s", strings.TrimSpace(reply))
	}
	return nil
}

// URL returns the server's redis:// URL, for code configured by URL.
func (s *RedisServer) URL() string { return "redis://" + s.Addr }

// Client returns a new client of the server, closed on cleanup.
func (s *RedisServer) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
