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
