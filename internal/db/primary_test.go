package db_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/testenv"
)

// twoServers starts two MariaDBs, each with database t and a user app
// (password app) that may write in t but holds no READ ONLY ADMIN: on a
// read-only server its writes are refused, as an application account's
// are. root, which holds every privilege, could write anyway.
func twoServers(t *testing.T) (a, b *testenv.MariaDB) {
	t.Helper()
	a, b = testenv.StartMariaDB(t), testenv.StartMariaDB(t)
	for _, s := range []*testenv.MariaDB{a, b} {
		root, err := db.OpenMySQL(s.DSN(""), 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			"CREATE DATABASE t", "CREATE TABLE t.marks (id INT PRIMARY KEY, port INT)",
			"CREATE USER app@'%' IDENTIFIED BY 'app'", "GRANT ALL ON t.* TO app@'%'",
		} {
			if err := root.Exec(q).Error; err != nil {
				t.Fatal(err)
			}
		}
		db.Close(root)
	}
	return a, b
}

func readOnly(t *testing.T, s *testenv.MariaDB, on bool) {
	t.Helper()
	// Straight through the driver: the service's pool connects to no
	// read-only server.
	root, err := sql.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	v := "OFF"
	if on {
		v = "ON"
	}
	if _, err := root.Exec("SET GLOBAL read_only = " + v); err != nil {
		t.Fatal(err)
	}
}

// portOf is the port of the server g's next connection reaches.
func portOf(t *testing.T, g *gorm.DB) string {
	t.Helper()
	var port string
	if err := g.Raw("SELECT @@port").Row().Scan(&port); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestPrimaryOfSeveralHosts: a DSN listing a read-only server first and a
// writable one second connects to the second; once the roles swap, a
// write refused on a connection to the demoted server recycles the pool,
// and the next write lands on the new primary. Recycle alone moves the
// pool as well.
func TestPrimaryOfSeveralHosts(t *testing.T) {
	t.Parallel()
	a, b := twoServers(t)
	readOnly(t, a, true)
	portA, portB := a.Addr[strings.LastIndex(a.Addr, ":")+1:], b.Addr[strings.LastIndex(b.Addr, ":")+1:]
	g, p, err := db.OpenPrimary("app:app@tcp("+a.Addr+","+b.Addr+")/t", 4)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	if got := portOf(t, g); got != portB {
		t.Fatalf("connected to port %s; want the writable %s", got, portB)
	}
	if err := g.Exec("INSERT INTO marks VALUES (1, @@port)").Error; err != nil {
		t.Fatal(err)
	}
	// Not verified until the watcher verifies the server reached.
	if p.Verified() {
		t.Fatal("verified before any Verify")
	}
	serverB := describe(t, g)
	p.Verify(serverB.Identity())
	if !p.Verified() {
		t.Fatalf("not verified after Verify(%q)", serverB.Identity())
	}

	// The roles swap: b is demoted, a promoted. The pool's connection
	// still reaches b, where app's write is refused.
	readOnly(t, b, true)
	readOnly(t, a, false)
	err = g.Exec("INSERT INTO marks VALUES (2, @@port)").Error
	if err == nil || !strings.Contains(err.Error(), "1290") {
		t.Fatalf("write on the demoted server: %v; want error 1290 (read-only)", err)
	}
	if err := g.Exec("INSERT INTO marks VALUES (2, @@port)").Error; err != nil {
		t.Fatalf("write after the refusal: %v; want it on the new primary", err)
	}
	if got := portOf(t, g); got != portA {
		t.Fatalf("after the refusal the pool reaches port %s; want %s", got, portA)
	}
	// A connection to another server unverifies the pool.
	if p.Verified() {
		t.Fatal("still verified after connecting to another server")
	}
	p.Verify(describe(t, g).Identity())
	if !p.Verified() {
		t.Fatal("not verified after verifying the new server")
	}

	// Recycle alone: swapped back, the pool moves without a refusal.
	readOnly(t, a, true)
	readOnly(t, b, false)
	p.Recycle()
	if got := portOf(t, g); got != portB {
		t.Fatalf("after Recycle the pool reaches port %s; want %s", got, portB)
	}
	if p.Verified() {
		t.Fatal("verified while reaching a server verified before another")
	}
	p.Verify(serverB.Identity())
	if !p.Verified() {
		t.Fatal("not verified once the server reached is verified again")
	}
}

// describe is what the server g reaches says of itself.
func describe(t *testing.T, g *gorm.DB) db.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := db.Describe(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPrimaryRefusesReadOnly: a pool on one read-only server makes no
// connection (its writes could only fail), and says why; once the server
// takes writes, the pool connects.
func TestPrimaryRefusesReadOnly(t *testing.T) {
	t.Parallel()
	a, _ := twoServers(t)
	readOnly(t, a, true)
	_, _, err := db.OpenPrimary("app:app@tcp("+a.Addr+")/t", 2)
	if !errors.Is(err, db.ErrNotPrimary) {
		t.Fatalf("open on a read-only server: %v; want ErrNotPrimary", err)
	}
	readOnly(t, a, false)
	g, _, err := db.OpenPrimary("app:app@tcp("+a.Addr+")/t", 2)
	if err != nil {
		t.Fatal(err)
	}
	db.Close(g)
}

// TestDescribe: the server names itself, with its server id, takes
// writes, and without a binary log has no history.
func TestDescribe(t *testing.T) {
	t.Parallel()
	a, _ := twoServers(t)
	g, err := db.OpenMySQL(a.DSN("t"), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := db.Describe(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(s.Name, a.Addr[strings.LastIndex(a.Addr, ":"):]) || s.ID == 0 || !s.Primary() || s.Galera || len(s.History) != 0 {
		t.Fatalf("described %+v", s)
	}
	if gtid, err := db.LastGTID(ctx, g); err != nil || gtid != "" {
		t.Fatalf("last gtid without a binary log: %q, %v", gtid, err)
	}
}
