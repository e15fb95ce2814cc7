// Package apierr writes the JSON error bodies of the HTTP API. Every error a
// client sees has a stable machine-readable code and a human message; errors
// are translated into codes once, in the handler that meets them.
package apierr

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
)

// Body is the JSON shape of every error response.
type Body struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// OrderID is set with already_purchased: the order the caller holds.
	OrderID int64 `json:"order_id,omitempty,string"`
}

// Abort writes the error and stops the handler chain.
func Abort(c *gin.Context, status int, code, message string) {
	c.AbortWithStatusJSON(status, Body{Code: code, Message: message})
}

// BadRequest answers 400 bad_request.
func BadRequest(c *gin.Context, message string) {
	Abort(c, http.StatusBadRequest, "bad_request", message)
}

// Internal answers 500 internal; the cause is logged by the caller, never sent.
func Internal(c *gin.Context) {
	Abort(c, http.StatusInternalServerError, "internal", "internal error")
}

// Unavailable answers 503 with the given code.
func Unavailable(c *gin.Context, code, message string) {
	Abort(c, http.StatusServiceUnavailable, code, message)
}

// PathID reads a positive int64 path parameter; on anything else it answers
// 400 bad_request and reports false.
func PathID(c *gin.Context, name string) (int64, bool) {
	id, err := strconv.ParseInt(c.Param(name), 10, 64)
	if err != nil || id <= 0 {
		BadRequest(c, name+" must be a positive integer")
		return 0, false
	}
	return id, true
}

// DecodeJSON reads a request body of at most limit bytes holding exactly
// one JSON object with known fields only, into dst. On anything else it
// answers 400 bad_request (413 body_too_large past the limit) and reports
// false.
func DecodeJSON(c *gin.Context, limit int64, dst any) bool {
	body := http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			Abort(c, http.StatusRequestEntityTooLarge, "body_too_large", "the request body is too large")
			return false
		}
		BadRequest(c, "the body must be one JSON object with the documented fields")
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		BadRequest(c, "the body must hold exactly one JSON object")
		return false
	}
	return true
}
