package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

const infoBefore = "# Server\r\nrun_id:aaa\r\n# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.000000\r\n" +
	"# Commandstats\r\ncmdstat_evalsha:calls=10,usec=200,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_hset:calls=20,usec=40,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"

const infoAfter = "# Server\r\nrun_id:aaa\r\n# CPU\r\nused_cpu_sys:2.000000\r\nused_cpu_user:3.000000\r\n" +
	"# Commandstats\r\ncmdstat_evalsha:calls=110,usec=2200,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_hset:calls=20,usec=40,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_xadd:calls=100,usec=300,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n"

func TestRedisstatDiff(t *testing.T) {
	before, after := parseInfo(infoBefore), parseInfo(infoAfter)
	before.Addr, after.Addr = "n1", "n1"
	if after.RunID != "aaa" || after.CPUUser != 3 || after.CPUSys != 2 || after.Commands["evalsha"] != (cmdStat{110, 2200}) {
		t.Fatalf("parsed %+v", after)
	}
	d := diffStats([]nodeStat{before}, []nodeStat{after})
	if len(d) != 1 {
		t.Fatalf("got %d nodes", len(d))
	}
	got := d[0]
	if got.CPUUser+got.CPUSys != 1.5 {
		t.Errorf("cpu %v + %v, want 1.5 s", got.CPUUser, got.CPUSys)
	}
	if got.Commands["evalsha"] != (cmdStat{100, 2000}) || got.Commands["xadd"] != (cmdStat{100, 300}) {
		t.Errorf("commands %+v", got.Commands)
	}
	if _, ok := got.Commands["hset"]; ok {
		t.Errorf("a command not called since the snapshot is listed: %+v", got.Commands)
	}
	var out bytes.Buffer
	printStats(&out, d, 100)
	if !strings.Contains(out.String(), "15000.0 us per unit") {
		t.Errorf("want 1.5 s over 100 units = 15000 us per unit:\n%s", out.String())
	}

	// A node restarted since the snapshot (another run_id) counts from zero.
	after.RunID = "bbb"
	d = diffStats([]nodeStat{before}, []nodeStat{after})
	if d[0].Commands["evalsha"] != (cmdStat{110, 2200}) {
		t.Errorf("restarted node: %+v", d[0].Commands)
	}
}

// TestScriptShares: each master's share of the script calls (evalsha and
// eval together, other commands left out) of all masters', a line per
// master, and the shares in the JSON; no line when no script ran.
func TestScriptShares(t *testing.T) {
	nodes := []nodeStat{
		{Addr: "a:1", Commands: map[string]cmdStat{"evalsha": {Calls: 300}, "eval": {Calls: 20}, "hget": {Calls: 5000}}},
		{Addr: "b:2", Commands: map[string]cmdStat{"evalsha": {Calls: 400}}},
		{Addr: "c:3", Commands: map[string]cmdStat{"eval": {Calls: 80}, "xadd": {Calls: 900}}},
		{Addr: "d:4", Commands: map[string]cmdStat{"get": {Calls: 7}}},
	}
	if total := withScriptShares(nodes); total != 800 {
		t.Fatalf("%d script calls, want 800", total)
	}
	for i, want := range []struct {
		calls int64
		share float64
	}{{320, 0.4}, {400, 0.5}, {80, 0.1}, {0, 0}} {
		if n := nodes[i]; n.ScriptCalls != want.calls || n.ScriptShare != want.share {
			t.Errorf("%s: %d calls, share %v; want %d, %v", n.Addr, n.ScriptCalls, n.ScriptShare, want.calls, want.share)
		}
	}
	var out bytes.Buffer
	printShares(&out, nodes)
	for _, line := range []string{"800 calls in all", "a:1                           320 calls   40.0%", "d:4                             0 calls    0.0%"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("no %q in:\n%s", line, out.String())
		}
	}
	b, _ := json.Marshal(nodes[1])
	if !strings.Contains(string(b), `"script_calls":400,"script_share":0.5`) {
		t.Errorf("JSON %s", b)
	}
	none := []nodeStat{{Addr: "a:1", Commands: map[string]cmdStat{"get": {Calls: 7}}}}
	withScriptShares(none)
	out.Reset()
	if printShares(&out, none); out.Len() != 0 {
		t.Errorf("no script ran, yet:\n%s", out.String())
	}
}
