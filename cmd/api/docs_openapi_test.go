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
	"net/http/httptest"
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
	"seckill/internal/draw"
	"seckill/internal/metrics"
	"seckill/internal/order"
	"seckill/internal/payment"
	"seckill/internal/testenv"
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
	versions := auth.NewVersions(nil) // never called: no request carries an admin token
	guard := auth.NewGuard(signer, versions, log)
	apiR = apiEngine(log, m, deps{
		cfg: cfg, log: log, rdb: rdb, signer: signer, guard: guard, versions: versions, keys: keys,
		vouchers: voucher.NewHTTP(voucher.NewStore(nil), voucher.NewState(rdb, keys), voucher.NewReserver(rdb, keys), nil, log),
		orders:   order.NewHTTP(nil, nil, rdb, keys, log),
		health:   &health{rdb: rdb},
		stdout:   io.Discard,
	})
	adminR = adminEngine(log, m, guard, &admin{})
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
	// prep fills in what only earlier answers know, just before sending.
	prep func(s *exchange)
}

// withField is a copy of body with one more field.
func withField(body map[string]any, k string, v any) map[string]any {
	out := map[string]any{k: v}
	for k, v := range body {
		out[k] = v
	}
	return out
}

// orderAt points an exchange at the order route path (with its {id}) for id.
func orderAt(s *exchange, id string) {
	s.params = map[string]string{"id": id}
	s.url = strings.Replace(s.path, "{id}", id, 1)
}

// createPriced puts a priced voucher on sale now and returns its id.
func createPriced(t testing.TB, base string, stock int, price int64) string {
	t.Helper()
	status, body := call(t, "POST", base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "priced", "face_value": 2000, "price": price, "stock": stock,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if status != http.StatusCreated || body["redis_ready"] != true {
		t.Fatalf("create priced voucher: %d %v", status, body)
	}
	v := body["voucher"].(map[string]any)
	if v["price"] != float64(price) {
		t.Fatalf("created voucher shows price %v, want %d", v["price"], price)
	}
	return fmt.Sprint(int64(v["id"].(float64)))
}

// buyWritten buys voucher vid as tok and waits until the worker wrote the
// order; it returns the order id.
func buyWritten(t testing.TB, base, vid, tok string) string {
	t.Helper()
	status, body := call(t, "POST", base+"/api/v1/vouchers/"+vid+"/orders", tok, nil)
	id, _ := body["order_id"].(string)
	if status != http.StatusAccepted || id == "" {
		t.Fatalf("buy voucher %s: %d %v", vid, status, body)
	}
	testenv.WaitFor(t, 10*time.Second, "order "+id+" written", func() bool {
		_, o := call(t, "GET", base+"/api/v1/orders/"+id, tok, nil)
		return o["status"] == "awaiting_payment"
	})
	return id
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
		"SECKILL_PAY_PROVIDER": "dev",
	})
	adminTok, userTok := token(t, 1, auth.RoleAdmin), token(t, 77, auth.RoleUser)
	admin2Tok := token(t, 2, auth.RoleAdmin)
	vid := createVoucher(t, o.base, 1)
	vidS := fmt.Sprint(vid)
	now := time.Now().UTC()
	newVoucher := map[string]any{
		"title": "ten off", "face_value": 1000, "stock": 5,
		"begin_at": now.Add(time.Hour).Format(time.RFC3339), "end_at": now.Add(2 * time.Hour).Format(time.RFC3339),
	}
	upcoming := int64(0)
	pid := map[string]string{"id": vidS}
	// A fair voucher whose draw takes entries for the next 90 minutes.
	st, fv := call(t, "POST", o.base+"/api/v1/vouchers", adminTok, withField(newVoucher, "fair_window_ms", 1_800_000))
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher: %d %v", st, fv)
	}
	fair := fmt.Sprint(fv["voucher"].(map[string]any)["id"])
	fairID := map[string]string{"id": fair}
	// Two whose entries take a proof of work: one opening in an hour
	// (no challenge yet, entries refused as not started), one now.
	st, lv := call(t, "POST", o.base+"/api/v1/vouchers", adminTok, withField(withField(newVoucher, "fair_window_ms", 1_800_000), "pow_bits", 16))
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher with a proof of work: %d %v", st, lv)
	}
	laterID := map[string]string{"id": fmt.Sprint(lv["voucher"].(map[string]any)["id"])}
	if _, ok := lv["voucher"].(map[string]any)["draw"].(map[string]any)["challenge"]; ok {
		t.Fatalf("a draw opening in an hour shows its challenge: %v", lv)
	}
	opens := time.Now().Add(time.Second)
	st, pv := call(t, "POST", o.base+"/api/v1/vouchers", adminTok, map[string]any{"title": "ten off", "face_value": 1000, "stock": 5,
		"fair_window_ms": 1_800_000, "pow_bits": 16, "begin_at": opens.Format(time.RFC3339Nano), "end_at": opens.Add(time.Hour).Format(time.RFC3339Nano)})
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher with a proof of work opening now: %d %v", st, pv)
	}
	powID := map[string]string{"id": fmt.Sprint(pv["voucher"].(map[string]any)["id"])}
	var challenge string
	testenv.WaitFor(t, 10*time.Second, "the draw's challenge published", func() bool {
		_, d := call(t, "GET", o.base+"/api/v1/vouchers/"+powID["id"]+"/draw", "", nil)
		challenge, _ = d["draw"].(map[string]any)["challenge"].(string)
		return challenge != ""
	})
	wrongPow := "1"
	for draw.PowOK(challenge, 77, wrongPow, 16) {
		wrongPow += "1"
	}
	buy := "/api/v1/vouchers/" + vidS + "/orders"
	// A draw that closes 3 s from now, entered by two buyers: done within
	// seconds, its answers checked once it is (waitDone).
	begin := now.Add(-time.Minute).Truncate(time.Second)
	st, dv := call(t, "POST", o.base+"/api/v1/vouchers", adminTok, map[string]any{
		"title": "drawn", "face_value": 1000, "stock": 1, "fair_window_ms": now.Add(3 * time.Second).Sub(begin).Milliseconds(),
		"begin_at": begin.Format(time.RFC3339), "end_at": now.Add(time.Hour).Format(time.RFC3339),
	})
	if st != http.StatusCreated {
		t.Fatalf("create a fair voucher closing soon: %d %v", st, dv)
	}
	drawn := fmt.Sprint(dv["voucher"].(map[string]any)["id"])
	drawnID := map[string]string{"id": drawn}
	drawnAt := "/api/v1/vouchers/" + drawn + "/draw"
	for _, u := range []int64{91, 92} {
		if st, body := call(t, "POST", o.base+"/api/v1/vouchers/"+drawn+"/orders", token(t, u, auth.RoleUser), nil); st != http.StatusAccepted || body["status"] != "entered" {
			t.Fatalf("user %d enters the draw closing soon: %d %v", u, st, body)
		}
	}
	waitDone := func(*exchange) {
		testenv.WaitFor(t, 30*time.Second, "the draw of voucher "+drawn+" done", func() bool {
			_, body := call(t, "GET", o.base+drawnAt, "", nil)
			d, _ := body["draw"].(map[string]any)
			return d != nil && d["status"] == "done"
		})
	}
	etagOf := func(url string) func(*exchange) {
		return func(s *exchange) {
			resp, err := client.Get(o.base + url)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			s.hdr = map[string]string{"If-None-Match": resp.Header.Get("ETag")}
		}
	}

	// A priced sale: orders await payment. cancelled is cancelled by its
	// buyer, used is paid then redeemed, refunded is paid then refunded.
	priced := createPriced(t, o.base, 3, 1500)
	cancelTok, usedTok, refundTok := userTok, token(t, 79, auth.RoleUser), token(t, 80, auth.RoleUser)
	cancelled := buyWritten(t, o.base, priced, cancelTok)
	used := buyWritten(t, o.base, priced, usedTok)
	refunded := buyWritten(t, o.base, priced, refundTok)
	var paymentID string // used's payment, from its pay answer
	// coded is paid, then redeemed by its voucher code.
	codedTok := token(t, 83, auth.RoleUser)
	var coded string
	codeOf := func(id, tok string) string {
		t.Helper()
		_, v := call(t, "GET", o.base+"/api/v1/orders/"+id, tok, nil)
		c, _ := v["code"].(string)
		if c == "" {
			t.Fatalf("order %s has no code: %v", id, v)
		}
		return c
	}
	redeemCode := func(id, tok string) func(*exchange) {
		return func(s *exchange) { s.body = map[string]any{"code": strings.ToLower(codeOf(id, tok))} }
	}
	at := func(id string) func(*exchange) { return func(s *exchange) { orderAt(s, id) } }
	notifyBody := `{"notification_id":"n1","reference":"pay_x","amount":1500,"status":"succeeded"}`
	signed := map[string]string{"X-Seckill-Timestamp": fmt.Sprint(now.Unix()), "X-Seckill-Signature": "sha256=" + strings.Repeat("0", 64)}

	steps := []exchange{
		{method: "GET", path: "/healthz", status: 200},
		{method: "GET", path: "/readyz", status: 200},
		{method: "GET", path: "/", status: 200},
		{method: "HEAD", path: "/", status: 200},
		{method: "GET", path: "/admin", status: 200},
		{method: "HEAD", path: "/admin", status: 200},
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
		// buckets: "auto" is 1 on one server; past the shards (1 here) 422;
		// another type 400.
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", "auto"), status: 201},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", 1), status: 201},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", 2), status: 422},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", 65), badRequest: true, status: 422},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", "many"), badRequest: true, status: 400},
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "buckets", 2.5), badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers", url: "/api/v1/vouchers?limit=5", status: 200},
		{method: "GET", path: "/api/v1/vouchers", url: "/api/v1/vouchers?limit=0", badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/" + vidS, params: pid, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/987654321", params: map[string]string{"id": "987654321"}, status: 404},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/x", params: map[string]string{"id": "x"}, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}", url: "/api/v1/vouchers/" + fair, params: fairID, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: "/api/v1/vouchers/" + fair + "/draw", params: fairID, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: "/api/v1/vouchers/" + vidS + "/draw", params: pid, status: 404}, // no_draw
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: "/api/v1/vouchers/987654321/draw", params: map[string]string{"id": "987654321"}, status: 404},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: "/api/v1/vouchers/x/draw", params: map[string]string{"id": "x"}, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: drawnAt, params: drawnID, prep: waitDone, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw", url: drawnAt, params: drawnID, prep: etagOf(drawnAt), status: 304},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/me", url: drawnAt + "/me", params: drawnID, token: token(t, 91, auth.RoleUser), status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/me", url: drawnAt + "/me", params: drawnID, token: userTok, status: 200}, // did not enter
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/me", url: "/api/v1/vouchers/" + fair + "/draw/me", params: fairID, token: userTok, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/me", url: drawnAt + "/me", params: drawnID, status: 401},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/me", url: "/api/v1/vouchers/" + vidS + "/draw/me", params: pid, token: userTok, status: 404}, // no_draw
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: drawnAt + "/entries?limit=1", params: drawnID, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: drawnAt + "/entries?after=0&limit=1", params: drawnID, status: 200},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: drawnAt + "/entries?after=0&limit=1", params: drawnID, prep: etagOf(drawnAt + "/entries?after=0&limit=1"), status: 304},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: "/api/v1/vouchers/" + fair + "/draw/entries", params: fairID, status: 200}, // open: none
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: drawnAt + "/entries?limit=0", params: drawnID, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: drawnAt + "/entries?after=-2", params: drawnID, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/vouchers/{id}/draw/entries", url: "/api/v1/vouchers/987654321/draw/entries", params: map[string]string{"id": "987654321"}, status: 404},
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/" + fair + "/orders", params: fairID, token: userTok, status: 202},           // entered
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(newVoucher, "fair_window_ms", 3_600_000), status: 422},                         // closes at end_at,
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/" + laterID["id"] + "/orders", params: laterID, token: userTok, status: 403}, // not_started: before the challenge
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/" + powID["id"] + "/orders", params: powID, token: userTok, status: 403},     // pow_required
		{method: "POST", path: "/api/v1/vouchers/{id}/orders", url: "/api/v1/vouchers/" + powID["id"] + "/orders", params: powID, token: userTok,
			hdr: map[string]string{"X-Seckill-Pow": wrongPow}, status: 403}, // pow_required: a wrong nonce
		{method: "POST", path: "/api/v1/vouchers", token: adminTok, body: withField(withField(newVoucher, "fair_window_ms", 1_800_000), "pow_bits", 25), badRequest: true, status: 422},

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

		{method: "POST", path: "/api/v1/orders/{id}/cancel", prep: at(cancelled), token: cancelTok, status: 200},
		{method: "POST", path: "/api/v1/orders/{id}/cancel", prep: at(cancelled), token: usedTok, status: 404}, // someone else's
		{method: "POST", path: "/api/v1/orders/{id}/cancel", prep: at(cancelled), status: 401},
		{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at(cancelled), token: cancelTok, status: 409}, // wrong_state
		{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at(used), token: usedTok, status: 200},
		{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at("0"), token: usedTok, badRequest: true, status: 400},
		{method: "POST", path: "/api/v1/orders/{id}/cancel", prep: at(used), token: usedTok, status: 409}, // paid: wrong_state
		{method: "POST", path: "/api/v1/orders/{id}/redeem", prep: at(used), token: usedTok, status: 403},
		{method: "POST", path: "/api/v1/orders/{id}/redeem", prep: at(used), token: adminTok, status: 200},
		{method: "POST", path: "/api/v1/orders/{id}/redeem", prep: at("123"), token: adminTok, status: 404},
		{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at(refunded), token: refundTok, status: 200},
		{method: "POST", path: "/api/v1/orders/{id}/refund", prep: at(refunded), token: refundTok, status: 403},
		{method: "POST", path: "/api/v1/orders/{id}/refund", prep: at(refunded), token: adminTok, status: 200},
		{method: "POST", path: "/api/v1/orders/{id}/refund", prep: at(used), token: adminTok, status: 409}, // used: wrong_state
		{method: "GET", path: "/api/v1/orders/{id}", prep: at(cancelled), token: cancelTok, status: 200},
		// The cancelled order's unit is back: another buyer pays for it and
		// the cashier redeems it by its code, once.
		{method: "POST", path: "/api/v1/orders/{id}/pay", token: codedTok, status: 200,
			prep: func(s *exchange) { coded = buyWritten(t, o.base, priced, codedTok); orderAt(s, coded) }},
		{method: "GET", path: "/api/v1/admin/orders", token: adminTok, status: 200,
			prep: func(s *exchange) { s.url = "/api/v1/admin/orders?q=" + codeOf(coded, codedTok) }},
		{method: "GET", path: "/api/v1/admin/orders", url: "/api/v1/admin/orders?voucher_id=" + priced + "&limit=10", token: adminTok, status: 200},
		{method: "GET", path: "/api/v1/admin/orders", url: "/api/v1/admin/orders?limit=0", token: adminTok, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/admin/orders", token: codedTok, status: 403},
		{method: "POST", path: "/api/v1/admin/redeem", token: codedTok, body: map[string]any{"code": "ABCDE23456"}, status: 403},
		{method: "POST", path: "/api/v1/admin/redeem", token: adminTok, prep: func(s *exchange) { redeemCode(coded, codedTok)(s) }, status: 200},
		{method: "POST", path: "/api/v1/admin/redeem", token: adminTok, prep: func(s *exchange) { redeemCode(coded, codedTok)(s) }, status: 409}, // code_used
		{method: "POST", path: "/api/v1/admin/redeem", token: adminTok, body: map[string]any{"code": "ZZZZZZZZZZ"}, status: 404},
		{method: "POST", path: "/api/v1/admin/redeem", token: adminTok, body: `{"code":`, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/admin/figures", token: adminTok, status: 200},
		{method: "GET", path: "/api/v1/admin/figures", url: "/api/v1/admin/figures?limit=900", token: adminTok, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/admin/figures", token: codedTok, status: 403},
		// User 2's admin tokens taken back: its token minted before is
		// refused on the next request; a shopper may not, nor a bad id.
		{method: "POST", path: "/api/v1/admin/users/{id}/revoke-tokens", prep: at("2"), token: adminTok, status: 200},
		{method: "GET", path: "/api/v1/admin/figures", token: admin2Tok, status: 401},
		{method: "POST", path: "/api/v1/admin/users/{id}/revoke-tokens", prep: at("2"), token: codedTok, status: 403},
		{method: "POST", path: "/api/v1/admin/users/{id}/revoke-tokens", prep: at("2"), status: 401},
		{method: "POST", path: "/api/v1/admin/users/{id}/revoke-tokens", prep: at("0"), token: adminTok, badRequest: true, status: 400},
		{method: "GET", path: "/api/v1/users/me/orders", token: refundTok, status: 200},
		{method: "GET", path: "/api/v1/admin/refunds", token: adminTok, status: 200},
		{method: "GET", path: "/api/v1/admin/refunds", token: usedTok, status: 403},
		{method: "GET", path: "/api/v1/admin/refunds", url: "/api/v1/admin/refunds?limit=0", token: adminTok, badRequest: true, status: 400},
		{method: "POST", path: "/api/v1/admin/payments/{id}/refunded", token: adminTok, status: 409, // a succeeded payment: wrong_state
			prep: func(s *exchange) { orderAt(s, paymentID) }},
		{method: "POST", path: "/api/v1/admin/payments/{id}/refunded", prep: at("987654321"), token: adminTok, status: 404},
		{method: "POST", path: "/api/v1/admin/payments/{id}/refunded", prep: at("1"), token: usedTok, status: 403},
		// The dev provider has no gateway to hear from.
		{method: "POST", path: "/api/v1/payments/notify", body: notifyBody, hdr: signed, status: 503},
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
		if s.prep != nil {
			s.prep(s)
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
		checkLifecycle(t, *s, status, body, &paymentID)
		checkConsole(t, *s, status, body, priced)
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

// checkLifecycle checks what the schema cannot: that each lifecycle answer
// shows the state the move leads to, with its fields. It remembers the
// payment id of the first pay answer that paid at once (used's: the
// refunded order's payment is owed back, no longer succeeded).
func checkLifecycle(t testing.TB, s exchange, status int, body []byte, paymentID *string) {
	t.Helper()
	if status != http.StatusOK {
		var e struct{ Code string }
		_ = json.Unmarshal(body, &e)
		want := map[int]string{409: "wrong_state", 403: "forbidden", 404: "order_not_found"}[status]
		if strings.HasPrefix(s.path, "/api/v1/orders/{id}/") && want != "" && e.Code != want {
			t.Errorf("%s %s: code %q, want %q", s.method, s.url, e.Code, want)
		}
		return
	}
	var v struct {
		order.View
		Order   order.View
		Payment struct {
			PaymentID int64 `json:"payment_id"`
			Status    string
			Amount    int64
		}
	}
	_ = json.Unmarshal(body, &v)
	switch s.path {
	case "/api/v1/orders/{id}/cancel":
		if v.Status != "cancelled" || v.CancelReason != "buyer" || v.CancelledAt == nil || v.Amount == nil || *v.Amount != 1500 {
			t.Errorf("cancel answered %s", body)
		}
	case "/api/v1/orders/{id}/pay":
		if v.Order.Status != "paid" || v.Order.PaidAt == nil || v.Payment.Status != "succeeded" || v.Payment.Amount != 1500 {
			t.Errorf("pay with the dev provider answered %s", body)
		}
		if *paymentID == "" {
			*paymentID = fmt.Sprint(v.Payment.PaymentID)
		}
	case "/api/v1/orders/{id}/redeem":
		if v.Status != "used" || v.UsedAt == nil {
			t.Errorf("redeem answered %s", body)
		}
	case "/api/v1/orders/{id}/refund":
		if v.Status != "refunded" || v.RefundedAt == nil || !v.NeedsRefund {
			t.Errorf("refund answered %s, want refunded with its money owed back", body)
		}
	}
}

// checkConsole checks what the schema cannot of the console's routes: a
// redeem by code answers the order used, or, again, code_used with its
// time; a search by code finds its one order; the figures name the priced
// voucher with its orders counted.
func checkConsole(t testing.TB, s exchange, status int, body []byte, priced string) {
	t.Helper()
	var v struct {
		Code     string
		Status   string
		UsedAt   *time.Time `json:"used_at"`
		Orders   []order.FoundView
		Vouchers []order.Figures
	}
	_ = json.Unmarshal(body, &v)
	switch {
	case s.path == "/api/v1/admin/redeem" && status == 200:
		if v.Status != "used" || v.UsedAt == nil || v.Code == "" {
			t.Errorf("redeem by code answered %s", body)
		}
	case s.path == "/api/v1/admin/redeem" && status == 409:
		if v.Code != "code_used" || v.UsedAt == nil {
			t.Errorf("a code redeemed again answered %s", body)
		}
	case s.path == "/api/v1/admin/orders" && status == 200 && strings.Contains(s.url, "?q="):
		if len(v.Orders) != 1 || v.Orders[0].Code == "" || !strings.HasSuffix(s.url, v.Orders[0].Code) {
			t.Errorf("search by code %s answered %s", s.url, body)
		}
	case s.path == "/api/v1/admin/figures" && status == 200:
		for _, f := range v.Vouchers {
			if fmt.Sprint(f.VoucherID) == priced {
				if f.Sold == 0 || f.Sold != f.AwaitingPayment+f.Paid+f.Used || f.Sold+f.StockLeft != f.TotalStock {
					t.Errorf("figures of the priced voucher: %+v", f)
				}
				return
			}
		}
		t.Errorf("the figures do not name the priced voucher %s: %s", priced, body)
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

// TestOpenAPIPaymentGateway checks the real answers of the payment routes
// with a webhook gateway against the document: pay creates the payment at
// the gateway; the gateway's signed notifications pay the order or, once
// the order is cancelled, record a refund owed, which an admin marks.
func TestOpenAPIPaymentGateway(t *testing.T) {
	t.Parallel()
	doc := loadSpec(t)
	const secret = "gateway-secret-0123456789"
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get(auth.WebhookSignatureHeader) != auth.Sign([]byte(secret), r.Header.Get(auth.WebhookTimestampHeader), body) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		var req payment.GatewayRequest
		_ = json.Unmarshal(body, &req)
		_ = json.NewEncoder(w).Encode(payment.GatewayAnswer{PayURL: "https://gateway.example/pay/" + req.Reference})
	}))
	t.Cleanup(gw.Close)
	o := startObserved(t, map[string]string{
		"SECKILL_PAY_PROVIDER": "webhook", "SECKILL_PAY_WEBHOOK_SECRET": secret, "SECKILL_PAY_GATEWAY_URL": gw.URL,
	})
	adminTok, paidTok, lateTok := token(t, 1, auth.RoleAdmin), token(t, 81, auth.RoleUser), token(t, 82, auth.RoleUser)
	priced := createPriced(t, o.base, 2, 700)
	paid := buyWritten(t, o.base, priced, paidTok)
	late := buyWritten(t, o.base, priced, lateTok)

	do := func(s exchange) map[string]any {
		t.Helper()
		if s.prep != nil {
			s.prep(&s)
		}
		if s.url == "" {
			s.url = s.path
		}
		_, body := checkExchange(t, doc, o.base, s)
		var v map[string]any
		_ = json.Unmarshal(body, &v)
		return v
	}
	at := func(id string) func(*exchange) { return func(s *exchange) { orderAt(s, id) } }
	// notify is a notification as the gateway sends it, signed at ts.
	notify := func(id, reference string, amount int64, ts time.Time, status int) exchange {
		body := fmt.Sprintf(`{"notification_id":%q,"reference":%q,"amount":%d,"status":"succeeded"}`, id, reference, amount)
		sec := fmt.Sprint(ts.Unix())
		return exchange{method: "POST", path: "/api/v1/payments/notify", body: body, status: status,
			hdr: map[string]string{auth.WebhookTimestampHeader: sec, auth.WebhookSignatureHeader: auth.Sign([]byte(secret), sec, []byte(body))}}
	}
	code := func(v map[string]any, want string) {
		t.Helper()
		if v["code"] != want {
			t.Errorf("answered %v, want code %s", v, want)
		}
	}

	// Pay: the payment is created at the gateway; the order still awaits it.
	v := do(exchange{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at(paid), token: paidTok, status: 200})
	pay, _ := v["payment"].(map[string]any)
	ref, _ := pay["reference"].(string)
	if pay["status"] != "created" || pay["pay_url"] != "https://gateway.example/pay/"+ref || v["order"].(map[string]any)["status"] != "awaiting_payment" {
		t.Fatalf("pay with a gateway answered %v", v)
	}
	now := time.Now()

	bad := notify("n-bad", ref, 700, now, 401)
	bad.hdr[auth.WebhookSignatureHeader] = "sha256=" + strings.Repeat("0", 64)
	code(do(bad), "bad_signature")
	unsigned := notify("n-unsigned", ref, 700, now, 401)
	unsigned.hdr, unsigned.badRequest = nil, true
	code(do(unsigned), "bad_signature")
	// A fresh timestamp without a signature, or with an empty one, is
	// refused at the signature check, not at the timestamp's.
	noSig := notify("n-nosig", ref, 700, now, 401)
	delete(noSig.hdr, auth.WebhookSignatureHeader)
	noSig.badRequest = true
	code(do(noSig), "bad_signature")
	emptySig := notify("n-emptysig", ref, 700, now, 401)
	emptySig.hdr[auth.WebhookSignatureHeader], emptySig.badRequest = "", true
	code(do(emptySig), "bad_signature")
	code(do(notify("n-stale", ref, 700, now.Add(-time.Hour), 401)), "stale_notification")
	code(do(notify("n-nobody", "pay_unknown", 700, now, 404)), "payment_not_found")
	code(do(notify("n-amount", ref, 699, now, 422)), "amount_mismatch")
	if v := do(notify("n-1", ref, 700, now, 200)); v["status"] != "succeeded" {
		t.Errorf("notification answered %v, want succeeded", v)
	}
	if v := do(notify("n-1", ref, 700, now, 200)); v["status"] != "duplicate" {
		t.Errorf("the same notification again answered %v, want duplicate", v)
	}
	if v := do(exchange{method: "GET", path: "/api/v1/orders/{id}", prep: at(paid), token: paidTok, status: 200}); v["status"] != "paid" {
		t.Errorf("a notified order reads %v, want paid", v)
	}

	// Late money: the order was cancelled before the gateway's notification.
	v = do(exchange{method: "POST", path: "/api/v1/orders/{id}/pay", prep: at(late), token: lateTok, status: 200})
	lateRef, _ := v["payment"].(map[string]any)["reference"].(string)
	do(exchange{method: "POST", path: "/api/v1/orders/{id}/cancel", prep: at(late), token: lateTok, status: 200})
	if v := do(notify("n-late", lateRef, 700, now, 200)); v["status"] != "needs_refund" {
		t.Errorf("a notification for a cancelled order answered %v, want needs_refund", v)
	}
	if v := do(exchange{method: "GET", path: "/api/v1/orders/{id}", prep: at(late), token: lateTok, status: 200}); v["status"] != "cancelled" || v["needs_refund"] != true {
		t.Errorf("the cancelled order paid late reads %v, want cancelled with needs_refund", v)
	}
	owed, _ := do(exchange{method: "GET", path: "/api/v1/admin/refunds", token: adminTok, status: 200})["payments"].([]any)
	if len(owed) != 1 || owed[0].(map[string]any)["reference"] != lateRef {
		t.Fatalf("refunds owed: %v, want the late payment %s", owed, lateRef)
	}
	owedID := fmt.Sprint(owed[0].(map[string]any)["payment_id"])
	mark := exchange{method: "POST", path: "/api/v1/admin/payments/{id}/refunded", prep: at(owedID), token: adminTok, status: 200}
	if v := do(mark); v["status"] != "refunded" || v["refunded_at"] == nil {
		t.Errorf("mark refunded answered %v", v)
	}
	if v := do(mark); v["status"] != "refunded" {
		t.Errorf("mark refunded again answered %v", v)
	}
	if owed, _ := do(exchange{method: "GET", path: "/api/v1/admin/refunds", token: adminTok, status: 200})["payments"].([]any); len(owed) != 0 {
		t.Errorf("refunds owed after marking: %v", owed)
	}
}
