package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/failover"
	"seckill/internal/order"
	"seckill/internal/testenv"
)

// loseOrders takes orders out of the database as a failover to a replica
// that never received them does: the rows gone, their units back in the
// stock, the counters as before.
func loseOrders(t *testing.T, g *gorm.DB, voucherID int64, ids ...int64) {
	t.Helper()
	res := g.Exec("DELETE FROM orders WHERE id IN ?", ids)
	if res.Error != nil || res.RowsAffected != int64(len(ids)) {
		t.Fatalf("lose orders %v: %v (%d rows)", ids, res.Error, res.RowsAffected)
	}
	if err := g.Exec("UPDATE vouchers SET stock = stock + ? WHERE id = ?", len(ids), voucherID).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := order.RecountAll(context.Background(), g); err != nil {
		t.Fatal(err)
	}
}

// repaired runs "api reconcile --repair" and returns the orders it
// queued again.
func repaired(t *testing.T, getenv func(string) string) []int64 {
	t.Helper()
	var out, logs bytes.Buffer
	// The differences found before the orders are written again fail it:
	// what it printed is the result.
	_ = run(context.Background(), []string{"api", "reconcile", "--repair"}, getenv, &out, &logs)
	var got struct {
		Repaired struct {
			Requeued []failover.ID  `json:"requeued"`
			Failed   map[int]string `json:"failed_shards"`
		} `json:"repaired"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("api reconcile --repair printed %q (%v); log:\n%s", &out, err, &logs)
	}
	if len(got.Repaired.Failed) != 0 {
		t.Fatalf("api reconcile --repair failed shards %v", got.Repaired.Failed)
	}
	ids := make([]int64, len(got.Repaired.Requeued))
	for i, id := range got.Repaired.Requeued {
		ids[i] = int64(id)
	}
	slices.Sort(ids)
	return ids
}

// buyerOf reads an order's buyer from the database, 0 while there is none.
func buyerOf(t *testing.T, g *gorm.DB, id int64) int64 {
	t.Helper()
	var user int64
	if err := g.Raw("SELECT user_id FROM orders WHERE id = ?", id).Scan(&user).Error; err != nil {
		t.Fatal(err)
	}
	return user
}

// TestReconcileRepairEmbedded: in the embedded mode (in-process Redis,
// SQLite), the database loses a written order; "api reconcile" reports
// the difference, "api reconcile --repair" asks the running service to
// write it back (its admin listener), and the order is written again with
// its id and buyer; reconcile then reports nothing.
func TestReconcileRepairEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := map[string]string{
		"SECKILL_MYSQL_DSN": "", "SECKILL_REDIS_URL": "", "SECKILL_DATA_DIR": dir,
		"SECKILL_ADMIN_ADDR": freeAddr(t), "SECKILL_LOG_LEVEL": "warn",
	}
	s := startWeb(t, env)
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		if k == "SECKILL_TOKEN_SECRET" {
			return testSecret
		}
		return ""
	}
	a := sendJSON(t, "POST", s.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "repair", "face_value": 100, "stock": 5,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if a.status != 201 {
		t.Fatalf("create voucher: %d %s", a.status, a.raw)
	}
	vid := int64(a.body["voucher"].(map[string]any)["id"].(float64))
	var ids []int64
	for _, user := range []int64{42, 43} {
		b := sendJSON(t, "POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", s.base, vid), token(t, user, auth.RoleUser), nil)
		if b.status != 202 {
			t.Fatalf("buyer %d: %d %s", user, b.status, b.raw)
		}
		var id int64
		if _, err := fmt.Sscan(b.body["order_id"].(string), &id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	g, err := db.OpenSQLite(filepath.Join(dir, "seckill.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	testenv.WaitFor(t, 20*time.Second, "both orders written", func() bool { return buyerOf(t, g, ids[0]) == 42 && buyerOf(t, g, ids[1]) == 43 })

	loseOrders(t, g, vid, ids[0])
	var out bytes.Buffer
	if err := run(context.Background(), []string{"api", "reconcile"}, getenv, &out, &out); err == nil {
		t.Fatalf("api reconcile after the loss: no error\n%s", &out)
	}
	if got := repaired(t, getenv); !slices.Equal(got, ids[:1]) {
		t.Fatalf("api reconcile --repair queued %v again; want %v", got, ids[:1])
	}
	testenv.WaitFor(t, 20*time.Second, "the lost order written again", func() bool { return buyerOf(t, g, ids[0]) == 42 })
	out.Reset()
	testenv.WaitFor(t, 20*time.Second, "api reconcile reporting nothing", func() bool {
		out.Reset()
		return run(context.Background(), []string{"api", "reconcile"}, getenv, &out, &out) == nil
	})
}
