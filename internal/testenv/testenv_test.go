package testenv_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// eventually polls cond until it returns nil or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %s: %v", timeout, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not a wait for an event
	}
}

func openDB(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func TestSharedRedisAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	key := testenv.Prefix(t) + ":k"
	if err := rdb.Set(ctx, key, "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Fatalf("get %s = %q, %v; want v", key, got, err)
	}
	if u := testenv.RedisURL(t); !strings.HasPrefix(u, "redis://") {
		t.Errorf("RedisURL = %q, want redis://...", u)
	}
}

func TestPrefixUnique(t *testing.T) {
	t.Parallel()
	a, b := testenv.Prefix(t), testenv.Prefix(t)
	if a == b {
		t.Fatalf("two prefixes are both %q", a)
	}
	if !strings.HasSuffix(a, "_TestPrefixUnique") {
		t.Errorf("prefix %q does not name the test", a)
	}
	t.Run("sub/test name", func(t *testing.T) {
		if p := testenv.Prefix(t); strings.ContainsAny(p, "/ ") {
			t.Errorf("prefix %q is not sanitized", p)
		}
	})
}

func TestMySQLDSNGivesFreshDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db1 := openDB(t, testenv.MySQLDSN(t))
	db2 := openDB(t, testenv.MySQLDSN(t))

	var name1, name2 string
	if err := db1.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name1); err != nil {
		t.Fatal(err)
	}
	if err := db2.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&name2); err != nil {
		t.Fatal(err)
	}
	if name1 == name2 {
		t.Fatalf("both DSNs use database %q", name1)
	}

	if _, err := db1.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db2.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("second database has %d tables, want 0", n)
	}
}

func TestStartRedisAppendOnlySurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	rdb := s.Client(t)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Kill(t)
	s.Restart(t)

	if got, err := rdb.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("after kill and restart, get k = %q, %v; want v", got, err)
	}
}

func TestStartRedisPauseResume(t *testing.T) {
	t.Parallel()
	s := testenv.StartRedis(t, testenv.RedisOptions{})
	// go-redis ignores context deadlines on socket reads unless told otherwise.
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	ping := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}
	if err := ping(time.Second); err != nil {
		t.Fatal(err)
	}

	s.Pause(t)
	if err := ping(200 * time.Millisecond); err == nil {
		t.Fatal("paused server answered PING")
	}

	s.Resume(t)
	eventually(t, 5*time.Second, func() error { return ping(time.Second) })
}

func TestStartMariaDBKeepsCommittedRowAcrossKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := testenv.StartMariaDB(t)
	dsn := d.CreateDatabase(t)
	db := openDB(t, dsn)
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}

	d.Kill(t)
	d.Restart(t)

	var id int
	if err := openDB(t, dsn).QueryRowContext(ctx, "SELECT id FROM t").Scan(&id); err != nil || id != 42 {
		t.Fatalf("after kill and restart, id = %d, %v; want 42", id, err)
	}
}

func TestStartMariaDBWithOptions(t *testing.T) {
	t.Parallel()
	d := testenv.StartMariaDBWith(t, testenv.MariaDBOptions{
		ServerID: 7, LogBin: true, SemiSync: true, SemiSyncTimeout: 500 * time.Millisecond, ReadOnly: true,
		ExtraArgs: []string{"--max-connections=42"},
	})
	for name, want := range map[string]string{
		"server_id": "7", "log_bin": "ON", "binlog_format": "ROW", "log_slave_updates": "ON",
		"gtid_strict_mode": "ON", "sync_binlog": "1", "read_only": "ON", "max_connections": "42",
		"rpl_semi_sync_master_enabled": "ON", "rpl_semi_sync_slave_enabled": "ON",
		"rpl_semi_sync_master_wait_point": "AFTER_SYNC", "rpl_semi_sync_master_timeout": "500",
		"Rpl_semi_sync_master_status": "ON", // a status variable
	} {
		if got := d.Var(t, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}

	// Root writes through read_only. With no replica, the first commit
	// waits out the semi-sync timeout, then the server falls back to
	// asynchronous replication and the next ones do not wait.
	began := time.Now()
	d.Exec(t, "CREATE DATABASE d")
	if waited := time.Since(began); waited < 500*time.Millisecond {
		t.Errorf("first commit without a replica returned in %s, before the semi-sync timeout", waited)
	}
	d.Exec(t, "CREATE TABLE d.t (id INT PRIMARY KEY)")
	d.Exec(t, "INSERT INTO d.t VALUES (?)", 1)
	if got := d.Var(t, "Rpl_semi_sync_master_status"); got != "OFF" {
		t.Errorf("Rpl_semi_sync_master_status = %q after a timeout, want OFF", got)
	}
	if pos := d.Var(t, "gtid_binlog_pos"); pos != "0-7-3" {
		t.Errorf("gtid_binlog_pos = %q after three writes, want 0-7-3", pos)
	}

	plain := testenv.StartMariaDB(t)
	if got := plain.Var(t, "log_bin"); got != "OFF" {
		t.Errorf("StartMariaDB: log_bin = %q, want OFF", got)
	}
}
