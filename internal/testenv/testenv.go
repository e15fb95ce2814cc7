// Package testenv gives tests a real Redis and a real MySQL/MariaDB, never
// mocks: the code under test lives on Lua scripts, streams, transactions and
// constraints that only the real servers implement.
//
// Redis, RedisURL and MySQLDSN use servers shared by the test binary, taken
// from, in order: SECKILL_TEST_REDIS_URL / SECKILL_TEST_MYSQL_DSN; processes
// started from the installed redis-server / mariadbd; containers, when a
// Docker engine answers. With none of these a test skips, or fails when
// CI=true. Fault tests use StartRedis and StartMariaDB for servers of their
// own to kill, pause and restart; failover tests use StartReplication or
// StartGalera for a replicated database, and StartProxy for the address
// that moves to the new primary.
//
// Only _test.go files import this package, and every test package calls Main
// from TestMain.
package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go/wait"
)

// shared holds the servers of the test binary. It is package state because
// the servers outlive every single test: started on first use, stopped by
// Main.
var shared struct {
	redisOnce sync.Once
	redisURL  string
	redisErr  error

	mysqlOnce sync.Once
	mysqlDSN  string // admin DSN, no database selected
	mysqlErr  error

	mainRan atomic.Bool // shared servers leak unless Main stops them

	mu    sync.Mutex
	stops []func() // run in reverse order by stopAll
}

// Main runs the tests of a package and then stops the servers it started,
// whether tests passed, failed or were interrupted.
func Main(m *testing.M) {
	shared.mainRan.Store(true)
	var once sync.Once // an interrupt may race the end of m.Run: stop once, and both wait for it
	stop := func() { once.Do(stopAll) }
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		if s, ok := <-sig; ok {
			stop()
			os.Exit(128 + int(s.(syscall.Signal)))
		}
	}()
	code := m.Run()
	signal.Stop(sig)
	close(sig)
	stop()
	os.Exit(code)
}

func atStop(f func()) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.stops = append(shared.stops, f)
}

// stopAll kills every process still running, the shared servers and those a
// test left behind, then removes the shared servers' directories and
// containers.
func stopAll() {
	live.Lock()
	live.closed = true
	procs := make([]*proc, 0, len(live.procs))
	for p := range live.procs {
		procs = append(procs, p)
	}
	live.Unlock()
	for _, p := range procs {
		_ = p.stop(syscall.SIGKILL, 5*time.Second)
	}
	shared.mu.Lock()
	stops := shared.stops
	shared.stops = nil
	shared.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// Redis returns a client of the shared Redis, closed on cleanup. Tests share
// the keyspace and keep apart by building their keys on Prefix.
func Redis(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(RedisURL(tb))
	if err != nil {
		tb.Fatalf("parse redis url: %v", err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisURL returns the redis:// URL of the shared Redis, for code that takes
// its configuration as a URL.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	requireMain(tb)
	shared.redisOnce.Do(func() { shared.redisURL, shared.redisErr = sharedRedis() })
	check(tb, shared.redisErr)
	return shared.redisURL
}

func sharedRedis() (string, error) {
	if u := os.Getenv("SECKILL_TEST_REDIS_URL"); u != "" {
		return u, nil
	}
	if bin, err := lookBin("redis-server"); err == nil {
		dir, err := os.MkdirTemp("", "testenv-redis-")
		if err != nil {
			return "", err
		}
		atStop(func() { _ = os.RemoveAll(dir) })
		s, err := startRedis(bin, dir, RedisOptions{})
		if err != nil {
			return "", fmt.Errorf("start shared redis: %w", err)
		}
		atStop(s.close)
		return s.URL(), nil
	}
	if dockerAnswers() {
		addr, err := runContainer("redis:7", "6379/tcp", nil, wait.ForLog("Ready to accept connections"))
		return "redis://" + addr, err
	}
	return "", fmt.Errorf("%w: no Redis: set SECKILL_TEST_REDIS_URL, install redis-server, or start a Docker engine", errUnavailable)
}

// MySQLDSN creates a fresh, empty database for this test on the shared server
// and returns its DSN; the database is dropped on cleanup. A database per test
// lets tests run in parallel and migrate from scratch.
func MySQLDSN(tb testing.TB) string {
	tb.Helper()
	requireMain(tb)
	shared.mysqlOnce.Do(func() { shared.mysqlDSN, shared.mysqlErr = sharedMySQL() })
	check(tb, shared.mysqlErr)
	cfg, err := mysql.ParseDSN(shared.mysqlDSN)
	if err != nil {
		tb.Fatalf("parse mysql dsn: %v", err)
	}
	admin, name := withDB(cfg, ""), Prefix(tb)
	if err := createDatabase(admin, name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := execAdmin(admin, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			tb.Error(err)
		}
	})
	return withDB(cfg, name)
}

// MissingMySQLDatabase returns the DSN of a database that does not exist
// yet on the shared server (name is a fresh one plus suffix, which may need
// quoting), and an admin connection with no database selected, to create
// or look for it; the database is dropped on cleanup.
func MissingMySQLDatabase(tb testing.TB, suffix string) (dsn string, admin *sql.DB, name string) {
	tb.Helper()
	cfg, err := mysql.ParseDSN(MySQLDSN(tb))
	if err != nil {
		tb.Fatal(err)
	}
	name = cfg.DBName + suffix
	cfg.DBName = ""
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	admin = sql.OpenDB(conn)
	tb.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			tb.Error(err)
		}
		_ = admin.Close()
	})
	cfg.DBName = name
	return cfg.FormatDSN(), admin, name
}

func sharedMySQL() (string, error) {
	if dsn := os.Getenv("SECKILL_TEST_MYSQL_DSN"); dsn != "" {
		return dsn, nil
	}
	dir, err := os.MkdirTemp("", "testenv-mariadb-")
	if err != nil {
		return "", err
	}
	atStop(func() { _ = os.RemoveAll(dir) })
	d, err := startMariaDB(dir, 0, MariaDBOptions{}, nil)
	if err == nil {
		atStop(d.close)
		return d.DSN(""), nil
	}
	if !isUnavailable(err) {
		return "", fmt.Errorf("start shared mariadb: %w", err)
	}
	if dockerAnswers() {
		addr, err := runContainer("mariadb:10.11", "3306/tcp",
			map[string]string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD": "1"},
			// The image's entrypoint runs a temporary server first.
			wait.ForAll(wait.ForListeningPort("3306/tcp"), wait.ForLog("ready for connections").WithOccurrence(2)))
		return "root@tcp(" + addr + ")/", err
	}
	return "", fmt.Errorf("%w: no MySQL: set SECKILL_TEST_MYSQL_DSN, install mariadb-server, or start a Docker engine", errUnavailable)
}

// withDB returns cfg's DSN for database db with the settings the application
// relies on: time.Time columns in UTC, utf8mb4, one statement per query. The
// lock wait timeout keeps a DROP behind a leaked transaction from hanging.
func withDB(cfg *mysql.Config, db string) string {
	cfg = cfg.Clone()
	cfg.DBName = db
	cfg.ParseTime = true
	cfg.MultiStatements = false
	cfg.Loc = time.UTC
	_ = cfg.Apply(mysql.Charset("utf8mb4", ""))
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["lock_wait_timeout"] = "10"
	return cfg.FormatDSN()
}

func createDatabase(adminDSN, name string) error {
	return execAdmin(adminDSN, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
}

func execAdmin(dsn, query string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, query); err != nil {
		return fmt.Errorf("%s: %w", query, err)
	}
	return nil
}

var (
	prefixSeq atomic.Int64
	// runID tells apart test binaries whose pids collide, as they do in
	// containers sharing one server.
	runID = strconv.FormatUint(uint64(rand.Uint32()%(36*36*36*36)), 36)
)

// Prefix returns a key prefix (also used as database name) unique to this
// test within the run and across runs sharing a server, readable enough to
// tell which test left a key behind, e.g. "t4711_k3z9_3_TestBuy".
func Prefix(tb testing.TB) string {
	name := []byte(tb.Name())
	for i, c := range name {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			name[i] = '_'
		}
	}
	return fmt.Sprintf("t%d_%s_%d_%.32s", os.Getpid(), runID, prefixSeq.Add(1), name)
}

// check reports err as a skip when no server is available, a failure when one
// is broken.
func check(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case err == nil:
	case isUnavailable(err):
		unavailable(tb, err)
	default:
		tb.Fatal(err)
	}
}

// requireMain fails a test whose package does not call Main, which would
// leave the shared servers running.
func requireMain(tb testing.TB) {
	tb.Helper()
	if !shared.mainRan.Load() {
		tb.Fatal("testenv: call testenv.Main(m) from TestMain; it stops the shared servers")
	}
}

func isUnavailable(err error) bool { return errors.Is(err, errUnavailable) }

// unavailable skips the test, except under CI, where a missing server means a
// broken pipeline, not a developer's laptop.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatal(err)
	}
	tb.Skip(err)
}
