package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// startCeiling runs the ceiling server on a free port against redisURL
// and returns its base URL; it is stopped, and must have stopped cleanly,
// at cleanup.
func startCeiling(t *testing.T, redisURL, prefix string, shards int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &testenv.Buffer{}
	args := []string{"ceiling", "--addr", "127.0.0.1:0", "--redis", redisURL, "--key-prefix", prefix, "--shards", fmt.Sprint(shards)}
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, func(string) string { return "" }, out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("ceiling server: %v\n%s", err, out)
		}
	})
	listening := regexp.MustCompile(`msg="ceiling server listening" addr=(\S+)`)
	var addr string
	testenv.WaitFor(t, 30*time.Second, "the ceiling server listens", func() bool {
		select {
		case err := <-errc:
			errc <- err
			t.Fatalf("ceiling server ended: %v\n%s", err, out)
		default:
		}
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return "http://" + addr
}

// post sends body (and a buyer, when user is not 0) and returns the status
// and the decoded answer.
func post(t *testing.T, url string, user int64, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if user != 0 {
		req.Header.Set("X-Loadtest-User", fmt.Sprint(user))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("POST %s: %s, undecodable answer: %v", url, resp.Status, err)
	}
	return resp.StatusCode, out
}

// TestCeilingSellsOnEachRedis: the ceiling server sells vouchers spread over
// more shards than a cluster has masters, on a single server and on a Redis
// Cluster: each voucher of stock 1 accepts its first buyer, refuses the
// second as sold out, and the order lands on the stream of the voucher's
// shard. On the cluster those streams lie on several masters.
func TestCeilingSellsOnEachRedis(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	for _, tc := range []struct {
		name    string
		url     string
		rdb     redis.UniversalClient
		cluster bool
	}{
		{"single", testenv.RedisURL(t), testenv.Redis(t), false},
		{"cluster", c.URL(), c.Client(t), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const shards = 4
			prefix := testenv.Prefix(t)
			keys := voucher.KeysFor(prefix, shards, tc.cluster)
			base := startCeiling(t, tc.url, prefix, shards)

			masters := map[string]bool{}
			for range shards {
				status, out := post(t, base+"/api/v1/vouchers", 0, map[string]int{"stock": 1})
				if status != http.StatusCreated {
					t.Fatalf("create voucher: %d %v", status, out)
				}
				id := int64(out["voucher"].(map[string]any)["id"].(float64))
				orders := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, id)
				if status, out := post(t, orders, 1, nil); status != http.StatusAccepted {
					t.Fatalf("voucher %d, first buyer: %d %v; want 202", id, status, out)
				}
				if status, out := post(t, orders, 2, nil); status != http.StatusConflict || out["code"] != "sold_out" {
					t.Fatalf("voucher %d, second buyer: %d %v; want 409 sold_out", id, status, out)
				}
				stream := keys.Stream(keys.Shard(id))
				if n, err := tc.rdb.XLen(ctx, stream).Result(); err != nil || n != 1 {
					t.Fatalf("voucher %d: %d entries in %s, %v; want 1", id, n, stream, err)
				}
				if tc.cluster {
					masters[c.MasterOf(t, stream).Addr] = true
				}
			}
			if tc.cluster && len(masters) < 2 {
				t.Fatalf("the shards' streams lie on %d master(s); want several", len(masters))
			}
		})
	}
}

// purchase sends a purchase with a bearer token (when not empty) and the
// X-Loadtest-User header, and returns the status and the decoded answer.
func purchase(t *testing.T, url, token string, user int64) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("X-Loadtest-User", fmt.Sprint(user))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("POST %s: %s, undecodable answer: %v", url, resp.Status, err)
	}
	return resp.StatusCode, out
}

// TestCeilingAnswersLikeTheService: the three answers the load generator's
// bench modes expect (202, 409 sold_out, 409 already_purchased naming the
// buyer's order) come from the script route and from the bare route; the
// bare route refuses a purchase without a valid token (401) and takes the
// buyer from the token, not from X-Loadtest-User. The gin route accepts
// every purchase.
func TestCeilingAnswersLikeTheService(t *testing.T) {
	t.Parallel()
	const secret = "0123456789abcdef0123456789abcdef"
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	mint := func(user int64) string {
		tok, err := signer.Mint(auth.Identity{UserID: user, Role: auth.RoleUser}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := &testenv.Buffer{}
	errc := make(chan error, 1)
	args := []string{"ceiling", "--addr", "127.0.0.1:0", "--redis", testenv.RedisURL(t), "--key-prefix", prefix, "--secret", secret}
	go func() { errc <- run(ctx, args, func(string) string { return "" }, out) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("ceiling server: %v\n%s", err, out)
		}
	})
	listening := regexp.MustCompile(`msg="ceiling server listening" addr=(\S+)`)
	var base string
	testenv.WaitFor(t, 30*time.Second, "the ceiling server listens", func() bool {
		if m := listening.FindStringSubmatch(out.String()); m != nil {
			base = "http://" + m[1]
		}
		return base != ""
	})

	for _, root := range []string{base, base + "/bare"} {
		status, created := post(t, root+"/api/v1/vouchers", 0, map[string]int{"stock": 1})
		if status != http.StatusCreated {
			t.Fatalf("%s: create voucher: %d %v", root, status, created)
		}
		orders := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", root, int64(created["voucher"].(map[string]any)["id"].(float64)))
		status, first := purchase(t, orders, mint(7), 7)
		if status != http.StatusAccepted || first["order_id"] == nil {
			t.Fatalf("%s: first buyer: %d %v; want 202 with an order id", root, status, first)
		}
		if status, again := purchase(t, orders, mint(7), 7); status != http.StatusConflict || again["code"] != "already_purchased" || again["order_id"] != first["order_id"] {
			t.Fatalf("%s: the buyer again: %d %v; want 409 already_purchased naming order %v", root, status, again, first["order_id"])
		}
		if status, other := purchase(t, orders, mint(8), 8); status != http.StatusConflict || other["code"] != "sold_out" {
			t.Fatalf("%s: second buyer: %d %v; want 409 sold_out", root, status, other)
		}
		if root == base {
			continue
		}
		if status, _ := purchase(t, orders, "", 9); status != http.StatusUnauthorized {
			t.Fatalf("bare purchase without a token: %d, want 401", status)
		}
		if status, _ := purchase(t, orders, mint(9)+"x", 9); status != http.StatusUnauthorized {
			t.Fatalf("bare purchase with a forged token: %d, want 401", status)
		}
		// The buyer is the token's: user 7's token with another header is user 7.
		if status, again := purchase(t, orders, mint(7), 1234); status != http.StatusConflict || again["code"] != "already_purchased" {
			t.Fatalf("bare purchase by user 7's token with X-Loadtest-User 1234: %d %v; want already_purchased", status, again)
		}
	}

	// /gin accepts every purchase, each with an order id of its own.
	status, created := post(t, base+"/gin/api/v1/vouchers", 0, map[string]int{"stock": 1})
	if status != http.StatusCreated || created["voucher"] == nil {
		t.Fatalf("gin: create voucher: %d %v", status, created)
	}
	seen := map[any]bool{}
	for _, user := range []int64{7, 7, 8} {
		status, got := purchase(t, base+"/gin/api/v1/vouchers/1/orders", "", user)
		if status != http.StatusAccepted || got["order_id"] == nil || seen[got["order_id"]] {
			t.Fatalf("gin purchase by %d: %d %v; want 202 with a new order id", user, status, got)
		}
		seen[got["order_id"]] = true
	}
}

// TestBareOnePerBuyer: presses released at once on a /bare voucher give
// one buyer one order (every other press of theirs names it) and sell no
// more than the stock.
func TestBareOnePerBuyer(t *testing.T) {
	t.Parallel()
	base := startCeiling(t, testenv.RedisURL(t), testenv.Prefix(t), 1) + "/bare"
	const stock = 40
	status, created := post(t, base+"/api/v1/vouchers", 0, map[string]int{"stock": stock})
	if status != http.StatusCreated {
		t.Fatalf("create voucher: %d %v", status, created)
	}
	orders := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, int64(created["voucher"].(map[string]any)["id"].(float64)))
	// No connection outlives its request: a connection dialled and left
	// unused in a client's pool would hold the server's shutdown.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	type answer struct {
		user int64
		code int
		body map[string]any
		err  error
	}
	buy := func(user int64) answer {
		req, err := http.NewRequest(http.MethodPost, orders, nil)
		if err != nil {
			return answer{user: user, err: err}
		}
		req.Header.Set("X-Loadtest-User", fmt.Sprint(user))
		resp, err := client.Do(req)
		if err != nil {
			return answer{user: user, err: err}
		}
		defer resp.Body.Close()
		a := answer{user: user, code: resp.StatusCode}
		a.err = json.NewDecoder(resp.Body).Decode(&a.body)
		return a
	}
	start := make(chan struct{})
	answers := make(chan answer, 200)
	for i := range 200 {
		user := int64(7)
		if i%2 == 1 {
			user = int64(100 + i)
		}
		go func() {
			<-start
			answers <- buy(user)
		}()
	}
	close(start)
	accepted, sevens := 0, map[any]int{}
	for range 200 {
		a := <-answers
		if a.err != nil {
			t.Fatalf("user %d: %v", a.user, a.err)
		}
		if a.code == http.StatusAccepted {
			accepted++
		}
		if a.user == 7 {
			switch {
			case a.code == http.StatusAccepted || a.body["code"] == "already_purchased":
				sevens[a.body["order_id"]]++
			case a.body["code"] != "sold_out":
				t.Errorf("user 7: %d %v", a.code, a.body)
			}
		}
	}
	if accepted > stock {
		t.Errorf("%d accepted, stock %d", accepted, stock)
	}
	if len(sevens) > 1 {
		t.Errorf("user 7 was named orders %v, want one", sevens)
	}
}

// TestBareHoldOnce: of 500 buyers' records released at once for one user,
// one wins and every other is told the winner's order.
func TestBareHoldOnce(t *testing.T) {
	t.Parallel()
	v := &bareVoucher{}
	start := make(chan struct{})
	type result struct {
		order int64
		won   bool
	}
	results := make(chan result, 500)
	for i := range 500 {
		go func() {
			<-start
			order, won := v.hold(7, int64(i+1))
			results <- result{order, won}
		}()
	}
	close(start)
	winners, orders := 0, map[int64]bool{}
	for range 500 {
		r := <-results
		if r.won {
			winners++
		}
		orders[r.order] = true
	}
	if held, ok := v.held(7); winners != 1 || len(orders) != 1 || !ok || !orders[held] {
		t.Fatalf("%d winners, %d orders named, held %d %v; want one order for all", winners, len(orders), held, ok)
	}
}
