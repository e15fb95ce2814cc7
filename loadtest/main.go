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
//	go run ./loadtest grow [flags]      how the costs of a sale grow with its buyers and its orders table
//	go run ./loadtest drawpages [flags] a draw's pages polled by its entrants and read by list readers, beside purchases of another voucher
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
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

// commands are loadtest's subcommands, in the order the usage lists them.
var commands = []struct{ name, doc string }{
	{"run", "one load run, then the check"},
	{"tokens", "write buyer tokens, one per line"},
	{"bench", "compare targets, alternating runs"},
	{"drain", "time the drain of a voucher's accepted orders"},
	{"redisstat", "Redis CPU and command counts per master, or their change"},
	{"stampede", "a whole sale: Redis commands per request, instance memory, the check"},
	{"expiry", "unpaid units back on sale after their deadline; drain rate with expiries and without"},
	{"grow", "how the costs of a sale grow with its buyers and its orders table"},
	{"drawpages", "a draw's pages polled by its entrants and read by list readers, beside purchases of another voucher with the draw and without"},
}

// usage lists the commands.
func usage() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for i, c := range commands {
		head, name := "       ", c.name
		if i == 0 {
			head, name = "usage: ", "[run]"
		}
		fmt.Fprintf(tw, "%sloadtest %s [flags]\t%s\n", head, name, c.doc)
	}
	_ = tw.Flush()
	b.WriteString(`Each answers -h or --help with its flags. Settings default to the environment that
scripts/cluster-up.sh writes to .cluster/cluster.env (set -a; . .cluster/cluster.env; set +a).`)
	return b.String()
}

// run is the whole program; main and the tests call it.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := dispatch(ctx, args, getenv, stdout, stderr)
	if h := (helpRequest{}); errors.As(err, &h) {
		printHelp(stdout, h.fs)
		return nil
	}
	return err
}

// dispatch runs the command args name (run when the first is a flag).
func dispatch(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
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
	case "grow":
		return growCmd(ctx, rest, getenv, stdout, stderr)
	case "drawpages":
		return drawPages(ctx, rest, getenv, stdout, stderr)
	case "help":
		fmt.Fprintln(stdout, usage())
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage())
}

// helpRequest is a command's answer to -h or --help: run prints the
// command's usage and flags on stdout, and the exit status is 0.
type helpRequest struct{ fs *flag.FlagSet }

func (helpRequest) Error() string { return "help requested" }
func (helpRequest) Unwrap() error { return flag.ErrHelp }

// parseFlags parses args into fs, whose output is the command's stderr.
// -h or --help is a helpRequest; a flag refused prints the command's help
// on stderr, and main then prints the error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	stderr := fs.Output()
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return helpRequest{fs}
	case err != nil:
		printHelp(stderr, fs)
	}
	return err
}

// printHelp prints the usage of fs's command and its flags: for run, the
// default command, the list of commands first.
func printHelp(w io.Writer, fs *flag.FlagSet) {
	name := fs.Name()
	if name == "run" {
		fmt.Fprintf(w, "%s\n\nflags of loadtest [run]:\n", usage())
	} else {
		for _, c := range commands {
			if c.name == name {
				fmt.Fprintf(w, "usage: loadtest %s [flags]\n\n%s.\n\nflags:\n", name, c.doc)
			}
		}
	}
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}
