package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/voucher"
)

const specPath = "../../docs/openapi.yaml"

// loadSpec reads docs/openapi.yaml and checks it is a valid OpenAPI 3
// document.
func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		t.Fatalf("load %s: %v", specPath, err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", specPath, err)
	}
	return doc
}

// specOps lists the documented operations of one listener as
// "METHOD /path/{param}". A path serves the main listener unless its
// x-listeners says otherwise.
func specOps(doc *openapi3.T, listener string) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		listeners := []any{"main"}
		if v, ok := item.Extensions["x-listeners"].([]any); ok {
			listeners = v
		}
		if !slices.Contains(listeners, any(listener)) {
			continue
		}
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

var ginParam = regexp.MustCompile(`[:*]([A-Za-z0-9_]+)`)

// engineOps lists an engine's routes the same way: ":id" and "*file"
// become "{id}" and "{file}".
func engineOps(r *gin.Engine) []string {
	var out []string
	for _, rt := range r.Routes() {
		out = append(out, rt.Method+" "+ginParam.ReplaceAllString(rt.Path, "{$1}"))
	}
	slices.Sort(out)
	return out
}

// routeEngines builds the two routers exactly as run does, on clients
// that are never called.
func routeEngines(t testing.TB, env map[string]string) (apiR, adminR *gin.Engine) {
	t.Helper()
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	signer, err := auth.NewSigner([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	keys := voucher.NewKeys("", 1)
	m := metrics.New()
	apiR = apiEngine(log, m, deps{
		cfg: cfg, log: log, rdb: rdb, signer: signer, keys: keys,
		vouchers: voucher.NewHTTP(voucher.NewStore(nil), voucher.NewState(rdb, keys), voucher.NewReserver(rdb, keys), nil, log),
		orders:   order.NewHTTP(nil, nil, rdb, keys, log),
		health:   &health{rdb: rdb},
		stdout:   io.Discard,
	})
	adminR = adminEngine(log, m, signer, &admin{})
	return apiR, adminR
}

// TestOpenAPICoversRoutes: every route of both routers is documented, and
// every documented operation is a route, with the web page on and off.
func TestOpenAPICoversRoutes(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	mainOn, admin := routeEngines(t, map[string]string{"SECKILL_WEB": "on"})
	mainOff, _ := routeEngines(t, map[string]string{"SECKILL_WEB": "off"})

	compare := func(what string, routes, documented []string) {
		t.Helper()
		for _, r := range routes {
			if !slices.Contains(documented, r) {
				t.Errorf("%s route %s is not in %s", what, r, specPath)
			}
		}
		for _, d := range documented {
			if !slices.Contains(routes, d) {
				t.Errorf("%s documents %s, which the %s router does not serve", specPath, d, what)
			}
		}
	}
	compare("main", engineOps(mainOn), specOps(doc, "main"))
	compare("admin", engineOps(admin), specOps(doc, "admin"))
	// With the page off, exactly the web routes go.
	var web []string
	for _, op := range specOps(doc, "main") {
		if !slices.Contains(engineOps(mainOff), op) {
			web = append(web, op)
		}
	}
	for _, op := range web {
		if tags := operation(doc, op).Tags; !slices.Contains(tags, "web") {
			t.Errorf("%s disappears with SECKILL_WEB=off but is not tagged web", op)
		}
	}
}

func operation(doc *openapi3.T, op string) *openapi3.Operation {
	method, path, _ := strings.Cut(op, " ")
	return doc.Paths.Find(path).GetOperation(method)
}

// exchange is one real request to the running service and what the
// document must say about it.
type exchange struct {
	method, path string            // path is the documented template
	url          string            // relative to the listener
	params       map[string]string // path parameters
	token        string
	body         any // JSON-encoded when not nil; a string is sent as is
	hdr          map[string]string
	admin        bool // the admin listener
	badRequest   bool // the request breaks the document on purpose
	status       int
}

// TestOpenAPIAnswers sends the main routes' typical and error requests to a
// running service and checks each request and answer against the document:
// status documented, headers, content type and body schema.
func TestOpenAPIAnswers(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	outbox := t.TempDir() + "/outbox"
	const phone = "+8613900139000"
	o := startObserved(t, map[string]string{
		"SECKILL_LOGIN_SENDER": "file", "SECKILL_LOGIN_OUTBOX": outbox, "SECKILL_ADMIN_PHONES": phone,
	})
	adminTok, userTok := token(t, 1, auth.RoleAdmin), token(t, 77, auth.RoleUser)
	vid := createVoucher(t, o.base, 1)
	vidS := fmt.Sprint(vid)
	now := time.Now().UTC()
	newVoucher := map[string]any{
		"title": "ten off", "face_value": 1000, "stock": 5,
		"begin_at": now.Add(time.Hour).Format(time.RFC3339), "end_at": now.Add(2 * time.Hour).Format(time.RFC3339),
	}
	upcoming := int64(0)
	pid := map[string]string{"id": vidS}
	buy := "/api/v1/vouchers/" + vidS + "/orders"

	steps := []exchange{
		{method: "GET", path: "/healthz", status: 200},
		{method: "GET", path: "/readyz", status: 200},
		{method: "GET", path: "/", status: 200},
		{method: "HEAD", path: "/", status: 200},
		{method: "GET", path: "/static/{file}", url: "/static/app.js", params: map[string]string{"file": "/app.js"}, status: 200},
		{method: "HEAD", path: "/static/{file}", url: "/static/app.css", params: map[string]string{"file": "/app.css"}, status: 200},
		{method: "GET", path: "/static/{file}", url: "/static/nope.js", params: map[string]string{"file": "/nope.js"}, status: 404},
		{method: "GET", path: "/docs", status: 200},
		{method: "GET", path: "/openapi.yaml", status: 200},
		{method: "GET", path: "/openapi.json", status: 200},
		{method: "GET", path: "/metrics", status: 200},
		{method: "GET", path: "/metrics", hdr: map[string]string{"X-Forwarded-For": "198.51.100.1"}, status: 404},
		{method: "GET", path: "/metrics", admin: true, status: 200},

		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: newVoucher, status: 201},
		{method: "POST", path: "/api/v1/vouchers", token: userTok, body: newVoucher, status: 403},
		{method: "POST", path: "/api/v1/vouchers", body: newVoucher, status: 401},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: `{"title":`, badRequest: true, status: 400},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: map[string]any{"title": "x", "face_value": 1, "stock": 0,
			"begin_at": now.Format(time.RFC3339), "end_at": now.Add(time.Hour).Format(time.RFC3339)}, badRequest: true, status: 422},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: `{"title":"` + strings.Repeat("x", 20<<10) + `"}`, badRequest: true, status: 413},
		{method: "GET", path: "/api/v1/vouchers", url: "/api/v1/vouchers?limit=5", status: 200},
		{method: "GET", path: "/api/v1/vouchers", url: "/api/v1/vouchers?limit=0", badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/" + vidS, params: pid, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/987654321", params: map[string]string{"id": "987654321"}, status: 404},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/x", params: map[string]string{"id": "x"}, badRequest: true, status: 400},

		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: buy, params: pid, token: userTok, status: 202},
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: buy, params: pid, token: userTok, status: 409},                     // already_purchased
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: buy, params: pid, token: token(t, 78, auth.RoleUser), status: 409}, // sold_out
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: buy, params: pid, status: 401},
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/0/orders", params: map[string]string{"id": "0"}, token: userTok, badRequest: true, status: 400},
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/987654321/orders", params: map[string]string{"id": "987654321"}, token: userTok, status: 404},
		// upcoming: the voucher made above, filled in below.
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", params: map[string]string{}, token: userTok, status: 403},

		{method: "GET", path: "/api/v1/orders/{id}", token: userTok, status: 200}, // the order bought above, filled in below
		{method: "GET", path: "/api/v1/orders/{id}", url: "/api/v1/orders/123", params: map[string]string{"id": "123"}, token: userTok, status: 404},
		{method: "GET", path: "/api/v1/orders/{id}", url: "/api/v1/orders/123", params: map[string]string{"id": "123"}, status: 401},
		{method: "GET", path: "/api/v1/users/me/orders", token: userTok, status: 200},
		{method: "GET", path: "/api/v1/users/me/orders", url: "/api/v1/users/me/orders?limit=900", token: userTok, badRequest: true, status: 400},

		{method: "POST", path: "/api/v1/auth/code", body: map[string]any{"phone": "12"}, status: 422},
		{method: "POST", path: "/api/v1/auth/code", body: map[string]any{"phone": phone}, status: 202},
		{method: "POST", path: "/api/v1/auth/code", body: map[string]any{"phone": phone}, status: 429}, // resend too soon
		{method: "POST", path: "/api/v1/auth/login", body: map[string]any{"phone": phone, "code": "12"}, badRequest: true, status: 422},
		{method: "POST", path: "/api/v1/auth/login", body: map[string]any{"phone": phone, "code": "000000"}, status: 401},
		{method: "POST", path: "/api/v1/auth/login", body: map[string]any{"phone": phone, "code": "x"}, status: 200}, // the code, filled in below

		{method: "GET", path: "/admin/dlq", admin: true, token: adminTok, status: 200},
		{method: "GET", path: "/admin/dlq", admin: true, token: userTok, status: 403},
		{method: "GET", path: "/admin/dlq", admin: true, status: 401},
		{method: "GET", path: "/admin/reconcile", admin: true, token: adminTok, status: 200},
		{method: "POST", path: "/admin/dlq/{id}/replay", url: "/admin/dlq/999/replay", params: map[string]string{"id": "999"}, admin: true, token: adminTok, status: 404},
	}

	checked := map[string]bool{}
	var orderID string
	for i := range steps {
		s := &steps[i]
		switch {
		case s.path == "/api/v1/vouchers/{id}/orders" && s.status == 403:
			s.params["id"] = fmt.Sprint(upcoming)
			s.url = fmt.Sprintf("/api/v1/vouchers/%d/orders", upcoming)
		case s.path == "/api/v1/orders/{id}" && s.url == "":
			s.params = map[string]string{"id": orderID}
			s.url = "/api/v1/orders/" + orderID
		case s.path == "/api/v1/auth/login" && s.status == 200:
			s.body = map[string]any{"phone": phone, "code": lastOutboxCode(t, outbox, phone)}
		}
		if s.url == "" {
			s.url = s.path
		}
		base := o.base
		if s.admin {
			base = o.admin
		}
		status, body := checkExchange(t, doc, base, *s)
		checked[s.method+" "+s.path] = true
		switch {
		case s.path == "/api/v1/vouchers" && status == 201:
			var created struct{ Voucher struct{ ID int64 } }
			_ = json.Unmarshal(body, &created)
			upcoming = created.Voucher.ID
		case s.path == "/api/v1/vouchers/{id}/orders" && status == 202:
			var acc struct {
				OrderID string `json:"order_id"`
			}
			_ = json.Unmarshal(body, &acc)
			orderID = acc.OrderID
		}
	}

	// Answers no route owns.
	for _, c := range []struct {
		method, url, response string
		status                int
	}{
		{"GET", "/api/v1/nowhere", "NotFound", 404},
		{"DELETE", "/api/v1/vouchers", "MethodNotAllowed", 405},
	} {
		req, _ := http.NewRequest(c.method, o.base+c.url, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v any
		_ = json.Unmarshal(b, &v)
		schema := doc.Components.Responses[c.response].Value.Content.Get("application/json").Schema.Value
		if resp.StatusCode != c.status || schema.VisitJSON(v) != nil {
			t.Errorf("%s %s: %d %s does not match components.responses.%s", c.method, c.url, resp.StatusCode, b, c.response)
		}
	}

	// Every operation of the main listener had a real answer checked.
	for _, op := range specOps(doc, "main") {
		if !checked[op] {
			t.Errorf("no real answer of %s was checked", op)
		}
	}
}

// checkExchange makes the request and checks it and its answer against the
// document; it returns the status and body.
func checkExchange(t testing.TB, doc *openapi3.T, base string, s exchange) (int, []byte) {
	t.Helper()
	name := fmt.Sprintf("%s %s (want %d)", s.method, s.url, s.status)
	var reqBody []byte
	switch b := s.body.(type) {
	case nil:
	case string:
		reqBody = []byte(b)
	default:
		reqBody, _ = json.Marshal(b)
	}
	req, err := http.NewRequest(s.method, base+s.url, bytes.NewReader(reqBody))
	if err != nil {
		t.Fatal(err)
	}
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	for k, v := range s.hdr {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != s.status {
		t.Errorf("%s: answered %d %s", name, resp.StatusCode, body)
	}

	item := doc.Paths.Find(s.path)
	if item == nil || item.GetOperation(s.method) == nil {
		t.Errorf("%s: %s %s is not documented", name, s.method, s.path)
		return resp.StatusCode, body
	}
	route := &routers.Route{Spec: doc, Path: s.path, PathItem: item, Method: s.method, Operation: item.GetOperation(s.method)}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}
	// The request as the document sees it: a fresh copy with its body.
	vreq, _ := http.NewRequest(s.method, base+s.url, bytes.NewReader(reqBody))
	vreq.Header = req.Header.Clone()
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: s.params, Route: route, Options: opts}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case s.badRequest && reqErr == nil:
		t.Errorf("%s: a request meant to break the document passes it", name)
	case !s.badRequest && reqErr != nil:
		t.Errorf("%s: the request does not match the document: %v", name, reqErr)
	}

	header := resp.Header.Clone()
	if s.method == http.MethodHead {
		// No body: only the status and headers are checked.
		opts.ExcludeResponseBody = true
	} else if ct := header.Get("Content-Type"); ct != "" {
		// The document names media types without parameters.
		if mt, _, err := mime.ParseMediaType(ct); err == nil {
			header.Set("Content-Type", mt)
		}
	}
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: header,
		Body: io.NopCloser(bytes.NewReader(body)), Options: opts,
	})
	if err != nil {
		t.Errorf("%s: the answer does not match the document: %v\n%.500s", name, err, body)
	}
	return resp.StatusCode, body
}
