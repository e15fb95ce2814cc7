// Package schema holds the versioned SQL migrations, embedded, and applies them.
//
// The directory is sql/; the package is named schema so that it does not
// shadow database/sql in the files that import it. The migrations are the
// source of truth for the schema: its keys and checks are the last guard of
// the order pipeline's invariants.
package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

//go:embed mysql/*.sql sqlite/*.sql
var files embed.FS

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations lists the migrations for a gorm dialect ("mysql" or "sqlite"), oldest first.
func Migrations(dialect string) ([]Migration, error) {
	dir, err := dirFor(dialect)
	if err != nil {
		return nil, err
	}
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version and '_'", name)
		}
		body, err := fs.ReadFile(files, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	return ms, nil
}

func dirFor(dialect string) (string, error) {
	switch dialect {
	case "mysql":
		return "mysql", nil
	case "sqlite":
		return "sqlite", nil
	}
	return "", fmt.Errorf("no migrations for database dialect %q", dialect)
}

// Latest is the version the code expects the database to be at.
func Latest(dialect string) (int, error) {
	ms, err := Migrations(dialect)
	if err != nil || len(ms) == 0 {
		return 0, err
	}
	return ms[len(ms)-1].Version, nil
}

// ErrNewer means the database's schema is at a version this build does not
// know: a newer release migrated it. Code that does not know a schema must
// not write to it, and there are no down migrations to undo it.
var ErrNewer = errors.New("database schema is newer than this build")

// Apply brings the database up to the latest version. Instances that start
// together take turns: on MySQL a named lock serialises them. A database
// with a migration this build does not know is refused (ErrNewer) before
// anything is applied.
func Apply(ctx context.Context, db *gorm.DB) (applied []int, err error) {
	dialect := db.Dialector.Name()
	ms, err := Migrations(dialect)
	if err != nil {
		return nil, err
	}
	err = db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		if dialect == "mysql" {
			var got int
			if err := conn.Raw("SELECT GET_LOCK('seckill_migrate', 60)").Scan(&got).Error; err != nil {
				return fmt.Errorf("take migration lock: %w", err)
			}
			if got != 1 {
				return fmt.Errorf("take migration lock: timed out")
			}
			defer conn.Exec("SELECT RELEASE_LOCK('seckill_migrate')")
		}
		if err := conn.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
			version INT NOT NULL PRIMARY KEY,
			name VARCHAR(200) NOT NULL,
			applied_at DATETIME(3) NOT NULL)`).Error; err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		var done []int
		if err := conn.Raw("SELECT version FROM schema_migrations").Scan(&done).Error; err != nil {
			return fmt.Errorf("read schema_migrations: %w", err)
		}
		if err := knows(ms, done); err != nil {
			return err
		}
		for _, m := range ms {
			if slices.Contains(done, m.Version) {
				continue
			}
			// MySQL commits DDL implicitly, so a migration is not atomic
			// there: each file is kept to statements that are safe to
			// reason about one by one.
			for _, stmt := range statements(m.SQL) {
				if err := conn.Exec(stmt).Error; err != nil {
					return fmt.Errorf("migration %s: %w", m.Name, err)
				}
			}
			if err := conn.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
				m.Version, m.Name, time.Now().UTC()).Error; err != nil {
				return fmt.Errorf("record migration %s: %w", m.Name, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	return applied, err
}

// knows returns ErrNewer, saying what to do, when a version was applied
// that is not among this build's migrations.
func knows(ms []Migration, done []int) error {
	latest := 0
	if len(ms) > 0 {
		latest = ms[len(ms)-1].Version
	}
	for _, v := range slices.Sorted(slices.Values(done)) {
		if !slices.ContainsFunc(ms, func(m Migration) bool { return m.Version == v }) {
			return fmt.Errorf("%w: the database has migration %d applied, this build knows migrations up to %d; "+
				"a newer release migrated it: run that release, or restore the database from a dump taken before the migration (there are no down migrations)",
				ErrNewer, v, latest)
		}
	}
	return nil
}

// Current reports the highest applied version, 0 when none is.
func Current(ctx context.Context, db *gorm.DB) (int, error) {
	var v *int
	err := db.WithContext(ctx).Raw("SELECT MAX(version) FROM schema_migrations").Scan(&v).Error
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if v == nil {
		return 0, nil
	}
	return *v, nil
}

// statements splits a migration file into statements: they end with ';' at
// the end of a line, and lines starting with "--" are comments.
func statements(src string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(src) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
