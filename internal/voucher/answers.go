package voucher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
)

// The purchase route's common answers, encoded once. Nearly every press of
// a flash sale gets one of a few bodies: sold out, not started, ended, or
// one that differs only by an order id. Encoding them with json.Marshal on
// every press (reflection, a buffer, a copy) cost more than the rest of the
// handler; these are the bytes it wrote, byte for byte
// (TestAnswersAsEncoded holds them to it), with the same Content-Type.
var (
	soldOutAnswer    = errorAnswer("sold_out", "this voucher is sold out")
	notStartedAnswer = errorAnswer("not_started", "the sale has not started")
	endedAnswer      = errorAnswer("ended", "the sale has ended")

	// An order id goes between these: the encoding of apierr.Body with
	// code already_purchased, and of purchaseResponse.
	heldHead, heldTail         = aroundID(apierr.Body{Code: "already_purchased", Message: "you already hold an order for this voucher", OrderID: idMark})
	acceptedHead, acceptedTail = aroundID(purchaseResponse{OrderID: idMark, Status: "pending"})

	// jsonContentType is gin's Content-Type for JSON, shared by every
	// answer as gin shares its own.
	jsonContentType = []string{"application/json; charset=utf-8"}

	answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 128); return &b }}
)

// idMark is an order id whose encoding, "7", appears once in an answer.
const idMark = 7

func errorAnswer(code, message string) []byte {
	b, err := json.Marshal(apierr.Body{Code: code, Message: message})
	if err != nil {
		panic(err)
	}
	return b
}

// aroundID encodes v, whose order id is idMark, and returns what comes
// before the id's digits and what comes after them.
func aroundID(v any) (head, tail []byte) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	mark := []byte(`"` + strconv.Itoa(idMark) + `"`)
	if bytes.Count(b, mark) != 1 {
		panic(fmt.Sprintf("voucher: the order id is not once in %s", b))
	}
	i := bytes.Index(b, mark)
	return b[:i+1], b[i+len(mark)-1:]
}

// writeAnswer writes a JSON body encoded beforehand, as c.JSON would.
func writeAnswer(c *gin.Context, status int, body []byte) {
	if h := c.Writer.Header(); len(h["Content-Type"]) == 0 {
		h["Content-Type"] = jsonContentType
	}
	c.Status(status)
	_, _ = c.Writer.Write(body)
}

// writeWithID writes head, the order id, tail.
func writeWithID(c *gin.Context, status int, head []byte, id int64, tail []byte) {
	p := answerBufs.Get().(*[]byte)
	b := append((*p)[:0], head...)
	b = strconv.AppendInt(b, id, 10)
	b = append(b, tail...)
	writeAnswer(c, status, b)
	*p = b
	answerBufs.Put(p)
}
