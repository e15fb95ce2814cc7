package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/testenv"
)

// TestVoucherWindowKeptToTheMillisecond creates vouchers whose windows are
// shorter than a millisecond, on MariaDB and on SQLite. Times are stored to
// the millisecond, so a window inside one millisecond is empty: it is
// refused with 422 invalid_voucher (not a 503 from the database's check)
// and nothing is created. A window that crosses a millisecond boundary is
// one millisecond long once stored, and is created as stored. Vouchers at
// every other limit the validation allows are stored too: nothing it lets
// through meets a CHECK constraint or a column limit of either database.
func TestVoucherWindowKeptToTheMillisecond(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mysql", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"SECKILL_LOG_LEVEL": "warn"}
			dir := t.TempDir()
			if dialect == "sqlite" {
				env["SECKILL_MYSQL_DSN"], env["SECKILL_DATA_DIR"] = "", dir
			}
			s := startWeb(t, env)
			var g *gorm.DB
			if dialect == "sqlite" {
				var err error
				if g, err = db.OpenSQLite(filepath.Join(dir, "seckill.db")); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close(g) })
			} else {
				g = s.db(t)
			}
			rdb := testenv.Redis(t)
			admin := token(t, 1, auth.RoleAdmin)
			// A whole second in the future, in a zone other than UTC.
			base := time.Now().Add(time.Hour).Truncate(time.Second).In(time.FixedZone("", 8*3600))
			at := func(d time.Duration) string { return base.Add(d).Format(time.RFC3339Nano) }
			body := func(begin, end string) map[string]any {
				return map[string]any{"title": "window", "face_value": 100, "stock": 5, "begin_at": begin, "end_at": end}
			}

			before := s.snapshot(t, rdb, g)
			for _, w := range [][2]time.Duration{
				{100 * time.Microsecond, 900 * time.Microsecond},
				{0, 999_999 * time.Nanosecond},
				{time.Millisecond + time.Nanosecond, 2*time.Millisecond - time.Nanosecond},
			} {
				a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", admin, body(at(w[0]), at(w[1])))
				if a.status != 422 || a.code() != "invalid_voucher" {
					t.Errorf("window %v to %v: %d %s, want 422 invalid_voucher", w[0], w[1], a.status, a.raw)
				}
			}
			if d := before.diff(s.snapshot(t, rdb, g)); len(d) > 0 {
				t.Fatalf("refused vouchers changed state: %v", d)
			}

			a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", admin, body(at(900*time.Microsecond), at(1100*time.Microsecond)))
			if a.status != 201 {
				t.Fatalf("window across a millisecond: %d %s", a.status, a.raw)
			}
			v, _ := a.body["voucher"].(map[string]any)
			wantBegin, wantEnd := base.UTC().Format(time.RFC3339Nano), base.Add(time.Millisecond).UTC().Format(time.RFC3339Nano)
			if v["begin_at"] != wantBegin || v["end_at"] != wantEnd {
				t.Fatalf("created window %v to %v, want %s to %s", v["begin_at"], v["end_at"], wantBegin, wantEnd)
			}
			var row struct{ BeginAt, EndAt time.Time }
			if err := g.Table("vouchers").Select("begin_at, end_at").Where("id = ?", v["id"]).Take(&row).Error; err != nil {
				t.Fatal(err)
			}
			if !row.BeginAt.Equal(base) || !row.EndAt.Equal(base.Add(time.Millisecond)) {
				t.Fatalf("stored window %v to %v, want %v and a millisecond", row.BeginAt, row.EndAt, base.UTC())
			}

			for name, b := range map[string]map[string]any{
				"title of 200 four-byte runes, padded": {"title": " \t" + strings.Repeat("\U0001F600", 200) + "\n ", "face_value": 0, "stock": 1,
					"begin_at": "2000-01-01T00:00:00Z", "end_at": "2099-12-31T23:59:59.999999999Z"},
				"largest face value and stock": {"title": "max", "face_value": 1_000_000_000, "stock": 10_000_000,
					"begin_at": "2000-01-01T08:00:00.0000001+08:00", "end_at": "2100-01-01T07:59:59.9999+08:00"},
			} {
				if a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", admin, b); a.status != 201 {
					t.Errorf("%s: %d %s, want 201", name, a.status, a.raw)
				}
			}
		})
	}
}
