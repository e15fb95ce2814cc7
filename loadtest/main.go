// Command loadtest fires purchases at seckill, through nginx or straight at
// an instance, prints what came back and how fast, then waits for the order
// pipeline to drain and checks the invariants in MySQL and Redis. See
// loadtest/README.md.
//
//	go run ./loadtest [flags]          one load run, then the check (exit 1 on a violation)
//	go run ./loadtest tokens [flags]   write buyer tokens, one per line (for k6)
//	go run ./loadtest bench [flags]    alternate runs on several targets, compare their figures
//	go run ./loadtest drain [flags]    time the worker writing a voucher's accepted orders
//	go run ./loadtest redisstat [flags] snapshot or compare Redis CPU and command counts per master
//	go run ./loadtest stampede [flags]  a whole sale through nginx: Redis commands per request, instance memory, the check
//	go run ./loadtest expiry [flags]    unpaid units back on sale after their deadline; drain rate with expiries and without
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errCheckFailed means the run worked and found a violation: exit code 1.
var errCheckFailed = errors.New("check failed")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, errCheckFailed) {
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(2)
	}
}

const usage = `usage: loadtest [run] [flags]   one load run, then the check
       loadtest tokens [flags]  write buyer tokens, one per line
       loadtest bench [flags]   compare targets, alternating runs
       loadtest drain [flags]   time the drain of a voucher's accepted orders
       loadtest redisstat [flags]  Redis CPU and command counts per master, or their change
       loadtest stampede [flags]   a whole sale: Redis commands per request, instance memory, the check
       loadtest expiry [flags]     unpaid units back on sale after their deadline; drain rate with expiries and without
Each takes -h. Settings default to the environment that scripts/cluster-up.sh
writes to .cluster/cluster.env (set -a; . .cluster/cluster.env; set +a).`

// run is the whole program; main and the tests call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cmd, rest := "run", args[1:]
	if len(rest) > 0 && len(rest[0]) > 0 && rest[0][0] != '-' {
		cmd, rest = rest[0], rest[1:]
	}
	switch cmd {
	case "run":
		cfg, opts, err := parseRun(rest, getenv, stderr)
		if err != nil {
			return err
		}
		return execute(ctx, cfg, opts, stdout)
	case "tokens":
		return tokens(rest, getenv, stdout, stderr)
	case "bench":
		return bench(ctx, rest, getenv, stdout, stderr)
	case "drain":
		return drain(ctx, rest, getenv, stdout, stderr)
	case "redisstat":
		return redisstat(ctx, rest, getenv, stdout, stderr)
	case "stampede":
		return stampede(ctx, rest, getenv, stdout, stderr)
	case "expiry":
		return expiry(ctx, rest, getenv, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}
