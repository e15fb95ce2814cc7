package grow

import (
	"context"
	"strings"
	"testing"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestRunSmall: a growth run at two small sizes and a grown table, on
// real servers, measures every figure at every step (the rebuild checked
// to have written every buyer and reopened the shard, the reconcile to
// find no difference), gives each figure its slope over the buyers and
// over the table's rows, and leaves no database or key behind. Without a
// Worker no drain is measured (loadtest's TestGrowDrains measures them). A
// second run refuses a database that holds a table.
func TestRunSmall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, admin, name := testenv.MissingMySQLDatabase(t, "_grow")
	var log strings.Builder
	res, err := Run(ctx, Config{MySQLDSN: dsn, RedisURL: testenv.RedisURL(t), Sizes: []int{300, 1200}, TableRows: 4000, Purchases: 50, Log: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(res.Steps) != 3 {
		t.Fatalf("%d steps, want 3: %+v", len(res.Steps), res.Steps)
	}
	if last := res.Steps[2]; last.Buyers != 1200 || last.TableRows != 4000 {
		t.Errorf("the grown table's step: %d buyers, %d rows; want 1200 and 4000 (the purchases measured are not written)", last.Buyers, last.TableRows)
	}
	drains := 0
	for _, f := range Figures {
		if f.OverTable {
			drains++
		}
	}
	for _, s := range res.Steps {
		if s.Drain != (DrainCost{}) {
			t.Errorf("a drain at %d rows without a Worker: %+v", s.TableRows, s.Drain)
		}
		for _, f := range Figures {
			if f.Of(s) <= 0 && !f.OverTable {
				t.Errorf("%s at %d buyers, %d rows: %v", f.Name, s.Buyers, s.TableRows, f.Of(s))
			}
		}
		if s.BytesPerBuyer < 8 || s.BytesPerBuyer > 1000 {
			t.Errorf("%.1f bytes per buyer in Redis at %d buyers", s.BytesPerBuyer, s.Buyers)
		}
	}
	over := map[string]int{}
	for _, sl := range res.Slopes {
		over[sl.Over]++
	}
	if over["buyers"] != len(Figures)-drains || over["table_rows"] != len(Figures)-drains {
		t.Errorf("slopes %+v, want every figure but the drain's over buyers and over table rows", res.Slopes)
	}
	var dbs int
	if err := admin.QueryRow("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = ?", name).Scan(&dbs); err != nil || dbs != 0 {
		t.Errorf("database %s left after the run (%d, %v)", name, dbs, err)
	}
	keys, err := testenv.Redis(t).Keys(ctx, "grow*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("keys left after the run: %d, e.g. %s", len(keys), keys[0])
	}

	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec("CREATE TABLE `" + name + "`.shop (id BIGINT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, Config{MySQLDSN: dsn, RedisURL: testenv.RedisURL(t), Sizes: []int{10}}); err == nil || !strings.Contains(err.Error(), "database of its own") {
		t.Errorf("a run on a database holding a table: %v, want refused", err)
	}
}

// TestSVG: the figures over the buyers are drawn over the steps of
// distinct buyers, the drain's (dashed) over every step's table rows, and
// the axis ticks each decade the sizes span; a run of one step draws an
// empty frame.
func TestSVG(t *testing.T) {
	t.Parallel()
	step := func(buyers int, rows int64, k float64) Step {
		return Step{Buyers: buyers, TableRows: rows, RebuildSeconds: k, BytesPerBuyer: 80, PurchaseRedisMicros: 100, FiguresMillis: k,
			SweepMillis: k, ReconcileMillis: k, Drain: DrainCost{TableRows: rows, Orders: 20, Worker: 50, Redis: 20, MariaDB: 30 * k, Total: 100 + 30*k}}
	}
	res := Result{Steps: []Step{step(1e4, 1e4, 1), step(1e5, 1.3e5, 10), step(1e6, 1.15e6, 100), step(1e6, 1e7, 200)}}
	svg := string(SVG(res))
	if n := strings.Count(svg, "<polyline"); n != len(Figures) {
		t.Errorf("%d curves, want %d:\n%s", n, len(Figures), svg)
	}
	if n := strings.Count(svg, `stroke-dasharray="6 3"/>`+"\n"); n != 3 {
		t.Errorf("%d dashed curves, want the drain's 3", n)
	}
	for _, tick := range []string{">10^4<", ">10^5<", ">10^6<", ">10^7<"} {
		if !strings.Contains(svg, tick) {
			t.Errorf("no tick %s", tick)
		}
	}
	if one := string(SVG(Result{Steps: res.Steps[:1]})); strings.Contains(one, "<polyline") {
		t.Errorf("one step drew a curve:\n%s", one)
	}
}
