package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// oneDash finds a flag written -name in a usage.
var oneDash = regexp.MustCompile(`(?m)^\s+-[a-z]`)

// tap is a TCP listener that counts the connections made to it.
type tap struct {
	ln net.Listener
	n  atomic.Int64
}

func startTap(t testing.TB) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tp.n.Add(1)
			_ = c.Close()
		}
	}()
	return tp
}

func (tp *tap) addr() string { return tp.ln.Addr().String() }

// untouched checks that nothing connected to tp: it connects once itself
// and waits for that connection to be counted, so that any earlier one
// would have been counted too.
func (tp *tap) untouched(t testing.TB, what string) {
	t.Helper()
	c, err := net.Dial("tcp", tp.addr())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	testenv.WaitFor(t, 5*time.Second, "the tap counting its own connection", func() bool { return tp.n.Load() >= 1 })
	if n := tp.n.Load() - 1; n != 0 {
		t.Errorf("%d connections to %s", n, what)
	}
}

// cliRun runs the program with args and env: its error, stdout and stderr.
func cliRun(env map[string]string, args ...string) (err error, stdout, stderr string) {
	var out, errOut bytes.Buffer
	err = run(context.Background(), append([]string{"api"}, args...), func(k string) string { return env[k] }, &out, &errOut)
	return err, out.String(), errOut.String()
}

// hostileEnv points every server setting at taps and the listen addresses
// at sockets the test holds (binding them would fail), with a data dir
// that does not exist.
func hostileEnv(t *testing.T) (env map[string]string, redisTap, mysqlTap *tap, dataDir string) {
	t.Helper()
	redisTap, mysqlTap = startTap(t), startTap(t)
	held, admin := startTap(t), startTap(t)
	dataDir = filepath.Join(t.TempDir(), "never-made")
	env = map[string]string{
		"SECKILL_ADDR": held.addr(), "SECKILL_ADMIN_ADDR": admin.addr(), "SECKILL_DATA_DIR": dataDir,
		"SECKILL_REDIS_URL":    "redis://" + redisTap.addr() + "/0",
		"SECKILL_MYSQL_DSN":    "u:p@tcp(" + mysqlTap.addr() + ")/seckill",
		"SECKILL_TOKEN_SECRET": testSecret,
	}
	return env, redisTap, mysqlTap, dataDir
}

// TestCLIHelpTouchesNothing: every command answers --help and -h with its
// usage on stdout and exits 0, without reading the settings, connecting
// to Redis or the database, binding a listener or making the data dir;
// its flags are written --name, as the guides write them; serve's lists
// every setting of the table.
func TestCLIHelpTouchesNothing(t *testing.T) {
	t.Parallel()
	env, redisTap, mysqlTap, dataDir := hostileEnv(t)
	embedded := map[string]string{"SECKILL_DATA_DIR": dataDir, "SECKILL_SHARDS": "not a number"}
	for _, c := range append(commands, command{name: "dlq"}) {
		for _, h := range []string{"--help", "-h"} {
			for what, e := range map[string]map[string]string{"servers": env, "embedded, bad settings": embedded} {
				args := append(strings.Fields(c.name), h)
				err, stdout, stderr := cliRun(e, args...)
				if err != nil || stderr != "" || !strings.HasPrefix(stdout, "usage: api "+c.name) && !strings.HasPrefix(stdout, "usage:\n  api "+c.name) {
					t.Errorf("api %s (%s): err %v, stdout %q, stderr %q; want the usage on stdout alone", strings.Join(args, " "), what, err, stdout, stderr)
				}
				if oneDash.MatchString(stdout) {
					t.Errorf("api %s prints a flag with one dash:\n%s", strings.Join(args, " "), stdout)
				}
			}
		}
	}
	_, stdout, _ := cliRun(nil, "serve", "--help")
	for _, s := range settings() {
		if !strings.Contains(stdout, s.name) {
			t.Errorf("api serve --help does not list %s", s.name)
		}
	}
	if _, stdout, _ := cliRun(nil, "token", "--help"); !strings.Contains(stdout, "--admin") || !strings.Contains(stdout, "--ttl") {
		t.Errorf("api token --help:\n%s", stdout)
	}
	if _, stdout, _ := cliRun(nil, "--help"); !strings.Contains(stdout, "api version") || !strings.Contains(stdout, "api dlq replay ID") {
		t.Errorf("api --help:\n%s", stdout)
	}
	redisTap.untouched(t, "Redis")
	mysqlTap.untouched(t, "the database")
	if _, err := os.Stat(dataDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data dir was made: %v", err)
	}
}

// TestCLIRefusesUnknownArguments: a command line that is not one exits
// non-zero with the usage on stderr, nothing on stdout, and touches
// nothing.
func TestCLIRefusesUnknownArguments(t *testing.T) {
	t.Parallel()
	env, redisTap, mysqlTap, dataDir := hostileEnv(t)
	for _, args := range [][]string{
		{"serve", "--bogus"}, {"serve", "extra"}, {"migrate", "now"}, {"token", "--user", "1", "extra"}, {"token", "--nope"},
		{"token", "--ttl", "-1h"}, {"token"}, {"token", "--admin"}, {"token", "--user", "0"}, {"token", "--user", "-3"}, {"dlq"}, {"dlq", "bogus"}, {"dlq", "replay"}, {"dlq", "replay", "1", "2"}, {"dlq", "list", "--limit"},
		{"reconcile", "-x"}, {"recount", "7"}, {"shards", "all"}, {"buckets"}, {"buckets", "1", "2"}, {"buckets", "--all", "1"}, {"version", "--short"}, {"bogus"}, {"-v"},
	} {
		err, stdout, stderr := cliRun(env, args...)
		if err == nil || stdout != "" || !strings.Contains(stderr, "usage") {
			t.Errorf("api %s: err %v, stdout %q, stderr %q; want an error and the usage on stderr", strings.Join(args, " "), err, stdout, stderr)
		}
	}
	redisTap.untouched(t, "Redis")
	mysqlTap.untouched(t, "the database")
	if _, err := os.Stat(dataDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data dir was made: %v", err)
	}
}

// TestCLITokenNeedsUser: "api token" without --user is a usage error
// naming the flag (no token for a user 0 that minting refuses anyway),
// and --help says the flag is required, as the settings table of
// docs/operating.md does.
func TestCLITokenNeedsUser(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SECKILL_TOKEN_SECRET": testSecret, "SECKILL_DATA_DIR": filepath.Join(t.TempDir(), "never-made")}
	err, stdout, stderr := cliRun(env, "token", "--admin")
	if !errors.Is(err, errUsage) || stdout != "" || !strings.Contains(stderr, "api token needs --user") || !strings.Contains(stderr, "usage: api token --user ID") {
		t.Errorf("api token --admin: err %v, stdout %q, stderr %q; want a usage error naming --user", err, stdout, stderr)
	}
	if _, stdout, _ := cliRun(nil, "token", "--help"); !regexp.MustCompile(`--user ID .*\(required\)`).MatchString(stdout) {
		t.Errorf("api token --help does not say --user is required:\n%s", stdout)
	}
	if cell := docSettings(t)["api token --user"]; strings.TrimSpace(cell) != "(required)" {
		t.Errorf("docs/operating.md's settings table gives api token --user the default %q, want (required)", cell)
	}
	if err, stdout, _ := cliRun(env, "token", "--user", "42"); err != nil || strings.Count(stdout, ".") != 2 {
		t.Errorf("api token --user 42: err %v, stdout %q; want a token", err, stdout)
	}
}

// TestCLIVersion: "api version" prints one line, the module and the VCS
// revision, whatever the settings say; a binary built without a revision
// (go run, as the test binary is) says why instead of "unknown".
func TestCLIVersion(t *testing.T) {
	t.Parallel()
	err, stdout, stderr := cliRun(map[string]string{"SECKILL_SHARDS": "x"}, "version")
	if err != nil || stderr != "" || strings.Count(stdout, "\n") != 1 || !strings.Contains(stdout, " revision ") || !strings.Contains(stdout, "go1.") {
		t.Fatalf("api version: err %v, stdout %q, stderr %q", err, stdout, stderr)
	}
	goRun := []debug.BuildSetting{{Key: "-buildmode", Value: "exe"}, {Key: "GOOS", Value: "linux"}}
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"go build in a git checkout, with changes",
			&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "seckill", Version: "v0.0.0-20261201120000-0123456789ab+dirty"},
				Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			true, "seckill v0.0.0-20261201120000-0123456789ab+dirty revision 0123456789abcdef+modified 2026-12-01T12:00:00Z go1.26.0"},
		{"go build in a clean git checkout",
			&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "seckill", Version: "v0.0.0-20261201120000-0123456789ab"},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "false"}}},
			true, "seckill v0.0.0-20261201120000-0123456789ab revision 0123456789abcdef 2026-12-01T12:00:00Z go1.26.0"},
		{"go run", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "seckill", Version: "(devel)"}, Settings: goRun},
			true, "seckill (devel) revision " + noRevision + " go1.26.0"},
		{"no main module version", &debug.BuildInfo{GoVersion: "go1.26.0"},
			true, "seckill (devel) revision " + noRevision + " go1.26.0"},
		{"no build information", nil, false, "seckill (no build information: not built by the go command with modules)"},
	} {
		if got := versionLine(c.bi, c.ok); got != c.want {
			t.Errorf("%s: version line\n%q, want\n%q", c.name, got, c.want)
		}
	}
	if !strings.Contains(noRevision, "go run") || strings.Contains(noRevision, "unknown") {
		t.Errorf("the line of a build without a revision, %q, does not say go run records none", noRevision)
	}
}

// TestCLITokenSecret: without SECKILL_TOKEN_SECRET, "api token" signs with
// the embedded mode's secret when the data dir holds one and says so on
// stderr; the token alone goes to stdout. Without one it refuses and makes
// none (a secret the service never saw would sign tokens it refuses).
func TestCLITokenSecret(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	env := map[string]string{"SECKILL_DATA_DIR": dir}
	err, stdout, _ := cliRun(env, "token", "--user", "7")
	if err == nil || stdout != "" || !strings.Contains(err.Error(), "SECKILL_TOKEN_SECRET") {
		t.Errorf("token without any secret: err %v, stdout %q", err, stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "token-secret")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("token made a secret: %v", err)
	}

	secret := strings.Repeat("k", 40)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token-secret"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	err, stdout, stderr := cliRun(env, "token", "--user", "7", "--admin", "--ttl", "1h")
	if err != nil || !strings.Contains(stderr, filepath.Join(dir, "token-secret")) {
		t.Fatalf("token with the data dir's secret: err %v, stderr %q", err, stderr)
	}
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	id, err := signer.Parse(strings.TrimSuffix(stdout, "\n"))
	if err != nil || id.UserID != 7 || id.Role != auth.RoleAdmin {
		t.Errorf("stdout %q: %+v %v, want a token of admin 7 signed with the data dir's secret", stdout, id, err)
	}

	env["SECKILL_TOKEN_SECRET"] = testSecret
	if err, _, stderr := cliRun(env, "token", "--user", "7"); err != nil || !strings.Contains(stderr, "SECKILL_TOKEN_SECRET") {
		t.Errorf("token with SECKILL_TOKEN_SECRET: err %v, stderr %q", err, stderr)
	}
}

// TestCLIOperatorResultsAloneOnStdout: shards, dlq list, reconcile and
// recount print their result alone on stdout, as JSON (api shards | jq works);
// logs go to stderr.
func TestCLIOperatorResultsAloneOnStdout(t *testing.T) {
	t.Parallel()
	// The first migrate creates the database and logs it.
	dsn, _ := missingDatabase(t)
	env := map[string]string{
		"SECKILL_REDIS_URL": testenv.RedisURL(t), "SECKILL_KEY_PREFIX": testenv.Prefix(t), "SECKILL_MYSQL_DSN": dsn,
		"SECKILL_LOG_LEVEL": "debug", "SECKILL_SHARDS": "2",
	}
	for _, args := range [][]string{{"migrate"}, {"migrate"}, {"shards"}, {"dlq", "list"}, {"reconcile"}, {"recount"}} {
		err, stdout, stderr := cliRun(env, args...)
		if err != nil {
			t.Errorf("api %s: %v\n%s", strings.Join(args, " "), err, stderr)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(stdout))
		var v any
		if err := dec.Decode(&v); err != nil || dec.More() {
			t.Errorf("api %s printed %q on stdout, want one JSON value alone (%v)", strings.Join(args, " "), stdout, err)
		}
	}
}

// TestLogFormat: SECKILL_LOG_FORMAT's default, auto, writes text to a
// terminal (the master side of a pseudo-terminal) and JSON to anything
// else (a pipe, a file, a buffer); json and text force one. A value
// outside the three is refused.
func TestLogFormat(t *testing.T) {
	t.Parallel()
	pty, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to log to: %v", err)
	}
	t.Cleanup(func() { _ = pty.Close() })
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pr.Close(); _ = pw.Close() })
	file, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = file.Close() })
	writers := map[string]any{"terminal": pty, "pipe": pw, "file": file, "buffer": &bytes.Buffer{}}
	for _, c := range []struct {
		format, writer string
		text           bool
	}{
		{"", "terminal", true}, {"", "pipe", false}, {"", "file", false}, {"", "buffer", false},
		{"auto", "terminal", true}, {"auto", "pipe", false},
		{"json", "terminal", false}, {"text", "buffer", true}, {"text", "pipe", true},
	} {
		cfg, err := loadConfig(func(k string) string { return map[string]string{"SECKILL_LOG_FORMAT": c.format}[k] })
		if err != nil {
			t.Fatalf("SECKILL_LOG_FORMAT=%q: %v", c.format, err)
		}
		_, text := newLogger(cfg, writers[c.writer].(io.Writer)).Handler().(*slog.TextHandler)
		if text != c.text {
			t.Errorf("SECKILL_LOG_FORMAT=%q to a %s: text %v, want %v", c.format, c.writer, text, c.text)
		}
	}
	if _, err := loadConfig(func(k string) string { return map[string]string{"SECKILL_LOG_FORMAT": "xml"}[k] }); err == nil || !strings.Contains(err.Error(), "SECKILL_LOG_FORMAT") {
		t.Errorf("SECKILL_LOG_FORMAT=xml: %v, want refused", err)
	}
}
