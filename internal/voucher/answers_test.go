package voucher

import (
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

// answered is what a handler wrote: status, headers, body, and whether it
// aborted the chain.
type answered struct {
	status  int
	header  http.Header
	body    string
	aborted bool
}

func answerOf(f func(c *gin.Context)) answered {
	gin.SetMode(gin.ReleaseMode)
	w := httptest.NewRecorder()
	c, _ := gin.CreateTestContext(w)
	c.Request = httptest.NewRequest(http.MethodPost, "/api/v1/vouchers/1/orders", nil)
	c.Writer.Header().Set("X-Before", "kept") // set by a middleware before the handler
	f(c)
	c.Writer.WriteHeaderNow()
	return answered{status: w.Code, header: w.Header(), body: w.Body.String(), aborted: c.IsAborted()}
}

// checkAnswer holds the answer to err to what encoding want with
// c.AbortWithStatusJSON writes.
func checkAnswer(t *testing.T, h *HTTP, err error, status int, want apierr.Body, outcome string) {
	t.Helper()
	var got string
	a := answerOf(func(c *gin.Context) { got = h.answer(c, 1, 0, err) })
	b := answerOf(func(c *gin.Context) { c.AbortWithStatusJSON(status, want) })
	if !reflect.DeepEqual(a, b) || got != outcome {
		t.Fatalf("answer to %v: %+v (%s)\nencoded:  %+v (%s)", err, a, got, b, outcome)
	}
}

// TestAnswersAsEncoded: the purchase answers encoded beforehand are the
// bytes, headers and status c.JSON writes for the same values, whatever
// the order id.
func TestAnswersAsEncoded(t *testing.T) {
	t.Parallel()
	h := NewHTTP(nil, nil, nil, nil, slog.New(slog.DiscardHandler))
	checkAnswer(t, h, ErrSoldOut, http.StatusConflict, apierr.Body{Code: "sold_out", Message: "this voucher is sold out"}, "sold_out")
	checkAnswer(t, h, &NotStartedError{Until: 5}, http.StatusForbidden, apierr.Body{Code: "not_started", Message: "the sale has not started"}, "not_started")
	checkAnswer(t, h, ErrEnded, http.StatusForbidden, apierr.Body{Code: "ended", Message: "the sale has ended"}, "ended")
	ids := []int64{0, 1, 7, 77, 9, 10, -1, -7, math.MaxInt64, math.MinInt64, 1796091320123456789}
	for range 200 {
		ids = append(ids, rand.Int64(), rand.Int64N(1<<20))
	}
	for _, id := range ids {
		checkAnswer(t, h, &PurchasedError{OrderID: id}, http.StatusConflict,
			apierr.Body{Code: "already_purchased", Message: "you already hold an order for this voucher", OrderID: id}, "already_purchased")
		a := answerOf(func(c *gin.Context) { writeWithID(c, http.StatusAccepted, acceptedHead, id, acceptedTail) })
		b := answerOf(func(c *gin.Context) { c.JSON(http.StatusAccepted, purchaseResponse{OrderID: id, Status: "pending"}) })
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("accepted order %d: %+v\nencoded: %+v", id, a, b)
		}
	}
	// A wrapped refusal is answered as the refusal.
	checkAnswer(t, h, errors.Join(errors.New("x"), ErrSoldOut), http.StatusConflict, apierr.Body{Code: "sold_out", Message: "this voucher is sold out"}, "sold_out")
}

// FuzzAcceptedAnswer: any order id is answered as c.JSON encodes it.
func FuzzAcceptedAnswer(f *testing.F) {
	f.Add(int64(7))
	f.Add(int64(-1))
	f.Fuzz(func(t *testing.T, id int64) {
		a := answerOf(func(c *gin.Context) { writeWithID(c, http.StatusConflict, heldHead, id, heldTail) })
		b := answerOf(func(c *gin.Context) {
			c.JSON(http.StatusConflict, apierr.Body{Code: "already_purchased", Message: "you already hold an order for this voucher", OrderID: id})
		})
		if id != 0 && !reflect.DeepEqual(a, b) {
			t.Fatalf("order %d: %+v\nencoded: %+v", id, a, b)
		}
		a = answerOf(func(c *gin.Context) { writeWithID(c, http.StatusAccepted, acceptedHead, id, acceptedTail) })
		b = answerOf(func(c *gin.Context) { c.JSON(http.StatusAccepted, purchaseResponse{OrderID: id, Status: "pending"}) })
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("order %d: %+v\nencoded: %+v", id, a, b)
		}
	})
}
