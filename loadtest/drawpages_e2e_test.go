//go:build linux

package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/loadtest/load"
)

const drawPagesSecret = "drawpages-secret-drawpages-secret-0123"

// apiProcess is one instance of the service, a process of its own.
type apiProcess struct {
	base string
	cmd  *exec.Cmd
	done chan struct{}
}

// startAPI runs the service's binary on a free loopback port with env,
// waits until it answers /healthz, and stops it (SIGTERM, then SIGKILL)
// on cleanup.
func startAPI(t *testing.T, env map[string]string) *apiProcess {
	t.Helper()
	addr := "127.0.0.1:" + testenv.FreePort(t)
	cmd := exec.Command(testenv.Binary(t, "seckill/cmd/api"))
	cmd.Env = append(os.Environ(), "SECKILL_ADDR="+addr)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &apiProcess{base: "http://" + addr, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-a.done
		}
		if t.Failed() {
			t.Logf("the instance's log:\n%s", out.String())
		}
	})
	testenv.WaitFor(t, 30*time.Second, "the instance answers /healthz", func() bool {
		select {
		case <-a.done:
			t.Fatalf("the instance exited at start:\n%s", out.String())
		default:
		}
		resp, err := http.Get(a.base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return a
}

// TestDrawPagesUnderPolling runs loadtest drawpages small (2,000 entrants
// on 32 connections, 20 list readers, two passes each; a purchase stream
// of 1,200 at 200/s for 1,000 units) against one instance with a Redis and
// a MariaDB of its own, one round with the draw and one without: the draw
// ends done with every entry counted and its stock won; every entrant's
// /draw/me answers its own entry and ticket; every pass of every reader
// reads each entry once, in place order; the service's database
// connections stay within its pool (32 and the probe's 1); the API's
// memory was sampled; the draw round's purchases are split by the
// draw's moments; each stream sold out without overselling and the
// check holds.
func TestDrawPagesUnderPolling(t *testing.T) {
	redis := testenv.StartRedis(t, testenv.RedisOptions{})
	maria := testenv.StartMariaDB(t)
	dsn := maria.CreateDatabase(t)
	api := startAPI(t, map[string]string{
		"SECKILL_REDIS_URL": redis.URL(), "SECKILL_MYSQL_DSN": dsn, "SECKILL_TOKEN_SECRET": drawPagesSecret,
		"SECKILL_RATE_LIMIT": "off", "SECKILL_LOG_LEVEL": "warn", "SECKILL_ADMIN_ADDR": "off", "SECKILL_WORKER_BLOCK": "100ms",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := filepath.Join(t.TempDir(), "drawpages.json")
	var stdout, stderr testenv.Buffer
	env := map[string]string{"SECKILL_URL": api.base, "SECKILL_TOKEN_SECRET": drawPagesSecret, "SECKILL_REDIS_URL": redis.URL(), "SECKILL_MYSQL_DSN": dsn}
	err := run(ctx, []string{"loadtest", "drawpages", "--entrants", "2000", "--draw-stock", "50", "--window", "8s", "-c", "32",
		"--readers", "20", "--passes", "2", "--rate", "200", "--seconds", "6", "--purchase-c", "16", "--purchase-stock", "1000",
		"--rounds", "1", "--pid", strconv.Itoa(api.cmd.Process.Pid), "--drain-timeout", "30s", "--json", results,
	}, func(k string) string { return env[k] }, &stdout, &stderr)
	t.Logf("drawpages:\n%s", stdout.String())
	if err != nil {
		t.Fatalf("drawpages: %v\n%s", err, stderr.String())
	}
	b, err := os.ReadFile(results)
	if err != nil {
		t.Fatal(err)
	}
	var res load.DrawPagesResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if !res.OK || len(res.Rounds) != 2 || res.Rounds[0].Mode != "draw" || res.Rounds[1].Mode != "no-draw" {
		t.Fatalf("OK %v, rounds %d; want OK, a round with the draw then one without", res.OK, len(res.Rounds))
	}
	for _, r := range res.Rounds {
		s := r.Purchases
		if s.Requests != 1200 || s.Check == nil || !s.Check.OK || s.Check.Orders != 1000 || s.Outcomes["202 accepted"] != 1000 || s.Outcomes["409 sold_out"] != 200 {
			t.Errorf("%s round's purchases: %d, %v, check %+v; want 1,200, 1,000 accepted and written, 200 sold out", r.Mode, s.Requests, s.Outcomes, s.Check)
		}
		if r.Usage.Samples == 0 || r.Usage.DBConns < 1 || r.Usage.DBConns > 33 || r.Usage.RSSKiB <= 0 {
			t.Errorf("%s round's usage %+v: want the instance's database connections within its pool of 32 and 1, its memory sampled", r.Mode, r.Usage)
		}
	}
	d := res.Rounds[0].Draw
	if d == nil {
		t.Fatal("the draw round has no draw")
	}
	if d.DoneAfter <= 0 || d.EntryCount != 2000 || d.WinnerCount != 50 || d.Answered != 2000 || d.Won != 50 || d.ProblemsCount != 0 {
		t.Errorf("draw: done %.2fs after the close, %d entries, %d winners counted; %d entrants answered, %d won; problems %v",
			d.DoneAfter, d.EntryCount, d.WinnerCount, d.Answered, d.Won, d.Problems)
	}
	if d.Passes != 40 || d.PassEntries != 40*2000 {
		t.Errorf("list: %d passes read %d entries, want 40 passes of 2,000", d.Passes, d.PassEntries)
	}
	if d.Status.Requests < 2000 || d.Mine.Answers["200"] != 2000 || d.List.Requests < 40*10 {
		t.Errorf("pages: status %+v, me %+v, list %+v", d.Status, d.Mine, d.List)
	}
	sum := 0
	for _, ph := range res.Rounds[0].Phases {
		sum += ph.Purchases
	}
	if len(res.Rounds[0].Phases) != 4 || sum != 1200 {
		t.Errorf("the draw round's purchases by phase %+v: want 4 phases holding all 1,200", res.Rounds[0].Phases)
	}
	for _, want := range []string{"purchase p99, median of rounds", "max database connections of the deployment", "check OK"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the text says no %q", want)
		}
	}
}
