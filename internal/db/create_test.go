package db_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/db"
	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// missingDatabase returns the DSN of a database that does not exist yet on
// the shared server (its name needs quoting), and an admin connection with
// no database selected; the database is dropped on cleanup.
func missingDatabase(t *testing.T) (dsn string, admin *sql.DB, name string) {
	t.Helper()
	return testenv.MissingMySQLDatabase(t, "-new")
}

func exists(t *testing.T, admin *sql.DB, name string) bool {
	t.Helper()
	var n int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// TestCreateMySQLDatabase: a DSN naming a missing database is refused as
// unknown; CreateMySQLDatabase makes it, utf8mb4, and running it again on
// the existing database changes nothing.
func TestCreateMySQLDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, admin, name := missingDatabase(t)

	if _, err := db.OpenMySQL(dsn, 2); !db.IsUnknownDatabase(err) {
		t.Fatalf("opening a missing database: %v, want an unknown-database error", err)
	}
	if err := db.CreateMySQLDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	if !exists(t, admin, name) {
		t.Fatalf("database %s was not created", name)
	}
	var charset string
	if err := admin.QueryRow("SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&charset); err != nil || charset != "utf8mb4" {
		t.Errorf("character set %q (%v), want utf8mb4", charset, err)
	}
	g, err := db.OpenMySQL(dsn, 2)
	if err != nil {
		t.Fatalf("open the created database: %v", err)
	}
	if err := g.Exec("CREATE TABLE t (id BIGINT PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	db.Close(g)
	if err := db.CreateMySQLDatabase(ctx, dsn); err != nil {
		t.Fatalf("second run on an existing database: %v", err)
	}
	var tables int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ?", name).Scan(&tables); err != nil || tables != 1 {
		t.Errorf("after a second run the database holds %d tables (%v), want its 1", tables, err)
	}
}

// TestCreateMySQLDatabaseDenied: a user who may not create databases gets an
// error that names the database, the user and the statement an
// administrator has to run, and nothing is created.
func TestCreateMySQLDatabaseDenied(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsn, admin, name := missingDatabase(t)

	var b [4]byte
	_, _ = rand.Read(b[:])
	user, pass := "nocreate_"+hex.EncodeToString(b[:]), hex.EncodeToString(b[:])+"-pw"
	if _, err := admin.Exec("CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + pass + "'"); err != nil {
		t.Skipf("the test server's user may not create users: %v", err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP USER '" + user + "'@'%'") })
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, pass

	err = db.CreateMySQLDatabase(ctx, cfg.FormatDSN())
	if err == nil {
		t.Fatal("a user without the CREATE privilege created a database")
	}
	for _, want := range []string{"does not exist", "may not create", user, "CREATE DATABASE IF NOT EXISTS `" + name + "`", "GRANT ALL PRIVILEGES ON `" + name + "`.*"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), pass) {
		t.Errorf("error %q shows the password", err)
	}
	if exists(t, admin, name) {
		t.Error("the database exists after a refused create")
	}
}

// TestCreateMySQLDatabaseNeedsName: a DSN without a database is an error,
// not a server-wide statement.
func TestCreateMySQLDatabaseNeedsName(t *testing.T) {
	t.Parallel()
	if err := db.CreateMySQLDatabase(context.Background(), "root@tcp(127.0.0.1:1)/"); err == nil || !strings.Contains(err.Error(), "names no database") {
		t.Errorf("got %v, want a no-database error", err)
	}
}

// TestMillis: a bound for a time column is UTC in whole milliseconds, and
// a stored time of milliseconds is at or before it exactly when it is at
// or before the time itself.
func TestMillis(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 15, 45, 0, 706_543_295, time.FixedZone("+8", 8*3600))
	got := db.Millis(at)
	if want := time.Date(2026, 12, 3, 7, 45, 0, 706_000_000, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Fatalf("Millis(%v) = %v, want %v", at, got, want)
	}
	// column <= bound (and so column > bound) answers the same.
	for _, stored := range []time.Time{got, got.Add(time.Millisecond), got.Add(-time.Millisecond)} {
		if !stored.After(at) != !stored.After(got) {
			t.Errorf("stored %v <= %v is %v, <= %v is %v", stored, at, !stored.After(at), got, !stored.After(got))
		}
	}
}
