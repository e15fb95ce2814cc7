package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
)

// nodeStat is what one Redis master reports of its work so far: the CPU
// its process used and, per command, calls and microseconds (INFO
// commandstats; a script's inner commands are counted both on their own
// line and inside the script's time).
type nodeStat struct {
	Addr     string             `json:"addr"`
	RunID    string             `json:"run_id"`
	CPUUser  float64            `json:"used_cpu_user"`
	CPUSys   float64            `json:"used_cpu_sys"`
	Commands map[string]cmdStat `json:"commands"`
	// ScriptCalls and ScriptShare, in a change (--since), are this
	// master's script calls (scriptCommands) and their share of all the
	// masters' (0 to 1): how evenly a sale's purchase scripts spread.
	ScriptCalls int64   `json:"script_calls,omitempty"`
	ScriptShare float64 `json:"script_share,omitempty"`
}

// scriptCommands are the commands that run a script: the purchase is
// one, sent as EVALSHA (EVAL when the script was not loaded yet).
var scriptCommands = []string{"evalsha", "eval"}

// withScriptShares fills each node's ScriptCalls and ScriptShare (left 0
// when no master ran a script) and returns the calls of all.
func withScriptShares(nodes []nodeStat) int64 {
	var total int64
	for i := range nodes {
		nodes[i].ScriptCalls = 0
		for _, name := range scriptCommands {
			nodes[i].ScriptCalls += nodes[i].Commands[name].Calls
		}
		total += nodes[i].ScriptCalls
	}
	for i := range nodes {
		nodes[i].ScriptShare = 0
		if total > 0 {
			nodes[i].ScriptShare = float64(nodes[i].ScriptCalls) / float64(total)
		}
	}
	return total
}

// printShares writes a line per master of nodes (withScriptShares
// filled): its script calls and their share of all the masters'; nothing
// when none ran a script.
func printShares(w io.Writer, nodes []nodeStat) {
	var total int64
	for _, n := range nodes {
		total += n.ScriptCalls
	}
	if total == 0 {
		return
	}
	fmt.Fprintf(w, "scripts (%s) per master, %d calls in all:\n", strings.Join(scriptCommands, " + "), total)
	for _, n := range nodes {
		fmt.Fprintf(w, "  %-22s %10d calls %6.1f%%\n", n.Addr, n.ScriptCalls, 100*n.ScriptShare)
	}
}

type cmdStat struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"usec"`
}

// redisFlag collects repeated --redis URLs.
type redisFlag []string

func (r *redisFlag) String() string     { return strings.Join(*r, " ") }
func (r *redisFlag) Set(s string) error { *r = append(*r, s); return nil }

// redisstat snapshots every master of one or more Redis deployments (a
// single server or a Redis Cluster each), or prints what changed since a
// snapshot: CPU and each command's calls and time per master and in all,
// optionally per unit of work (--per: purchases, orders), and each
// master's share of the script calls (the purchases, with buckets spread
// over the masters).
func redisstat(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var urls redisFlag
	fs := flag.NewFlagSet("redisstat", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(&urls, "redis", "Redis URL, repeated (redis://, redis-cluster://...; default SECKILL_REDIS_URL): every master of each is read")
	out := fs.String("out", "", "write a snapshot to this file")
	since := fs.String("since", "", "print the change since the snapshot in this file")
	per := fs.Float64("per", 0, "also divide the change by this many units (purchases, orders)")
	jsonPath := fs.String("json", "", "with --since, also write the change as JSON to this file (- for stdout)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if len(urls) == 0 && getenv("SECKILL_REDIS_URL") != "" {
		urls = redisFlag{getenv("SECKILL_REDIS_URL")}
	}
	if len(urls) == 0 || (*out == "") == (*since == "") {
		return errors.New("want --redis (or SECKILL_REDIS_URL) and one of --out or --since")
	}
	now, err := snapshot(ctx, urls)
	if err != nil {
		return err
	}
	if *out != "" {
		b, _ := json.MarshalIndent(now, "", "  ")
		return os.WriteFile(*out, append(b, '\n'), 0o644)
	}
	b, err := os.ReadFile(*since)
	if err != nil {
		return err
	}
	var before []nodeStat
	if err := json.Unmarshal(b, &before); err != nil {
		return fmt.Errorf("%s: %w", *since, err)
	}
	d := diffStats(before, now)
	withScriptShares(d)
	printStats(stdout, d, *per)
	printShares(stdout, d)
	return writeJSON(*jsonPath, stdout, d)
}

// snapshot reads INFO cpu and commandstats of every master, sorted by address.
func snapshot(ctx context.Context, urls []string) ([]nodeStat, error) {
	var mu sync.Mutex
	var all []nodeStat
	for _, u := range urls {
		rdb, err := redisconn.Open(u, redisconn.Tuning{})
		if err != nil {
			return nil, err
		}
		err = redisconn.ForEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "server", "cpu", "commandstats").Result()
			if err != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, err)
			}
			s := parseInfo(info)
			s.Addr = c.Options().Addr
			mu.Lock()
			all = append(all, s)
			mu.Unlock()
			return nil
		})
		rdb.Close()
		if err != nil {
			return nil, err
		}
	}
	slices.SortFunc(all, func(a, b nodeStat) int { return strings.Compare(a.Addr, b.Addr) })
	return all, nil
}

// parseInfo reads run_id, used_cpu_user/sys and the cmdstat_ lines of an
// INFO answer.
func parseInfo(info string) nodeStat {
	s := nodeStat{Commands: map[string]cmdStat{}}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch {
		case k == "run_id":
			s.RunID = v
		case k == "used_cpu_user":
			s.CPUUser, _ = strconv.ParseFloat(v, 64)
		case k == "used_cpu_sys":
			s.CPUSys, _ = strconv.ParseFloat(v, 64)
		case strings.HasPrefix(k, "cmdstat_"):
			var c cmdStat
			for _, f := range strings.Split(v, ",") {
				fk, fv, _ := strings.Cut(f, "=")
				switch fk {
				case "calls":
					c.Calls, _ = strconv.ParseInt(fv, 10, 64)
				case "usec":
					c.Usec, _ = strconv.ParseInt(fv, 10, 64)
				}
			}
			s.Commands[strings.TrimPrefix(k, "cmdstat_")] = c
		}
	}
	return s
}

// diffStats is now minus before, node by node (matched by address and
// run_id: a restarted node counts from zero).
func diffStats(before, now []nodeStat) []nodeStat {
	out := make([]nodeStat, 0, len(now))
	for _, n := range now {
		d := nodeStat{Addr: n.Addr, RunID: n.RunID, CPUUser: n.CPUUser, CPUSys: n.CPUSys, Commands: maps.Clone(n.Commands)}
		for _, b := range before {
			if b.Addr != n.Addr || b.RunID != n.RunID {
				continue
			}
			d.CPUUser -= b.CPUUser
			d.CPUSys -= b.CPUSys
			for name, c := range d.Commands {
				p := b.Commands[name]
				d.Commands[name] = cmdStat{Calls: c.Calls - p.Calls, Usec: c.Usec - p.Usec}
			}
		}
		for name, c := range d.Commands {
			if c.Calls == 0 {
				delete(d.Commands, name)
			}
		}
		out = append(out, d)
	}
	return out
}

// printStats prints each master's change and the sum over masters; with
// per > 0, calls and microseconds per unit too.
func printStats(w io.Writer, nodes []nodeStat, per float64) {
	total := nodeStat{Addr: "all masters", Commands: map[string]cmdStat{}}
	for _, n := range nodes {
		total.CPUUser += n.CPUUser
		total.CPUSys += n.CPUSys
		for name, c := range n.Commands {
			t := total.Commands[name]
			total.Commands[name] = cmdStat{Calls: t.Calls + c.Calls, Usec: t.Usec + c.Usec}
		}
	}
	for _, n := range append(nodes, total) {
		cpu := (n.CPUUser + n.CPUSys) * 1e6
		fmt.Fprintf(w, "%s: process CPU %.0f ms", n.Addr, cpu/1e3)
		if per > 0 {
			fmt.Fprintf(w, ", %.1f us per unit", cpu/per)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  %-22s %10s %12s %10s", "command", "calls", "usec", "usec/call")
		if per > 0 {
			fmt.Fprintf(w, " %10s %10s", "calls/unit", "usec/unit")
		}
		fmt.Fprintln(w)
		names := slices.Sorted(maps.Keys(n.Commands))
		slices.SortStableFunc(names, func(a, b string) int { return int(n.Commands[b].Calls - n.Commands[a].Calls) })
		for _, name := range names {
			c := n.Commands[name]
			fmt.Fprintf(w, "  %-22s %10d %12d %10.2f", name, c.Calls, c.Usec, float64(c.Usec)/float64(c.Calls))
			if per > 0 {
				fmt.Fprintf(w, " %10.3f %10.2f", float64(c.Calls)/per, float64(c.Usec)/per)
			}
			fmt.Fprintln(w)
		}
	}
}
