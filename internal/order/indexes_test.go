package order

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
	schema "seckill/sql"
)

// Every index of a table the worker writes for each order or batch costs
// each insert an entry more. indexUses says what each one is for: the
// queries of the product that read through it (each built by the very
// constant or function the product runs), and, for a key that refuses
// rows, the promise it keeps and the test that shows it. A table not here
// is not written per order: vouchers' stock updates touch only its
// primary key.
var indexUses = map[string]map[string]indexUse{
	"orders": {
		"PRIMARY": {
			queries: []indexQuery{{"the writer's owner of an order id (orderOfIDQuery)", func(tx *gorm.DB) *gorm.DB {
				return tx.Raw((&Writer{db: tx}).locking(orderOfIDQuery), 1234)
			}}},
			promise: "an order id is one order's: a message whose id another buyer's order holds is dead-lettered as a collision",
			test:    "TestWriterIDCollision",
		},
		"uniq_orders_live_buyer": {
			queries: []indexQuery{{"a buyer's newest orders (ByUser: newestOfBuyer)", func(tx *gorm.DB) *gorm.DB {
				return newestOfBuyer(tx.Model(&Order{}), 700, 20).Find(&[]Order{})
			}}},
			promise: "one live order per buyer and voucher: the writer's insert of a second one meets the key and dead-letters it (duplicate_buyer)",
			test:    "TestWriterGuardsDeadLetter",
		},
		"idx_orders_due": {
			queries: []indexQuery{{"the sweeper's page of overdue unpaid orders (overdueQuery)", func(tx *gorm.DB) *gorm.DB {
				return tx.Raw(overdueQuery, StatusAwaitingPayment, seedNow.Add(-time.Second), 0, 100)
			}}},
		},
		"idx_orders_unit_back": {
			queries: []indexQuery{{"the sweeper's page of units not back (unitsNotBack)", func(tx *gorm.DB) *gorm.DB {
				return unitsNotBack(tx.Model(&Order{}), 0, 100).Find(&[]Order{})
			}}},
		},
		"uniq_orders_code": {
			queries: []indexQuery{{"the console's order of a code (orderOfCodeQuery)", func(tx *gorm.DB) *gorm.DB {
				return tx.Raw(orderOfCodeQuery, seedCode(5))
			}}},
			promise: "a voucher code is one order's: a drawn code another order holds is drawn again",
			test:    "TestWithCodeDrawsAgain",
		},
		"idx_orders_voucher_accepted": {
			queries: []indexQuery{
				{"the console's purchases per second (recentPurchasesQuery)", func(tx *gorm.DB) *gorm.DB {
					return tx.Raw(recentPurchasesQuery, []int64{1, 2, 3, 4, 5, 6, 7, 8}, seedNow.Add(-FiguresWindow))
				}},
				{"the warmer's buyers of a voucher (liveOrdersOf)", func(tx *gorm.DB) *gorm.DB {
					return liveOrdersOf(tx.Model(&Order{}), 3).Find(&[]Order{})
				}},
			},
			promise: "the index fk_orders_voucher needs, led by voucher_id; the recount reads a voucher's orders through it (countOrders, FORCE INDEX)",
		},
	},
	"dead_letters": {
		"PRIMARY": {
			promise: "a letter's identity, by which an operator replays it",
			test:    "TestReplayDeadLetter",
		},
		"uniq_dead_letters_order": {
			queries: []indexQuery{{"the writer's letter under an order id (letterOfOrderQuery)", func(tx *gorm.DB) *gorm.DB {
				return tx.Raw((&Writer{db: tx}).locking(letterOfOrderQuery), 900_007)
			}}},
			promise: "one letter per order id: a letter meeting another buyer's under the id is kept by its message",
			test:    "TestWriterIDClashAcrossWorkers",
		},
		"uniq_dead_letters_message": {
			queries: []indexQuery{{"the writer's letter of a message (letterOfMessageQuery)", func(tx *gorm.DB) *gorm.DB {
				return tx.Raw((&Writer{db: tx}).locking(letterOfMessageQuery), "orders", "1-7")
			}}},
			promise: "one letter per stream message: a message another worker lettered meanwhile is not lettered twice",
			test:    "TestWriterMessageLetteredOnce",
		},
	},
	"order_counts": {
		"PRIMARY": {
			queries: []indexQuery{{"the counters of vouchers (countsOf)", func(tx *gorm.DB) *gorm.DB {
				return countsOf(tx, []int64{3}).Find(&[]map[string]any{})
			}}},
			promise: "one row per voucher, state, reason and slot, which the writer's upsert adds into: a voucher's counters stay a few rows (their sums would hold without it)",
		},
	},
}

// constraintUses says what each foreign key and check of those tables
// refuses, with a statement it must refuse on the seeded tables.
var constraintUses = map[string]map[string]constraintUse{
	"orders": {
		"fk_orders_voucher": {"an order of a voucher that does not exist",
			"INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (999999, 1, 77, NOW(3), NOW(3))"},
		"chk_orders_live": {"a state that disagrees with live: a cancelled order that holds its unit",
			"UPDATE orders SET status = 'cancelled' WHERE id = 1"},
		"chk_orders_amount": {"a negative amount",
			"UPDATE orders SET amount = -1 WHERE id = 1"},
	},
}

type indexUse struct {
	queries []indexQuery
	promise string
	test    string
}

// indexQuery builds a query of the product; EXPLAIN must choose the index
// for it.
type indexQuery struct {
	name  string
	build func(tx *gorm.DB) *gorm.DB
}

type constraintUse struct {
	refuses string
	violate string
}

// TestEveryIndexServesAQuery: on tables of a few thousand orders over
// vouchers and states, as a sale leaves them, every index of the tables
// the worker writes is named in indexUses and exists, and the optimizer
// reads each named query through its index; every foreign key and check
// is named in constraintUses and refuses what it says. A new index comes
// with the query or promise it is for; a dropped one leaves the test.
func TestEveryIndexServesAQuery(t *testing.T) {
	t.Parallel()
	g := testenv.DB(t, "mysql")
	if _, err := schema.Apply(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	seedIndexTables(t, g)
	tables := slices.Sorted(maps.Keys(indexUses))
	indexesNamed(t, g, tables)
	queriesReadTheirIndex(t, g, tables)
	constraintsRefuse(t, g, tables)
}

// indexesNamed checks that every index of the tables is in indexUses, a
// unique key with its promise and the test that shows it, and that
// every index indexUses names exists and is for something.
func indexesNamed(t *testing.T, g *gorm.DB, tables []string) {
	t.Helper()
	var have []struct {
		TableName, IndexName string
		NonUnique            bool
	}
	if err := g.Raw(`SELECT DISTINCT TABLE_NAME AS table_name, INDEX_NAME AS index_name, NON_UNIQUE AS non_unique FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ? ORDER BY TABLE_NAME, INDEX_NAME`, tables).Scan(&have).Error; err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, h := range have {
		exists[h.TableName+"."+h.IndexName] = true
		use, ok := indexUses[h.TableName][h.IndexName]
		switch {
		case !ok:
			t.Errorf("index %s of %s is for nothing indexUses names: add the query that needs it, or the promise it keeps, or drop it", h.IndexName, h.TableName)
		case !h.NonUnique && h.IndexName != "PRIMARY" && (use.promise == "" || use.test == ""):
			t.Errorf("unique key %s of %s: indexUses does not say what it refuses and which test shows it", h.IndexName, h.TableName)
		}
	}
	for _, table := range tables {
		for index, use := range indexUses[table] {
			if !exists[table+"."+index] {
				t.Errorf("index %s of %s is named in indexUses but the schema has none", index, table)
			}
			if len(use.queries) == 0 && use.promise == "" {
				t.Errorf("index %s of %s: no query and no promise", index, table)
			}
			if use.test != "" && !testExists(t, use.test) {
				t.Errorf("index %s of %s: the test of its promise, %s, does not exist", index, table, use.test)
			}
		}
	}
}

// queriesReadTheirIndex EXPLAINs each query of indexUses: the optimizer
// must read its table through the index.
func queriesReadTheirIndex(t *testing.T, g *gorm.DB, tables []string) {
	t.Helper()
	for _, table := range tables {
		for _, index := range slices.Sorted(maps.Keys(indexUses[table])) {
			for _, q := range indexUses[table][index].queries {
				sql := g.ToSQL(q.build)
				key, access, plan := chosenKey(t, g, sql, table)
				// A scan of the whole index (access index) names it
				// too, but searches nothing.
				if key != index || access == "index" || access == "ALL" {
					t.Errorf("index %s of %s: %s reads through %q (access %s), not a search of the index:\n  %s\n  %s", index, table, q.name, key, access, sql, plan)
				}
			}
		}
	}
}

// constraintsRefuse checks that every foreign key and check of the tables
// is in constraintUses, and each there exists and refuses its statement
// (the error names it).
func constraintsRefuse(t *testing.T, g *gorm.DB, tables []string) {
	t.Helper()
	var cons []struct{ TableName, ConstraintName string }
	if err := g.Raw(`SELECT TABLE_NAME AS table_name, CONSTRAINT_NAME AS constraint_name FROM information_schema.TABLE_CONSTRAINTS
		WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME IN ? AND CONSTRAINT_TYPE IN ('FOREIGN KEY', 'CHECK')`, tables).Scan(&cons).Error; err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, c := range cons {
		named[c.TableName+"."+c.ConstraintName] = true
		if _, ok := constraintUses[c.TableName][c.ConstraintName]; !ok {
			t.Errorf("constraint %s of %s: constraintUses does not say what it refuses", c.ConstraintName, c.TableName)
		}
	}
	for table, byName := range constraintUses {
		for name, use := range byName {
			if !named[table+"."+name] {
				t.Errorf("constraint %s of %s is named in constraintUses but the schema has none", name, table)
				continue
			}
			if err := g.Exec(use.violate).Error; err == nil || !strings.Contains(err.Error(), "`"+name+"`") {
				t.Errorf("constraint %s of %s did not refuse %s: %s: %v", name, table, use.refuses, use.violate, err)
			}
		}
	}
}

// chosenKey EXPLAINs sql and returns the key chosen for table, its access
// type (const, ref, range; index is a scan of the whole index), and the
// plan to show.
func chosenKey(t *testing.T, g *gorm.DB, sql, table string) (key, access, plan string) {
	t.Helper()
	var rows []map[string]any
	if err := g.Raw("EXPLAIN " + sql).Scan(&rows).Error; err != nil {
		t.Fatalf("EXPLAIN %s: %v", sql, err)
	}
	for _, r := range rows {
		plan += fmt.Sprintf("[table=%s type=%s key=%s rows=%s extra=%s] ", text(r["table"]), text(r["type"]), text(r["key"]), text(r["rows"]), text(r["Extra"]))
		if text(r["table"]) == table {
			key, access = text(r["key"]), text(r["type"])
		}
	}
	return key, access, plan
}

func text(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case []byte:
		return string(v)
	}
	return fmt.Sprint(v)
}

// testExists reports whether a test function of that name is in this
// package's tests or the schema's.
func testExists(t *testing.T, name string) bool {
	t.Helper()
	files, _ := filepath.Glob("*_test.go")
	more, _ := filepath.Glob(filepath.Join("..", "..", "sql", "*_test.go"))
	re := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(name) + `\(t \*testing\.T\)`)
	for _, f := range append(files, more...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if re.Match(b) {
			return true
		}
	}
	return false
}

// seedNow is the time the seeded sale is at.
var seedNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

func seedCode(i int) string { return fmt.Sprintf("C%09d", i) }

// seedIndexTables fills the tables the way an hour of a sale of eight
// vouchers leaves them, so that the optimizer weighs real ranges: 4,000
// orders, a buyer's few over several vouchers; most paid or used, with a
// code; a fifth awaiting payment, a few of those overdue; the ended ones
// nearly all with their unit back; 400 dead letters; the counters.
func seedIndexTables(t *testing.T, g *gorm.DB) {
	t.Helper()
	exec := func(q string, args ...any) {
		t.Helper()
		if err := g.Exec(q, args...).Error; err != nil {
			t.Fatalf("%.200s: %v", q, err)
		}
	}
	start := seedNow.Add(-time.Hour)
	for v := 1; v <= 8; v++ {
		exec("INSERT INTO vouchers (id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at) VALUES (?, 't', 1000, 500, 100000, 99000, ?, ?, ?, ?)",
			v, start, seedNow.Add(time.Hour), start, start)
	}
	const n = 4000
	var (
		b    strings.Builder
		args []any
	)
	flush := func() {
		if len(args) > 0 {
			exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at, status, live, amount, pay_deadline, paid_at, cancelled_at, cancel_reason, unit_back_at, code) VALUES "+
				strings.TrimSuffix(b.String(), ","), args...)
		}
		b.Reset()
		args = args[:0]
	}
	for i := 1; i <= n; i++ {
		at := start.Add(time.Duration(i) * time.Hour / n)
		var (
			status                                            = StatusPaid
			live                                          any = 1
			deadline, paid, cancelled, reason, back, code any
		)
		switch k := i % 20; {
		case k < 4: // awaiting payment, 15 minutes to pay: the last quarter hour's not due
			status, deadline = StatusAwaitingPayment, at.Add(15*time.Minute)
			if i < n*3/4 && i%50 != 1 {
				status, live, deadline, cancelled, reason, back = StatusCancelled, nil, nil, at.Add(15*time.Minute), CancelExpired, at.Add(15*time.Minute)
			}
		case k < 13:
			paid, code = at, seedCode(i)
		case k < 16:
			status, paid, code = StatusUsed, at, seedCode(i)
		case k < 19:
			status, live, cancelled, reason, back = StatusCancelled, nil, at, CancelByBuyer, at
			if i%200 == 17 {
				back = nil
			}
		default:
			status, live, cancelled, back = StatusRefunded, nil, at, at
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,?,?),")
		args = append(args, i, 1+i/3, 1+i%8, at, at, status, live, 500, deadline, paid, cancelled, reason, back, code)
		if i%500 == 0 {
			flush()
		}
	}
	flush()
	for i := 1; i <= 400; i++ {
		b.WriteString("(?,?,?,?,?,?,?,?),")
		args = append(args, "orders", fmt.Sprintf("1-%d", i), 900_000+i, 10_000+i, 1+i%8, ReasonOutOfStock, "{}", start.Add(time.Duration(i)*time.Second))
	}
	exec("INSERT INTO dead_letters (stream, message_id, order_id, user_id, voucher_id, reason, payload, created_at) VALUES "+strings.TrimSuffix(b.String(), ","), args...)
	for slot := range 4 {
		exec(`INSERT INTO order_counts (voucher_id, status, cancel_reason, slot, n, amount)
			SELECT voucher_id, status, COALESCE(cancel_reason, ''), ?, COUNT(*), COALESCE(SUM(amount), 0)
			FROM orders GROUP BY voucher_id, status, COALESCE(cancel_reason, '')`, slot)
	}
	exec("ANALYZE TABLE orders, dead_letters, order_counts")
}
