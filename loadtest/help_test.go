package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
)

// TestEveryCommandAnswersHelp: loadtest and each of its commands answer
// -h, -help and --help with their usage and flags on stdout, nothing on
// stderr, and no error (main exits 0 on none), without reaching the
// target, Redis or MySQL the environment names; "loadtest help" lists
// the commands. A flag refused is still an error, with the usage on
// stderr.
func TestEveryCommandAnswersHelp(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var dialed atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			_ = c.Close()
		}
	}()
	addr := ln.Addr().String()
	env := map[string]string{
		"SECKILL_URL": "http://" + addr, "SECKILL_REDIS_URL": "redis://" + addr + "/0",
		"SECKILL_MYSQL_DSN": "u:p@tcp(" + addr + ")/seckill", "SECKILL_TOKEN_SECRET": bucketsSecret,
	}
	getenv := func(k string) string { return env[k] }
	cli := func(args ...string) (stdout, stderr string, err error) {
		var out, errOut bytes.Buffer
		err = run(context.Background(), append([]string{"loadtest"}, args...), getenv, &out, &errOut)
		return out.String(), errOut.String(), err
	}

	for _, c := range commands {
		for _, line := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {c.name, "-help"}} {
			stdout, stderr, err := cli(line...)
			if err != nil || stderr != "" || !strings.Contains(stdout, "loadtest "+c.name) && c.name != "run" ||
				!strings.Contains(stdout, c.doc) || !strings.Contains(stdout, "flags") {
				t.Errorf("loadtest %s: err %v, stderr %q, stdout %q; want the usage, doc and flags on stdout", strings.Join(line, " "), err, stderr, stdout)
			}
		}
	}
	for _, line := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		stdout, stderr, err := cli(line...)
		if err != nil || stderr != "" {
			t.Errorf("loadtest %s: err %v, stderr %q", line[0], err, stderr)
		}
		for _, c := range commands {
			if !strings.Contains(stdout, c.doc) {
				t.Errorf("loadtest %s does not list %s:\n%s", line[0], c.name, stdout)
			}
		}
	}
	if n := dialed.Load(); n != 0 {
		t.Errorf("asking for help made %d connections", n)
	}

	stdout, stderr, err := cli("drain", "--no-such-flag")
	if err == nil || stdout != "" || !strings.Contains(stderr, "usage: loadtest drain") {
		t.Errorf("loadtest drain --no-such-flag: err %v, stdout %q, stderr %q; want an error and the usage on stderr", err, stdout, stderr)
	}
}
