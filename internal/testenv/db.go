package testenv

import (
	"path/filepath"
	"testing"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// DB opens a fresh, empty database for tb, closed at its cleanup: an
// SQLite file in its temp dir (dialect "sqlite", the embedded mode's) or a
// database of its own on the test MySQL ("mysql" or "mariadb"). No schema
// is applied: tests that need it call the schema package's Apply.
func DB(tb testing.TB, dialect string) *gorm.DB {
	tb.Helper()
	var (
		g   *gorm.DB
		err error
	)
	switch dialect {
	case "sqlite":
		g, err = db.OpenSQLite(filepath.Join(tb.TempDir(), "seckill.db"))
	case "mysql", "mariadb":
		g, err = db.OpenMySQL(MySQLDSN(tb), 16)
	default:
		tb.Fatalf("testenv.DB: unknown dialect %q", dialect)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close(g) })
	return g
}
