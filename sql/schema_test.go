package schema_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/testenv"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func checkApply(t *testing.T, g *gorm.DB) {
	t.Helper()
	ctx := context.Background()
	applied, err := schema.Apply(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	latest, _ := schema.Latest(g.Dialector.Name())
	if len(applied) == 0 || applied[len(applied)-1] != latest {
		t.Fatalf("applied %v, want up to %d", applied, latest)
	}
	again, err := schema.Apply(ctx, g)
	if err != nil || len(again) != 0 {
		t.Fatalf("second apply: %v, %v; want nothing to do", again, err)
	}
	if v, err := schema.Current(ctx, g); err != nil || v != latest {
		t.Fatalf("current %d, %v", v, err)
	}
	// The constraints are in the schema: negative stock and a second order
	// of one buyer are refused by the database itself.
	if err := g.Exec(`INSERT INTO vouchers (id, title, face_value, total_stock, stock, begin_at, end_at, created_at, updated_at)
		VALUES (1, 't', 0, 1, 1, '2026-01-01 00:00:00', '2027-01-01 00:00:00', '2026-01-01 00:00:00', '2026-01-01 00:00:00')`).Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("UPDATE vouchers SET stock = -1 WHERE id = 1").Error; err == nil {
		t.Error("negative stock accepted")
	}
	if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (1, 9, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:00')").Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (2, 9, 1, '2026-01-01 00:00:00', '2026-01-01 00:00:00')").Error; err == nil {
		t.Error("second order of one buyer accepted")
	}
	if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (3, 8, 77, '2026-01-01 00:00:00', '2026-01-01 00:00:00')").Error; err == nil {
		t.Error("order for an unknown voucher accepted")
	}
}

func TestApplyMySQL(t *testing.T) {
	t.Parallel()
	g, err := db.OpenMySQL(testenv.MySQLDSN(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	checkApply(t, g)
}

func TestApplySQLite(t *testing.T) {
	t.Parallel()
	g, err := db.OpenSQLite(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	checkApply(t, g)
}

func TestMigrationsMatchAcrossDialects(t *testing.T) {
	t.Parallel()
	my, err := schema.Migrations("mysql")
	if err != nil {
		t.Fatal(err)
	}
	lite, err := schema.Migrations("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	if len(my) != len(lite) {
		t.Fatalf("%d mysql migrations, %d sqlite", len(my), len(lite))
	}
	for i := range my {
		if my[i].Version != lite[i].Version || my[i].Name != lite[i].Name {
			t.Errorf("migration %d: %s vs %s", i, my[i].Name, lite[i].Name)
		}
	}
}

// TestApplyRefusesNewerSchema: a database with a migration this build does
// not know (a newer release migrated it) is refused, saying so with both
// versions, before anything is applied, even a migration of its own the
// database lacks.
func TestApplyRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	g, err := db.OpenSQLite(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	ctx := context.Background()
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	latest, _ := schema.Latest("sqlite")
	future := latest + 1
	if err := g.Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", future, "future.sql", time.Now().UTC()).Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("DELETE FROM schema_migrations WHERE version = ?", latest).Error; err != nil {
		t.Fatal(err)
	}
	applied, err := schema.Apply(ctx, g)
	if !errors.Is(err, schema.ErrNewer) || len(applied) != 0 {
		t.Fatalf("apply on a newer schema: applied %v, %v; want nothing and ErrNewer", applied, err)
	}
	for _, want := range []string{fmt.Sprintf("migration %d applied", future), fmt.Sprintf("up to %d", latest), "run that release"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	if v, err := schema.Current(ctx, g); err != nil || v != future {
		t.Fatalf("current %d, %v; want %d, nothing applied", v, err, future)
	}
}

// TestApplyAsServiceAccountWithBinlog: the migrations apply as the
// account the operating guide tells operators to make (ALL on its
// database, no SUPER) on a server with the binary log on, as a replicated
// primary runs. The draw commitment's trigger is a stored program: the
// server refuses it until log_bin_trust_function_creators is on, and
// Apply says so, having applied everything before it (its migration is
// its own, so nothing is half done); once the variable is on, the next
// Apply adds it, and the trigger refuses the account a change of a set
// commitment.
func TestApplyAsServiceAccountWithBinlog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := testenv.StartMariaDBWith(t, testenv.MariaDBOptions{LogBin: true})
	m.Exec(t, "CREATE DATABASE svc")
	m.Exec(t, "CREATE USER 'svc'@'%' IDENTIFIED BY 'pw'")
	m.Exec(t, "GRANT ALL PRIVILEGES ON svc.* TO 'svc'@'%'")
	g, err := db.OpenMySQL("svc:pw@tcp("+m.Addr+")/svc?parseTime=true", 2)
	if err != nil {
		t.Fatal(err)
	}
	_, err = schema.Apply(ctx, g)
	if err == nil || !strings.Contains(err.Error(), "0015_draw_commitment_once") || !strings.Contains(err.Error(), "log_bin_trust_function_creators") {
		t.Fatalf("Apply without log_bin_trust_function_creators: %v; want migration 0015 refused, naming the variable", err)
	}
	if v, err := schema.Current(ctx, g); err != nil || v != 14 {
		t.Fatalf("after the refusal the schema is at %d (%v), want 14", v, err)
	}
	m.Exec(t, "SET GLOBAL log_bin_trust_function_creators = ON")
	if applied, err := schema.Apply(ctx, g); err != nil || len(applied) != 1 || applied[0] != 15 {
		t.Fatalf("Apply with the variable on: %v, %v; want 15 applied", applied, err)
	}
	if err := g.Exec("INSERT INTO vouchers (id, title, face_value, total_stock, stock, begin_at, end_at, created_at, updated_at, fair_window_ms, draw_commitment) " +
		"VALUES (1, 't', 1, 1, 1, NOW(), NOW() + INTERVAL 1 HOUR, NOW(), NOW(), 1000, 'c1')").Error; err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("UPDATE vouchers SET draw_commitment = 'c2' WHERE id = 1").Error; err == nil {
		t.Fatal("the service account changed a set commitment")
	}
}
