// Package db opens the service's database: MySQL (or MariaDB) in
// production, an SQLite file in embedded mode, both through gorm and set up
// the way the order pipeline relies on.
package db

import (
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	gormlogger "gorm.io/gorm/logger"
)

// dialTimeout bounds a connection attempt when the DSN sets no timeout: a
// server that does not answer fails start-up quickly.
const dialTimeout = 3 * time.Second

func gormConfig() *gorm.Config {
	// Errors are handled and logged by the callers; gorm's own logger would
	// print every failed statement a second time.
	return &gorm.Config{Logger: gormlogger.Discard, SkipDefaultTransaction: true}
}

// OpenMySQL opens a MySQL or MariaDB database from a go-sql-driver DSN
// (OpenPrimary).
func OpenMySQL(dsn string, maxOpen int) (*gorm.DB, error) {
	g, _, err := OpenPrimary(dsn, maxOpen)
	return g, err
}

// OpenPrimary opens a MySQL or MariaDB database from a go-sql-driver DSN,
// whose tcp(...) may name several hosts, tried in order: its connections
// go to the first that takes writes (Primary, returned too). Times are
// read and written in UTC.
func OpenPrimary(dsn string, maxOpen int) (*gorm.DB, *Primary, error) {
	mc, err := ParseDSN(dsn)
	if err != nil {
		return nil, nil, err
	}
	mc.ParseTime = true
	mc.Loc = time.UTC
	// Arguments are written into each statement by the driver, escaped:
	// one query a statement, where a prepared one is a prepare, an execute
	// and a close, and MariaDB parses every placeholder each time (the
	// worker's insert has 3,300). Only where the DSN leaves it unset, and
	// only with charsets whose escaping is safe (multi-byte ones such as
	// gbk or sjis can hide a quote from it).
	mc.InterpolateParams = interpolateSafe(dsn)
	if mc.Timeout == 0 {
		mc.Timeout = dialTimeout
	}
	p, err := newPrimary(mc)
	if err != nil {
		return nil, nil, err
	}
	sqlDB := sql.OpenDB(p)
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	sqlDB.SetConnMaxLifetime(5 * time.Minute)
	g, err := gorm.Open(gormmysql.New(gormmysql.Config{
		Conn: sqlDB,
		// MariaDB 10.5+ would otherwise get INSERT ... RETURNING, which
		// changes what a duplicate insert reports.
		DisableWithReturning: true,
	}), gormConfig())
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, fmt.Errorf("open mysql: %w", err)
	}
	return g, p, nil
}

// ParseDSN parses a go-sql-driver DSN whose tcp(...) may list several
// hosts, comma-separated (each gets port 3306 when it names none): the
// Config's Addr is then that list.
func ParseDSN(dsn string) (*mysql.Config, error) {
	single, hosts := splitHosts(dsn)
	mc, err := mysql.ParseDSN(single)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	if len(hosts) > 1 {
		if mc.Net != "tcp" {
			return nil, fmt.Errorf("mysql dsn: several hosts need tcp(...), not %s", mc.Net)
		}
		for i, h := range hosts {
			if _, _, err := net.SplitHostPort(h); err != nil {
				hosts[i] = net.JoinHostPort(h, "3306")
			}
		}
		mc.Addr = strings.Join(hosts, ",")
	}
	return mc, nil
}

// splitHosts finds the address list of a DSN's protocol(addresses) part
// as the driver reads it (after the last '@' before the last '/'), and
// returns the DSN with only the first address, and every address. A DSN
// of one address comes back as it is.
func splitHosts(dsn string) (single string, hosts []string) {
	slash := strings.LastIndex(dsn, "/")
	if slash < 0 {
		return dsn, nil
	}
	head := dsn[:slash]
	start := strings.LastIndex(head, "@") + 1
	open := strings.Index(head[start:], "(")
	if open < 0 || !strings.HasSuffix(head, ")") {
		return dsn, nil
	}
	open += start
	list := head[open+1 : len(head)-1]
	if !strings.Contains(list, ",") {
		return dsn, nil
	}
	for h := range strings.SplitSeq(list, ",") {
		hosts = append(hosts, strings.TrimSpace(h))
	}
	return dsn[:open+1] + hosts[0] + dsn[len(head)-1:], hosts
}

// OpenSQLite opens (creating) an SQLite file in WAL mode with foreign keys
// on. SQLite has one writer, so the pool holds one connection: concurrent
// writers would otherwise fail with "database is locked". Transactions
// begin IMMEDIATE: one that reads, then writes, takes the write lock up
// front and waits out another process's (an operator command on the same
// file) instead of failing when its read turns into a write.
func OpenSQLite(path string) (*gorm.DB, error) {
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	g, err := gorm.Open(sqlite.Open(dsn), gormConfig())
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	sqlDB, err := g.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(1)
	return g, nil
}

// Close closes the pool under g.
func Close(g *gorm.DB) {
	if sqlDB, err := g.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// interpolateSafe reports whether the driver may write arguments into
// statements for dsn: the DSN does not set interpolateParams itself (its
// own value stands then), and names no charset but ones whose escaping a
// multi-byte sequence cannot defeat (the driver's default is utf8mb4).
func interpolateSafe(dsn string) bool {
	_, query, _ := strings.Cut(dsn, "?")
	params, err := url.ParseQuery(query)
	if err != nil {
		return false
	}
	if v, set := params["interpolateParams"]; set {
		return len(v) > 0 && v[len(v)-1] == "true"
	}
	for _, list := range params["charset"] {
		for _, cs := range strings.Split(list, ",") {
			switch strings.ToLower(cs) {
			case "utf8", "utf8mb3", "utf8mb4", "latin1", "ascii", "binary":
			default:
				return false
			}
		}
	}
	return true
}

// Millis is t as the schema keeps times (UTC, whole milliseconds:
// DATETIME(3)), for a bound compared with a time column. MariaDB reads a
// bound of microseconds, as the driver writes a time, as a value of
// another type than the column's and walks every row the rest of the
// condition leaves instead of the index's range: measured on a million
// orders, 650-710 ms for the sweeper's overdue page and 110-190 ms for
// the console's purchases per second, against 1-2 ms each with the bound
// in milliseconds. For a column of milliseconds, column <= bound (and
// column > bound) answers the same either way; column >= bound may take
// in the rest of the bound's own millisecond.
func Millis(t time.Time) time.Time {
	return t.UTC().Truncate(time.Millisecond)
}
