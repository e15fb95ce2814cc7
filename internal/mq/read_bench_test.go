package mq

import (
	"bufio"
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// cpuTime is the CPU this process used so far, user and system.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// client is a client of the shared Redis speaking RESP protocol proto.
func client(tb testing.TB, proto int) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(testenv.RedisURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	opt.Protocol = proto
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkReadCanned reads batches of 500 order messages, the worker's
// default batch, from a server in this process that answers every read
// with the same reply recorded from Redis (RESP2): the consumer's own
// cost of a read, Redis's taken out. cpu-ns/message is this process's
// CPU (the server's few writes included), garbage collection counted.
func BenchmarkReadCanned(b *testing.B) {
	rdb := client(b, 2)
	ctx := context.Background()
	stream, _ := names(b)
	const size = 500
	pipe := rdb.Pipeline()
	for i := range size {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []string{
			"v", "1", "order", strconv.Itoa(120675968935596032 + i), "user", strconv.Itoa(1000 + i),
			"voucher", "7", "at", "1767225600000", "b", strconv.Itoa(i % 3), "nb", "3",
		}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		b.Fatal(err)
	}
	reply, err := rdb.DoRaw(ctx, "xreadgroup", "group", "g", "c", "count", size, "streams", stream, ">").Result()
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go answer(conn, reply)
		}
	}()
	canned := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Protocol: 2, DisableIdentity: true, PoolSize: 1})
	b.Cleanup(func() { canned.Close() })
	c := NewConsumer(canned, ConsumerConfig{Stream: stream, Group: "g", Consumer: "c", Batch: size, Block: time.Millisecond}, nil, quiet)
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	b.ResetTimer()
	for range b.N {
		batch, err := c.read(ctx, ">")
		if err != nil || len(batch) != size {
			b.Fatal(len(batch), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/message")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N*size), "cpu-ns/message")
}

// answer reads RESP commands from conn and answers each XREADGROUP with
// reply, HELLO as a server older than RESP3 does, anything else (the
// connection's set-up) with OK.
func answer(conn net.Conn, reply []byte) {
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil || len(line) < 3 || line[0] != '*' {
			return
		}
		n, _ := strconv.Atoi(line[1 : len(line)-2])
		var name string
		for i := range 2 * n { // each argument: its length line, then its bytes
			arg, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if i == 1 {
				name = strings.ToLower(strings.TrimSpace(arg))
			}
		}
		out := []byte("+OK\r\n")
		switch name {
		case "xreadgroup":
			out = reply
		case "hello": // an old server: the client speaks RESP2 without it
			out = []byte("-ERR unknown command 'hello'\r\n")
		}
		if _, err := conn.Write(out); err != nil {
			return
		}
	}
}
