package schema

import (
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
)

// oldDB is a fresh database of dialect with the migrations up to version
// applied and recorded, as a service of that time left it, for a test that
// writes the data of that time and then applies the rest. exec runs a
// statement and fails the test on an error; now is the time the
// migrations were recorded at.
func oldDB(t *testing.T, dialect string, version int) (g *gorm.DB, exec func(q string, args ...any), now time.Time) {
	t.Helper()
	g = testenv.DB(t, dialect)
	ms, err := Migrations(dialect)
	if err != nil {
		t.Fatal(err)
	}
	exec = func(q string, args ...any) {
		t.Helper()
		if err := g.Exec(q, args...).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE TABLE schema_migrations (version INT NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL, applied_at DATETIME(3) NOT NULL)")
	now = time.Now().UTC().Truncate(time.Millisecond)
	for _, m := range ms {
		if m.Version > version {
			break
		}
		for _, stmt := range statements(m.SQL) {
			exec(stmt)
		}
		exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", m.Version, m.Name, now)
	}
	return g, exec, now
}
