package voucher

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestCreateRefusesPricedWhilePaymentsOff: with RefusePriced, a voucher
// with a price is refused with 422 payments_off and a message naming what
// turns payments on, before anything is stored (the store here has no
// database: reaching it would panic).
func TestCreateRefusesPricedWhilePaymentsOff(t *testing.T) {
	t.Parallel()
	h := NewHTTP(NewStore(nil), NewState(nil, NewKeys("", 1)), nil, nil, slog.New(slog.DiscardHandler))
	h.RefusePriced("set SECKILL_PAY_PROVIDER=webhook")
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/vouchers", h.Create)
	req := httptest.NewRequest(http.MethodPost, "/vouchers", strings.NewReader(
		`{"title":"10 off","face_value":1000,"price":500,"stock":5,"begin_at":"2026-01-01T00:00:00Z","end_at":"2099-01-01T00:00:00Z"}`))
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	var body struct{ Code, Message string }
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%d %s: %v", rec.Code, rec.Body, err)
	}
	if rec.Code != http.StatusUnprocessableEntity || body.Code != "payments_off" || !strings.Contains(body.Message, "SECKILL_PAY_PROVIDER") {
		t.Fatalf("priced voucher with payments off: %d %s", rec.Code, rec.Body)
	}
}
