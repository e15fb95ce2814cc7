package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// command is one subcommand of the binary. Its flags are parsed, and
// --help answered, before the settings are read or anything is opened.
type command struct {
	name     string // "serve", "dlq list"
	synopsis string // what follows the name in the usage
	doc      string
	// nargs is how many arguments follow the flags.
	nargs int
	// noConfig: runs without reading the settings.
	noConfig bool
	// flags defines the command's flags on fs and returns what runs the
	// command once they are parsed.
	flags func(fs *flag.FlagSet) action
}

// action runs a command.
type action func(ctx context.Context, e *cmdEnv) error

// cmdEnv is what a command runs with.
type cmdEnv struct {
	cfg            config
	log            *slog.Logger // writes to stderr
	stdout, stderr io.Writer
	args           []string // the arguments after the flags
}

// commands lists the binary's subcommands. Operator commands print their
// result alone on stdout (JSON, but for token's bare token) and log on
// stderr.
var commands = []command{
	{name: "serve", doc: "run the service (the default command); --help lists the settings",
		flags: func(*flag.FlagSet) action { return serveCommand }},
	{name: "token revoke", synopsis: "--user ID", doc: "take back the user's admin tokens: each one minted before is refused by every instance from the next request on; print the user's new token version",
		flags: revokeFlags},
	{name: "token", synopsis: "--user ID [--admin] [--ttl D]", doc: "print a bearer token signed with the service's secret; an admin token lives at most SECKILL_ADMIN_TOKEN_MAX_TTL and carries its user's token version, read from the service's database",
		flags: tokenFlags},
	{name: "migrate", doc: "apply the database migrations and exit",
		flags: func(*flag.FlagSet) action { return migrate }},
	{name: "dlq list", synopsis: "[--limit N]", doc: "list dead letters, newest first",
		flags: dlqListFlags},
	{name: "dlq replay", synopsis: "ID", nargs: 1, doc: "send a dead-lettered order through the purchase script again",
		flags: func(*flag.FlagSet) action { return dlqReplay }},
	{name: "reconcile", synopsis: "[--repair]", doc: "report differences between Redis and the database; exit 1 if any. " +
		"--repair first writes back what the database lost and the sale's Redis still holds (a failover of the database: docs/operating.md, Database replication and failover). " +
		"In the embedded mode it asks the running service, on SECKILL_ADMIN_ADDR",
		flags: reconcileFlags},
	{name: "recount", doc: "count every voucher's orders again and set the order counters (the console's figures, the orders-by-state metric) to what they say; print the vouchers whose counters were wrong",
		flags: func(*flag.FlagSet) action { return recountCommand }},
	{name: "shards", doc: "show where each shard lives: hash tag, slot, master",
		flags: func(*flag.FlagSet) action { return shardsCommand }},
	{name: "buckets settle", synopsis: "VOUCHER", nargs: 1, doc: "decide now every move of units between the voucher's buckets still under way (by the recovery loop's rule) and lift fences no rebuild holds; print each move's outcome",
		flags: func(*flag.FlagSet) action { return settleCommand }},
	{name: "buckets", synopsis: "VOUCHER", nargs: 1, doc: "show where each bucket of a voucher lives (shard, hash tag, slot, master) and its stock, alloc, out, readiness and rebuild fence, and the moves between its buckets under way",
		flags: func(*flag.FlagSet) action { return bucketsCommand }},
	{name: "draw verify", synopsis: "[--url BASE] --commitment HEX VOUCHER", nargs: 1, doc: "recompute a fair voucher's draw from its published secret and entries, held to the commitment published before the close (--commitment, required): the secret matches it, the entries match the digest published at the close, every entry is at the place its HMAC gives, the winners come first; exit 1 if not",
		flags: drawVerifyFlags},
	{name: "version", noConfig: true, doc: "print the module version and the VCS revision it was built from",
		flags: func(*flag.FlagSet) action { return versionCommand }},
}

// errUsage is returned, after the usage went to stderr, for a command line
// that is not one.
var errUsage = errors.New("bad command line (usage above)")

// run is the whole program; main and the end-to-end tests call it. The
// service and the commands log to stderr; stdout carries results, the
// first start's admin token and the console's login codes.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		args = args[1:] // the program's name
	}
	if len(args) == 0 {
		args = []string{"serve"}
	}
	if isHelp(args[0]) {
		printUsage(stdout, commands)
		return nil
	}
	cmd, rest, group := findCommand(args)
	if cmd == nil {
		return badGroup(args[0], rest, group, stdout, stderr)
	}
	fs := flag.NewFlagSet("api "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	act := cmd.flags(fs)
	if err := fs.Parse(rest); errors.Is(err, flag.ErrHelp) {
		cmd.help(stdout, fs)
		return nil
	} else if err := cmd.checkLine(fs, err); err != nil {
		fmt.Fprintln(stderr, err)
		cmd.help(stderr, fs)
		return errUsage
	}
	e := &cmdEnv{stdout: stdout, stderr: stderr, args: fs.Args()}
	if !cmd.noConfig {
		cfg, err := loadConfig(getenv)
		if err != nil {
			return err
		}
		e.cfg, e.log = cfg, newLogger(cfg, stderr)
	}
	return act(ctx, e)
}

// checkLine is what is wrong with the command line fs parsed (parseErr
// from parsing it): a flag refused, a required flag missing, another count
// of arguments.
func (c *command) checkLine(fs *flag.FlagSet, parseErr error) error {
	if parseErr != nil {
		return parseErr
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var missing []string
	fs.VisitAll(func(f *flag.Flag) {
		if isRequired(f) && !given[f.Name] {
			missing = append(missing, "--"+f.Name)
		}
	})
	if len(missing) > 0 {
		return fmt.Errorf("api %s needs %s", c.name, strings.Join(missing, " and "))
	}
	if fs.NArg() != c.nargs {
		return fmt.Errorf("api %s takes %d arguments after its flags, not %q", c.name, c.nargs, fs.Args())
	}
	return nil
}

func isHelp(s string) bool { return s == "help" || s == "-h" || s == "--help" || s == "-help" }

// findCommand finds the command args name ("dlq list" takes two words);
// when none does, group lists the commands whose name begins with args[0].
func findCommand(args []string) (cmd *command, rest []string, group []command) {
	for i := range commands {
		c := &commands[i]
		words := strings.Fields(c.name)
		if len(args) >= len(words) && slices.Equal(args[:len(words)], words) {
			return c, args[len(words):], nil
		}
		if words[0] == args[0] {
			group = append(group, *c)
		}
	}
	return nil, args[1:], group
}

// badGroup answers a command line that names no command: "api dlq --help"
// lists dlq's commands on stdout; anything else is refused with the usage
// on stderr.
func badGroup(name string, rest []string, group []command, stdout, stderr io.Writer) error {
	if len(group) > 0 && len(rest) == 1 && isHelp(rest[0]) {
		printUsage(stdout, group)
		return nil
	}
	if len(group) > 0 {
		fmt.Fprintf(stderr, "api %s needs one of its commands\n", name)
		printUsage(stderr, group)
		return errUsage
	}
	fmt.Fprintf(stderr, "unknown command %q\n", name)
	printUsage(stderr, commands)
	return errUsage
}

// printUsage lists cmds, one line each.
func printUsage(w io.Writer, cmds []command) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "usage:")
	for _, c := range cmds {
		fmt.Fprintf(tw, "  api %s\t%s\n", strings.TrimSpace(c.name+" "+c.synopsis), c.doc)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\"api COMMAND --help\" describes a command; \"api serve --help\" lists the settings (environment variables).")
}

// help prints the command's usage and flags (as --name, the way they are
// written everywhere else); serve's lists the settings too.
func (c *command) help(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: api %s\n\n%s.\n", strings.TrimSpace(c.name+" "+c.synopsis), c.doc)
	var flags []string
	fs.VisitAll(func(f *flag.Flag) {
		kind, doc := flag.UnquoteUsage(f)
		flags = append(flags, fmt.Sprintf("  --%s %s\t%s (%s)", f.Name, kind, doc, flagDefault(f)))
	})
	if len(flags) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "\nflags:")
		for _, f := range flags {
			fmt.Fprintln(tw, f)
		}
		_ = tw.Flush()
	}
	if c.name == "serve" {
		fmt.Fprintln(w, "\nsettings, from the environment (docs/operating.md, section Settings):")
		printSettings(w)
	}
}

// newLogger logs to w in SECKILL_LOG_FORMAT: "auto" is text for a person
// reading a terminal and JSON for a collector reading a pipe or a file.
func newLogger(cfg config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" || (cfg.LogFormat == "auto" && isTerminal(w)) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// isTerminal is whether w is a character device: a terminal, or /dev/null
// (where the format does not matter). It asks the file's mode rather than
// the terminal driver, which would need a module of its own.
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Stat() (os.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func serveCommand(ctx context.Context, e *cmdEnv) error { return serve(ctx, e.cfg, e.log, e.stdout) }

// versionCommand prints the module's version and the VCS revision the
// binary was built from, as the Go toolchain recorded them.
func versionCommand(_ context.Context, e *cmdEnv) error {
	fmt.Fprintln(e.stdout, versionLine(debug.ReadBuildInfo()))
	return nil
}

// versionLine is "seckill <version> revision <rev>[+modified] <time> <go>".
// The toolchain records the revision only when go build runs in a git
// checkout with VCS stamping on; go run never records one (nor does
// GOFLAGS=-buildvcs=false, or a build from a copy without .git), and the
// line says so rather than "unknown".
func versionLine(bi *debug.BuildInfo, ok bool) string {
	if !ok {
		return "seckill (no build information: not built by the go command with modules)"
	}
	path, version := bi.Main.Path, bi.Main.Version
	rev, at, modified := "", "", ""
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = " " + s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if rev == "" {
		rev, modified, at = noRevision, "", ""
	}
	return fmt.Sprintf("%s %s revision %s%s%s %s", cmp.Or(path, "seckill"), cmp.Or(version, "(devel)"), rev, modified, at, bi.GoVersion)
}

// noRevision stands for the revision in the version line of a binary
// built without one.
const noRevision = "not recorded (go run, GOFLAGS=-buildvcs=false and builds outside a git checkout record none; go build in the checkout does)"

// ttlFlag is token's --ttl: SECKILL_TOKEN_TTL unless given.
type ttlFlag struct{ d *time.Duration }

func (f ttlFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return errors.New("must be a positive duration such as 24h")
	}
	*f.d = d
	return nil
}

func (f ttlFlag) String() string {
	if f.d == nil || *f.d == 0 {
		return "SECKILL_TOKEN_TTL"
	}
	return f.d.String()
}

// requiredFlag is a flag with no default: a command line without it is
// refused.
type requiredFlag interface {
	flag.Value
	required()
}

func isRequired(f *flag.Flag) bool {
	_, ok := f.Value.(requiredFlag)
	return ok
}

// flagDefault is how --help and the settings table of docs/operating.md
// state a flag's default: "default 50", or "required".
func flagDefault(f *flag.Flag) string {
	if isRequired(f) {
		return "required"
	}
	return "default " + f.DefValue
}

// idFlag is a required flag holding a positive id (token's --user).
type idFlag struct{ id *int64 }

func (idFlag) required() {}

func (f idFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return errors.New("must be a positive integer")
	}
	*f.id = n
	return nil
}

func (f idFlag) String() string {
	if f.id == nil || *f.id == 0 {
		return ""
	}
	return strconv.FormatInt(*f.id, 10)
}

func tokenFlags(fs *flag.FlagSet) action {
	var user int64
	fs.Var(idFlag{&user}, "user", "the `ID` of the user the token is for, a positive integer")
	admin := fs.Bool("admin", false, "give the token the admin role")
	var ttl time.Duration
	fs.Var(ttlFlag{&ttl}, "ttl", "how long the token is valid, such as 24h; an admin token's at most SECKILL_ADMIN_TOKEN_MAX_TTL")
	return func(ctx context.Context, e *cmdEnv) error { return printToken(ctx, e, user, *admin, ttl) }
}

func revokeFlags(fs *flag.FlagSet) action {
	var user int64
	fs.Var(idFlag{&user}, "user", "the `ID` of the user whose admin tokens are taken back")
	return func(ctx context.Context, e *cmdEnv) error { return revokeTokens(ctx, e, user) }
}

func reconcileFlags(fs *flag.FlagSet) action {
	repair := fs.Bool("repair", false, "first write back what the database lost and the sale's Redis still holds: orders, and their cancellations, expiries and refunds")
	return func(ctx context.Context, e *cmdEnv) error { return reconcileCommand(ctx, e, *repair) }
}

func dlqListFlags(fs *flag.FlagSet) action {
	limit := fs.Int("limit", 50, "how many dead letters, newest first")
	return func(ctx context.Context, e *cmdEnv) error { return dlqList(ctx, e, *limit) }
}
