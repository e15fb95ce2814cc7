package order

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/db"
)

// validCode reports whether code is a voucher code as newCode draws them.
func validCode(code *string) bool {
	if code == nil {
		return false
	}
	n, ok := NormalizeCode(*code)
	return ok && n == *code
}

// TestCodeOnEveryPaidOrder: 200 orders of a priced voucher, none with a
// code while awaiting payment; 200 goroutines released at once pay 180 of
// them and cancel 20. Every paid order has a code, no two the same; the
// cancelled ones have none; a repeated pay keeps the code; the unique key
// refuses a code another order holds.
func TestCodeOnEveryPaidOrder(t *testing.T) {
	t.Parallel()
	const orders, cancels = 200, 20
	eachLifeDB(t, 990, orders, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		ps := make([]purchase, orders)
		for i := range ps {
			ps[i] = e.reserve(t, e.v.ID)
		}
		e.write(t, ps...)
		for _, p := range ps {
			if o := e.order(t, p.order); o.Status != StatusAwaitingPayment || o.Code != nil {
				t.Fatalf("order written: %s code %v; want awaiting payment, no code", describe(o), o.Code)
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, p := range ps {
			a := Pay
			if i < cancels {
				a = Cancel
			}
			wg.Go(func() {
				<-start
				if _, _, err := e.life.Do(ctx, a, p.order); err != nil {
					t.Errorf("%s order %d: %v", a, p.order, err)
				}
			})
		}
		close(start)
		wg.Wait()
		seen := map[string]int64{}
		for i, p := range ps {
			o := e.order(t, p.order)
			if i < cancels {
				if o.Status != StatusCancelled || o.Code != nil {
					t.Fatalf("cancelled order: %s code %v; want no code", describe(o), o.Code)
				}
				continue
			}
			if o.Status != StatusPaid || !validCode(o.Code) {
				t.Fatalf("paid order: %s code %v; want a code", describe(o), o.Code)
			}
			if other, dup := seen[*o.Code]; dup {
				t.Fatalf("orders %d and %d both have code %s", other, o.ID, *o.Code)
			}
			seen[*o.Code] = o.ID
		}
		// A repeat pay, and a redeem, keep the code.
		p := ps[cancels]
		code := *e.order(t, p.order).Code
		for _, a := range []Action{Pay, Redeem, Redeem} {
			o, _, err := e.life.Do(ctx, a, p.order)
			if err != nil {
				t.Fatal(err)
			}
			if o.Code == nil || *o.Code != code {
				t.Fatalf("after %s: code %v, want %s", a, o.Code, code)
			}
		}
		// The unique key is the last guard.
		err := e.db.Exec("UPDATE orders SET code = ? WHERE id = ?", code, ps[cancels+1].order).Error
		if !db.IsDuplicate(err) {
			t.Fatalf("a second order took code %s: %v", code, err)
		}
	})
}

// TestCodeOfFreeOrders: orders of a free voucher are written paid with a
// code each, in the writer's batch and one at a time.
func TestCodeOfFreeOrders(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 0, 60, func(t *testing.T, e lifeEnv) {
		ps := make([]purchase, 50)
		for i := range ps {
			ps[i] = e.reserve(t, e.v.ID)
		}
		e.write(t, ps...)
		ps = append(ps, e.buy(t))
		seen := map[string]bool{}
		for _, p := range ps {
			o := e.order(t, p.order)
			if o.Status != StatusPaid || !validCode(o.Code) || seen[*o.Code] {
				t.Fatalf("free order: %s code %v; want paid with a code of its own", describe(o), o.Code)
			}
			seen[*o.Code] = true
		}
	})
}

// TestWithCodeDrawsAgain: a code another order holds is drawn again; a
// duplicate of another key is the answer at once.
func TestWithCodeDrawsAgain(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 0, 5, func(t *testing.T, e lifeEnv) {
		a, b := e.buy(t).order, e.buy(t).order
		calls := 0
		err := withCode(e.db, func(code string) error {
			calls++
			if calls == 1 { // another order takes the code drawn first
				if err := e.db.Exec("UPDATE orders SET code = ? WHERE id = ?", code, a).Error; err != nil {
					return err
				}
			}
			return e.db.Exec("UPDATE orders SET code = ? WHERE id = ?", code, b).Error
		})
		if err != nil || calls != 2 || *e.order(t, a).Code == *e.order(t, b).Code {
			t.Fatalf("withCode: %v after %d calls; want a second draw that succeeds", err, calls)
		}
		calls = 0
		dupErr := e.db.Exec("INSERT INTO vouchers (id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at) SELECT id, title, face_value, price, total_stock, stock, begin_at, end_at, created_at, updated_at FROM vouchers").Error
		if !db.IsDuplicate(dupErr) {
			t.Fatalf("want a duplicate key error, got %v", dupErr)
		}
		err = withCode(e.db, func(string) error { calls++; return dupErr })
		if !errors.Is(err, dupErr) || calls != 1 {
			t.Fatalf("withCode on another key's duplicate: %v after %d calls; want it at once", err, calls)
		}
	})
}

// TestWithCodeDrawsAgainPastTheSnapshot: on MariaDB a transaction reads
// from its snapshot; a code another transaction committed after that
// snapshot is refused by the unique key all the same, and must be seen as
// taken (drawn again), not answered as some other key's duplicate (the
// writer would then take the order for a buyer's second one).
func TestWithCodeDrawsAgainPastTheSnapshot(t *testing.T) {
	t.Parallel()
	e := newLifeEnv(t, "mariadb", 0, 5)
	a, b := e.buy(t).order, e.buy(t).order
	calls := 0
	err := e.db.Transaction(func(tx *gorm.DB) error {
		var n int64
		if err := tx.Raw("SELECT COUNT(*) FROM orders").Scan(&n).Error; err != nil { // the snapshot
			return err
		}
		return withCode(tx, func(code string) error {
			calls++
			if calls == 1 { // another transaction takes the code drawn first, and commits
				if err := e.db.Exec("UPDATE orders SET code = ? WHERE id = ?", code, a).Error; err != nil {
					return err
				}
			}
			return tx.Exec("UPDATE orders SET code = ? WHERE id = ?", code, b).Error
		})
	})
	if err != nil || calls != 2 || *e.order(t, a).Code == *e.order(t, b).Code {
		t.Fatalf("withCode: %v after %d calls; want a second draw that succeeds", err, calls)
	}
}

// TestNormalizeCode: what a cashier types.
func TestNormalizeCode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ABCDE23456": "ABCDE23456", "abcde-23456": "ABCDE23456", " abcde 23456 ": "ABCDE23456",
		"ABCDE2345": "", "ABCDE234567": "", "ABCDE2345O": "", "ABCDE23451": "", "ABCDE2345I": "", "": "",
	} {
		got, ok := NormalizeCode(in)
		if got != want || ok != (want != "") {
			t.Errorf("NormalizeCode(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for range 100 {
		if c := newCode(); !validCode(&c) {
			t.Fatalf("newCode drew %q", c)
		}
	}
}

// redeemEngine serves the redeem-by-code route of the env.
func redeemEngine(e lifeEnv) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	h := NewHTTP(NewStore(e.db), e.life, e.rdb, e.keys, slog.New(slog.DiscardHandler))
	r.POST("/redeem", h.RedeemCode)
	return r
}

func redeem(r http.Handler, code string) (int, map[string]any) {
	body, _ := json.Marshal(map[string]string{"code": code})
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/redeem", strings.NewReader(string(body))))
	var out map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out
}

// TestRedeemByCode: 100 cashiers released at once redeem one code (typed
// in lower case with a dash): exactly one 200 with the order used, the
// others 409 code_used with the time it was used. An unknown code is 404;
// a refunded order's code 409 wrong_state.
func TestRedeemByCode(t *testing.T) {
	t.Parallel()
	const cashiers = 100
	eachLifeDB(t, 990, 5, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		r := redeemEngine(e)
		p := e.buy(t)
		o, _, err := e.life.Do(ctx, Pay, p.order)
		if err != nil {
			t.Fatal(err)
		}
		typed := strings.ToLower((*o.Code)[:5] + "-" + (*o.Code)[5:])
		start := make(chan struct{})
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			counts = map[int]int{}
			usedAt = map[string]bool{}
		)
		for range cashiers {
			wg.Go(func() {
				<-start
				st, body := redeem(r, typed)
				mu.Lock()
				defer mu.Unlock()
				counts[st]++
				switch st {
				case http.StatusOK:
					if body["status"] != StatusUsed || body["code"] != *o.Code {
						t.Errorf("200 body %v; want the order used", body)
					}
				case http.StatusConflict:
					at, _ := body["used_at"].(string)
					if body["code"] != "code_used" || at == "" {
						t.Errorf("409 body %v; want code_used with used_at", body)
					}
					usedAt[at] = true
				}
			})
		}
		close(start)
		wg.Wait()
		if counts[http.StatusOK] != 1 || counts[http.StatusConflict] != cashiers-1 {
			t.Fatalf("answers %v; want one 200 and %d 409", counts, cashiers-1)
		}
		used := e.order(t, p.order)
		if used.Status != StatusUsed || used.UsedAt == nil || len(usedAt) != 1 || !usedAt[used.UsedAt.UTC().Format(time.RFC3339Nano)] {
			t.Fatalf("order %s; the refusals said used at %v", describe(used), usedAt)
		}
		if st, body := redeem(r, "ZZZZZZZZZZ"); st != http.StatusNotFound || body["code"] != "code_not_found" {
			t.Fatalf("unknown code: %d %v", st, body)
		}
		if st, body := redeem(r, "not a code"); st != http.StatusNotFound {
			t.Fatalf("not a code: %d %v", st, body)
		}
		q := e.buy(t)
		paid, _, err := e.life.Do(ctx, Pay, q.order)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := e.life.Do(ctx, Refund, q.order); err != nil {
			t.Fatal(err)
		}
		if st, body := redeem(r, *paid.Code); st != http.StatusConflict || body["code"] != "wrong_state" {
			t.Fatalf("refunded order's code: %d %v", st, body)
		}
	})
}
