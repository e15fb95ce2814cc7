package main

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
)

// lockedBuffer is a log destination safe for concurrent handlers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// rawRequest sends head (a request line and headers, CRLF-ended, without
// the blank line) and body on a new connection and returns the response.
func rawRequest(t *testing.T, addr, head, body string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := io.WriteString(conn, head+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// TestRequestID: the id a client or nginx sends is answered and logged
// whatever the header's spelling; a missing or junk one is replaced by 16
// hex digits, new on every request; at warn no access line is written.
func TestRequestID(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
		t.Run(level.String(), func(t *testing.T) {
			t.Parallel()
			var logs lockedBuffer
			r := newEngine(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: level})))
			r.GET("/x", func(c *gin.Context) { c.Status(http.StatusNoContent) })
			srv := httptest.NewServer(r)
			t.Cleanup(srv.Close)
			addr := strings.TrimPrefix(srv.URL, "http://")

			for _, spelling := range []string{"X-Request-ID", "x-request-id", "X-REQUEST-ID"} {
				resp := rawRequest(t, addr, "GET /x HTTP/1.1\r\nHost: x\r\n"+spelling+": nginx-req:42.a_b\r\n", "")
				if got := resp.Header.Get("X-Request-ID"); got != "nginx-req:42.a_b" {
					t.Errorf("sent as %s: answered %q", spelling, got)
				}
			}
			made := map[string]bool{}
			hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
			for _, sent := range []string{"", "Bearer abc", strings.Repeat("a", 65), "a\"b"} {
				for range 50 {
					req, _ := http.NewRequest("GET", srv.URL+"/x", nil)
					if sent != "" {
						req.Header["X-Request-Id"] = []string{sent}
					}
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					_ = resp.Body.Close()
					got := resp.Header.Get("X-Request-ID")
					if !hex16.MatchString(got) || made[got] {
						t.Fatalf("sent %q: answered %q (seen before: %v), want 16 new hex digits", sent, got, made[got])
					}
					made[got] = true
				}
			}
			lines := strings.Count(logs.String(), `"msg":"request"`)
			if level == slog.LevelWarn && lines != 0 {
				t.Errorf("%d access lines at warn, want none", lines)
			}
			if level == slog.LevelInfo {
				if want := 3 + len(made); lines != want {
					t.Errorf("%d access lines at info, want %d", lines, want)
				}
				if !strings.Contains(logs.String(), `"request_id":"nginx-req:42.a_b"`) {
					t.Errorf("the id sent is not in the access log:\n%s", logs.String())
				}
			}
		})
	}
}

// TestBodyLimitWithoutLength: a body over the bound is refused whether it
// says its length or comes chunked; a request without a body reaches the
// handler.
func TestBodyLimitWithoutLength(t *testing.T) {
	t.Parallel()
	r := newEngine(slog.New(slog.DiscardHandler))
	r.POST("/x", func(c *gin.Context) {
		n, err := io.Copy(io.Discard, c.Request.Body)
		if err != nil {
			c.Status(http.StatusRequestEntityTooLarge)
			return
		}
		c.String(http.StatusOK, "%d", n)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	big := strings.Repeat("a", maxBody+1)
	chunked := strconv.FormatInt(int64(len(big)), 16) + "\r\n" + big + "\r\n0\r\n\r\n"
	for _, tc := range []struct {
		name, head, body string
		want             int
	}{
		{"no body", "POST /x HTTP/1.1\r\nHost: x\r\n", "", http.StatusOK},
		{"zero length", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n", "", http.StatusOK},
		{"length over the bound", "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n", big, http.StatusRequestEntityTooLarge},
		{"chunked over the bound", "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n", chunked, http.StatusRequestEntityTooLarge},
	} {
		if got := rawRequest(t, addr, tc.head, tc.body).StatusCode; got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
