package payment

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	testenv.Main(m)
}

// secret is the test gateway's shared secret.
var secret = []byte("a-gateway-secret-of-32-bytes-xyz")

// env is one database (MariaDB or SQLite) with a voucher on sale, Redis,
// the order lifecycle and a token signer: what the payment routes need.
type env struct {
	db      *gorm.DB
	life    *order.Lifecycle
	orders  *order.HTTP
	signer  *auth.Signer
	voucher int64
	price   int64
	nextID  *atomic.Int64
}

// databases are the two the service runs on.
var databases = []string{"mariadb", "sqlite"}

// eachDB runs f on a fresh env of each database, in parallel.
func eachDB(t *testing.T, f func(t *testing.T, e env)) {
	t.Helper()
	for _, name := range databases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newEnv(t, name))
		})
	}
}

func newEnv(t *testing.T, dialect string) env {
	t.Helper()
	g := testenv.DB(t, dialect)
	ctx := context.Background()
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	// The shard is ready, as after the service's warm-up: a cancelled
	// order's unit goes back to Redis only in a ready shard.
	if err := voucher.NewState(rdb, keys).MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	life := order.NewLifecycle(g, rdb, keys, order.LifecycleConfig{}, log)
	signer, err := auth.NewSigner([]byte("a-token-secret-of-at-least-32-bytes!"))
	if err != nil {
		t.Fatal(err)
	}
	v := voucher.Voucher{Title: "t", FaceValue: 5000, Price: 1990, TotalStock: 1000, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	next := new(atomic.Int64)
	next.Store(1 << 40)
	return env{db: g, life: life, orders: order.NewHTTP(order.NewStore(g), life, rdb, keys, log), signer: signer, voucher: v.ID, price: v.Price, nextID: next}
}

// order writes an order awaiting payment for user, due at deadline, as the
// writer would: live, its unit taken from the voucher's stock.
func (e env) order(t testing.TB, user int64, deadline time.Time) int64 {
	t.Helper()
	now := time.Now().UTC()
	live := 1
	dl := deadline.UTC()
	o := order.Order{ID: e.nextID.Add(1), UserID: user, VoucherID: e.voucher, AcceptedAt: now, CreatedAt: now,
		Status: order.StatusAwaitingPayment, Live: &live, Amount: e.price, PayDeadline: &dl}
	err := e.db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		return tx.Exec("UPDATE vouchers SET stock = stock - 1 WHERE id = ? AND stock > 0", e.voucher).Error
	})
	if err != nil {
		t.Fatal(err)
	}
	return o.ID
}

// payment writes a created webhook payment of the order, as Pay would.
func (e env) payment(t testing.TB, orderID int64) Payment {
	t.Helper()
	now := time.Now().UTC()
	p := Payment{OrderID: orderID, Provider: ProviderWebhook, Reference: "ref-" + strconv.FormatInt(orderID, 10), Amount: e.price, Status: StatusCreated, CreatedAt: now, UpdatedAt: now}
	if err := e.db.Create(&p).Error; err != nil {
		t.Fatal(err)
	}
	return p
}

func (e env) getOrder(t testing.TB, id int64) order.Order {
	t.Helper()
	var o order.Order
	if err := e.db.Where("id = ?", id).Take(&o).Error; err != nil {
		t.Fatal(err)
	}
	return o
}

func (e env) payments(t testing.TB, orderID int64) []Payment {
	t.Helper()
	var ps []Payment
	if err := e.db.Where("order_id = ?", orderID).Order("id").Find(&ps).Error; err != nil {
		t.Fatal(err)
	}
	return ps
}

func (e env) count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.db.Raw(query, args...).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// conserved checks the voucher's units: total stock = stock + live orders.
func (e env) conserved(t testing.TB) {
	t.Helper()
	total := e.count(t, "SELECT total_stock FROM vouchers WHERE id = ?", e.voucher)
	stock := e.count(t, "SELECT stock FROM vouchers WHERE id = ?", e.voucher)
	live := e.count(t, "SELECT COUNT(*) FROM orders WHERE voucher_id = ? AND live = 1", e.voucher)
	if total != stock+live {
		t.Fatalf("total stock %d, stock %d + live orders %d", total, stock, live)
	}
}

// service is the payment handlers behind the routes the API serves them on.
type service struct {
	h      *HTTP
	router *gin.Engine
	e      env
}

func (e env) service(t testing.TB, cfg Config) service {
	t.Helper()
	h, err := New(e.db, e.orders, e.life, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	api := r.Group("/api/v1")
	api.POST("/payments/notify", h.Notify)
	api.POST("/orders/:id/pay", e.signer.Middleware(), h.Pay)
	api.POST("/orders/:id/refund", e.signer.Middleware(), auth.RequireAdmin(), h.Refund)
	api.GET("/orders/:id", e.signer.Middleware(), e.orders.Show)
	admin := api.Group("/admin", e.signer.Middleware(), auth.RequireAdmin())
	admin.GET("/refunds", h.Refunds)
	admin.POST("/payments/:id/refunded", h.MarkRefunded)
	return service{h: h, router: r, e: e}
}

func (s service) do(t testing.TB, req *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	s.router.ServeHTTP(w, req)
	return w
}

// as sends a request with a token of the user (an admin's with admin).
func (s service) as(t testing.TB, user int64, admin bool, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	role := auth.RoleUser
	if admin {
		role = auth.RoleAdmin
	}
	tok, err := s.e.signer.Mint(auth.Identity{UserID: user, Role: role}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(method, path, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	return s.do(t, req)
}

func (s service) pay(t testing.TB, user, orderID int64) *httptest.ResponseRecorder {
	t.Helper()
	return s.as(t, user, false, http.MethodPost, "/api/v1/orders/"+strconv.FormatInt(orderID, 10)+"/pay")
}

// notify delivers a notification signed with key at ts.
func (s service) notify(t testing.TB, n Notification, key []byte, ts time.Time) *httptest.ResponseRecorder {
	t.Helper()
	body, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	return s.notifyRaw(t, body, key, ts)
}

func (s service) notifyRaw(t testing.TB, body, key []byte, ts time.Time) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/api/v1/payments/notify", bytes.NewReader(body))
	stamp := strconv.FormatInt(ts.Unix(), 10)
	req.Header.Set(auth.WebhookTimestampHeader, stamp)
	req.Header.Set(auth.WebhookSignatureHeader, auth.Sign(key, stamp, body))
	return s.do(t, req)
}

// answer decodes a JSON answer, failing unless its status is want.
func answer[T any](t testing.TB, w *httptest.ResponseRecorder, want int) T {
	t.Helper()
	var v T
	if w.Code != want {
		t.Fatalf("answered %d %s, want %d", w.Code, w.Body.String(), want)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("answer %s: %v", w.Body.String(), err)
	}
	return v
}

type errBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// refused checks an error answer's status and code.
func refused(t testing.TB, w *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if got := answer[errBody](t, w, status); got.Code != code {
		t.Fatalf("answered code %q (%s), want %q", got.Code, got.Message, code)
	}
}

// webhookConfig is the webhook provider with a gateway at url.
func webhookConfig(url string, obs Observer) Config {
	return Config{Provider: ProviderWebhook, GatewayURL: url, Secret: secret, Observer: obs}
}

// outcomes counts what the observer heard.
type outcomes struct {
	succeeded, needsRefund, duplicate, refused atomic.Int64
	paid, refunded                             atomic.Int64
}

func (o *outcomes) Moved(move string) {
	switch move {
	case order.Pay.String():
		o.paid.Add(1)
	case order.Refund.String():
		o.refunded.Add(1)
	}
}

func (o *outcomes) Payment(outcome string) {
	switch outcome {
	case OutcomeSucceeded:
		o.succeeded.Add(1)
	case OutcomeNeedsRefund:
		o.needsRefund.Add(1)
	case OutcomeDuplicate:
		o.duplicate.Add(1)
	case OutcomeRefused:
		o.refused.Add(1)
	}
}
