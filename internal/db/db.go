// Package db opens the service's database: MySQL (or MariaDB) in
// production, an SQLite file in embedded mode, both through gorm and set up
// the way the order pipeline relies on.
package db

import (
	"fmt"
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

// OpenMySQL opens a MySQL or MariaDB database from a go-sql-driver DSN.
// Times are read and written in UTC.
func OpenMySQL(dsn string, maxOpen int) (*gorm.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
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
	g, err := gorm.Open(gormmysql.New(gormmysql.Config{
		DSN: mc.FormatDSN(),
		// MariaDB 10.5+ would otherwise get INSERT ... RETURNING, which
		// changes what a duplicate insert reports.
		DisableWithReturning: true,
	}), gormConfig())
	if err != nil {
		return nil, fmt.Errorf("open mysql: %w", err)
	}
	sqlDB, err := g.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(maxOpen)
	sqlDB.SetMaxIdleConns(maxOpen)
	sqlDB.SetConnMaxLifetime(5 * time.Minute)
	return g, nil
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
