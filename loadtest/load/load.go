// Package load fires purchases at a seckill deployment and checks what became
// of them: it creates a voucher (or uses one), mints a token per buyer, sends
// the purchases at a chosen concurrency and rate, summarises the answers and
// their latency, then waits for the order pipeline to drain and checks the
// invariants against MySQL and Redis directly. The loadtest command and the
// cluster's end-to-end test drive it.
package load

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"seckill/internal/auth"
	"seckill/internal/voucher"
)

// Config is one load run. Zero values take the defaults noted.
type Config struct {
	URL string // base URL: nginx or one instance, e.g. http://127.0.0.1:18080

	VoucherID int64 // 0: create a voucher with Stock
	Stock     int   // stock of the created voucher, default 500
	// Vouchers, when above 1, creates that many vouchers with Stock each
	// and sends buyer u's purchases to voucher u mod Vouchers: a sale of
	// several vouchers at once, whose shards spread over the Redis
	// masters (one voucher lives on one shard). Needs VoucherID 0 and no
	// Check.
	Vouchers int
	// Buckets is the bucket count of the vouchers created: "" or "1"
	// sends no "buckets" field (one bucket, the service's default), a
	// number or "auto" (one per master) is sent as is. With VoucherID it
	// is only what Skew and the summary take that voucher's count to be.
	Buckets string
	// Skew, from 0 to 1, picks the buyers so that this share of them has
	// its home in bucket 0 of Buckets (a number) and the rest elsewhere
	// (buyerIDs); 0: the buyers are UserBase, UserBase+1, ...
	Skew float64

	Users    int     // distinct buyers, default 2000
	Requests int     // purchases in all, default Users; the rest are repeats by the same buyers
	Warmup   int     // purchases sent first and left out of the figures (new buyers too)
	UserBase int64   // first buyer's user id, default 100000
	Seed     uint64  // order of the purchases, default 1
	Rate     float64 // purchases per second; 0: as fast as Concurrency allows (closed loop)
	// Presses, when set, makes every buyer press exactly that many times
	// (Requests = Users*Presses, Warmup taken from them), all shuffled: a
	// stampede of buyers who each press a few times.
	Presses int
	// FirstPressesFirst sends every buyer's first press before any repeat
	// (each part shuffled): with Warmup >= Users the measured purchases
	// are all repeats by buyers who already pressed.
	FirstPressesFirst bool

	Concurrency int           // connections and purchases in flight, default 64
	Duration    time.Duration // bound on firing, default 10 minutes
	Timeout     time.Duration // per request, default 10s

	Secret     string   // SECKILL_TOKEN_SECRET, to mint tokens
	AdminToken string   // for creating the voucher; default: minted from Secret
	Tokens     []string // tokens of users UserBase.. (reused across runs); default: minted

	Progress time.Duration // progress line interval, default 1s; negative: none
	Log      io.Writer     // progress lines and notes; default io.Discard

	// Midway runs once, in its own goroutine, when MidwayAfter purchases
	// (default half of them) were sent: a fault test kills an instance there.
	Midway      func()
	MidwayAfter int
	// Measure, when set, runs once just before the measured purchases
	// are sent (after the warm-up); Fired, when set, once they are done,
	// before the check: a caller snapshots what the firing cost there.
	Measure func()
	Fired   func()
	// Observe, when set, is given every purchase's slot (when it was
	// due) and latency as it is answered, from the firing goroutines.
	Observe func(at time.Time, latency time.Duration)

	// Check, when set, is where the pipeline is verified after the run.
	Check *CheckConfig
}

// defaults fills the settings left zero and checks them all.
func (c *Config) defaults() error {
	c.Stock = cmp.Or(c.Stock, 500)
	c.Users = cmp.Or(c.Users, 2000)
	if c.Presses > 0 {
		c.Requests = c.Users*c.Presses - c.Warmup
	}
	c.Requests = cmp.Or(c.Requests, c.Users)
	c.UserBase = cmp.Or(c.UserBase, 100_000)
	c.Seed = cmp.Or(c.Seed, 1)
	c.Concurrency = cmp.Or(c.Concurrency, 64)
	c.Duration = cmp.Or(c.Duration, 10*time.Minute)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.Progress = cmp.Or(c.Progress, time.Second)
	if c.Log == nil {
		c.Log = io.Discard
	}
	c.URL = strings.TrimRight(c.URL, "/")
	c.Buckets = cmp.Or(c.Buckets, "1")
	return c.validate()
}

// validate checks the settings once defaults has filled them.
func (c *Config) validate() error {
	switch {
	case c.URL == "":
		return errors.New("no target URL")
	case c.Users < 1 || c.Requests < 1 || c.Concurrency < 1 || c.Warmup < 0:
		return errors.New("users, requests and concurrency must be positive")
	case c.Warmup+c.Requests < c.Users:
		// Fine: only the first Requests users press.
	}
	if c.Vouchers > 1 && (c.VoucherID != 0 || c.Check != nil) {
		return errors.New("several vouchers are created fresh and not checked: no VoucherID, no Check")
	}
	if err := checkSkew(c.Buckets, c.Skew); err != nil {
		return err
	}
	if len(c.Tokens) == 0 && c.Secret == "" {
		return errors.New("no token secret to mint buyer tokens (SECKILL_TOKEN_SECRET)")
	}
	return nil
}

// checkSkew checks the buckets setting and that a skew, from 0 to 1, has
// a number of buckets to pick its buyers' homes in.
func checkSkew(buckets string, skew float64) error {
	nb, err := ParseBuckets(buckets)
	if err != nil {
		return err
	}
	switch {
	case skew < 0 || skew > 1:
		return errors.New("skew must be from 0 to 1")
	case skew > 0 && nb == 0:
		return errors.New("skew needs a number of buckets, not auto: it picks buyers by their home bucket")
	}
	return nil
}

// Result is what a run saw; Summary is its printable part.
type Result struct {
	Summary Summary
	// Answers per buyer, for the check, and the buyers' user ids.
	buyers []buyer
	ids    []int64
	// Problems the client itself saw: a buyer accepted twice, an
	// already_purchased naming another order than the one accepted.
	problems []string
}

// buyer is what one user's purchases got back.
type buyer struct {
	accepted      int64 // order id of a 202, 0 if none
	accepts       int   // how many 202s
	held          int64 // order id an already_purchased named
	indeterminate bool  // a purchase may have run without the buyer knowing (5xx, transport error)
	pressed       bool
}

// Run creates the voucher if asked, fires the purchases and, with
// cfg.Check, waits for the drain and checks the invariants.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	users := min(cfg.Users, cfg.Warmup+cfg.Requests)
	nb, _ := ParseBuckets(cfg.Buckets)
	ids := buyerIDs(cfg.UserBase, users, cfg.Skew, nb)
	tokens, err := buyerTokens(cfg, ids)
	if err != nil {
		return Result{}, err
	}
	client := newClient(cfg.Concurrency, cfg.Timeout)
	defer client.CloseIdleConnections()

	vids, bucketsMade, err := vouchers(ctx, client, cfg)
	if err != nil {
		return Result{}, err
	}
	vid := vids[0]

	sched := schedule(users, cfg.Warmup+cfg.Requests, cfg.Seed, cfg.Presses, cfg.FirstPressesFirst)
	f := &firer{cfg: cfg, client: client, tokens: tokens, ids: ids, vouchers: vids, buyers: make([]buyer, users)}
	if cfg.Warmup > 0 {
		fmt.Fprintf(cfg.Log, "warming up with %d purchases\n", cfg.Warmup)
		if _, err := f.fire(ctx, sched[:cfg.Warmup], nil, 0); err != nil {
			return Result{}, err
		}
	}
	if cfg.Measure != nil {
		cfg.Measure()
	}
	sum, err := f.fire(ctx, sched[cfg.Warmup:], cfg.Midway, cmp.Or(cfg.MidwayAfter, cfg.Requests/2))
	if err != nil {
		return Result{}, err
	}
	if cfg.Fired != nil {
		cfg.Fired()
	}
	sum.Target, sum.VoucherID, sum.Stock, sum.Users = cfg.URL, vid, cfg.Stock, users
	sum.Buckets, sum.BucketsMade, sum.Skew = cfg.Buckets, bucketsMade, cfg.Skew
	if cfg.Skew > 0 {
		sum.HomeZero = homeZero(ids, nb)
	}
	if len(vids) > 1 {
		sum.VoucherIDs = vids
	}
	if cfg.VoucherID != 0 {
		sum.Stock = 0 // not known to us
	}
	res := Result{Summary: sum, buyers: f.buyers, ids: ids, problems: f.problems()}
	if cfg.Check != nil {
		rep, err := check(ctx, *cfg.Check, cfg, vid, res)
		if err != nil {
			return res, err
		}
		res.Summary.Check = &rep
	}
	return res, nil
}

// vouchers is cfg.VoucherID, or the cfg.Vouchers vouchers (at least one)
// it creates, and the buckets the first creation answer names.
func vouchers(ctx context.Context, client *http.Client, cfg Config) ([]int64, int, error) {
	if cfg.VoucherID != 0 {
		return []int64{cfg.VoucherID}, 0, nil
	}
	var vids []int64
	bucketsMade := 0
	for range max(cfg.Vouchers, 1) {
		vid, made, err := CreateVoucher(ctx, client, cfg, cfg.Stock)
		if err != nil {
			return nil, 0, err
		}
		fmt.Fprintf(cfg.Log, "created voucher %d with stock %d in %s\n", vid, cfg.Stock, bucketsText(cfg.Buckets, made))
		vids = append(vids, vid)
		if bucketsMade == 0 {
			bucketsMade = made
		}
	}
	return vids, bucketsMade, nil
}

// homeZero counts the buyers ids at home in bucket 0 of nb.
func homeZero(ids []int64, nb int) int {
	n := 0
	for _, id := range ids {
		if voucher.Home(id, nb) == 0 {
			n++
		}
	}
	return n
}

// buyerTokens returns the tokens of the buyers ids: from cfg.Tokens (the
// tokens of users UserBase, UserBase+1, ...) when it holds them all, else
// minted.
func buyerTokens(cfg Config, ids []int64) ([]string, error) {
	out := make([]string, len(ids))
	for i, id := range ids {
		k := id - cfg.UserBase
		if k < 0 || k >= int64(len(cfg.Tokens)) {
			return mintTokens(cfg.Secret, ids)
		}
		out[i] = cfg.Tokens[k]
	}
	return out, nil
}

// MintTokens returns bearer tokens for users base .. base+n-1, valid for a day.
func MintTokens(secret string, base int64, n int) ([]string, error) {
	return mintTokens(secret, buyerIDs(base, n, 0, 1))
}

// mintTokens returns bearer tokens for the users ids, valid for a day.
func mintTokens(secret string, ids []int64) ([]string, error) {
	signer, err := auth.NewSigner([]byte(secret))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		if out[i], err = signer.Mint(auth.Identity{UserID: id, Role: auth.RoleUser}, 24*time.Hour); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// schedule returns which buyer sends each purchase: every buyer once (while
// there are purchases), the rest repeats by random buyers, all shuffled so
// repeats race with first presses as they do in a stampede. With presses > 0
// every buyer presses exactly that many times instead; with firstFirst the
// first presses all come before the repeats.
func schedule(users, requests int, seed uint64, presses int, firstFirst bool) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x5ec1d11))
	s := make([]int32, requests)
	for i := range s {
		switch {
		case presses > 0:
			s[i] = int32(i / presses)
		case i < users:
			s[i] = int32(i)
		default:
			s[i] = int32(rng.IntN(users))
		}
	}
	if firstFirst && requests > users {
		shuffle(rng, s[:users])
		shuffle(rng, s[users:])
		return s
	}
	shuffle(rng, s)
	return s
}

func shuffle(rng *rand.Rand, s []int32) {
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
}

// newClient is tuned for load: as many idle connections per host as
// purchases in flight, so no request waits for a new connection.
func newClient(concurrency int, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        concurrency + 16,
			MaxIdleConnsPerHost: concurrency + 16,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		},
	}
}

// CreateVoucher puts a free voucher with the given stock on sale now, for
// an hour. made is the bucket count the service's answer names (cfg's
// auto resolved), 0 when it names none.
func CreateVoucher(ctx context.Context, client *http.Client, cfg Config, stock int) (id int64, made int, err error) {
	return createVoucher(ctx, client, cfg, "load test", stock, 0)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// voucherFaceValue is what the load test's vouchers are worth, in cents.
const voucherFaceValue = 100

// createVoucher puts a voucher of stock units, titled title, on sale now, for an
// hour, at price cents (0: nothing to pay).
func createVoucher(ctx context.Context, client *http.Client, cfg Config, title string, stock int, price int64) (id int64, made int, err error) {
	return postVoucher(ctx, client, cfg, title, stock, price, nil)
}

// postVoucher is createVoucher with extra fields in the creation request
// (a draw's fair_window_ms; begin_at to replace the default).
func postVoucher(ctx context.Context, client *http.Client, cfg Config, title string, stock int, price int64, extra map[string]any) (id int64, made int, err error) {
	admin := cfg.AdminToken
	if admin == "" {
		signer, err := auth.NewSigner([]byte(cfg.Secret))
		if err != nil {
			return 0, 0, err
		}
		if admin, err = signer.Mint(auth.Identity{UserID: 1, Role: auth.RoleAdmin}, time.Hour); err != nil {
			return 0, 0, err
		}
	}
	now := time.Now().UTC()
	fields := map[string]any{
		"title": title + " " + now.Format(time.RFC3339), "face_value": voucherFaceValue, "price": price, "stock": stock,
		"begin_at": now.Add(-time.Minute).Format(time.RFC3339), "end_at": now.Add(time.Hour).Format(time.RFC3339),
	}
	if b := bucketsField(cfg.Buckets); b != nil {
		fields["buckets"] = b
	}
	maps.Copy(fields, extra)
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL+"/api/v1/vouchers", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("create voucher: %w", err)
	}
	defer resp.Body.Close()
	var out struct {
		Voucher struct {
			ID      int64 `json:"id"`
			Price   int64 `json:"price"`
			Buckets *int  `json:"buckets"`
		} `json:"voucher"`
		RedisReady bool `json:"redis_ready"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusCreated {
		return 0, 0, fmt.Errorf("create voucher: status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if !out.RedisReady {
		return 0, 0, fmt.Errorf("create voucher %d: its Redis state was not written (redis_ready false)", out.Voucher.ID)
	}
	if out.Voucher.Price != price {
		return 0, 0, fmt.Errorf("create voucher %d: price %d asked, %d made (a service without prices?)", out.Voucher.ID, price, out.Voucher.Price)
	}
	if err := madeBuckets(cfg, out.Voucher.ID, out.Voucher.Buckets); err != nil {
		return 0, 0, err
	}
	if out.Voucher.Buckets != nil {
		made = *out.Voucher.Buckets
	}
	return out.Voucher.ID, made, nil
}

// madeBuckets holds the bucket count the service says it made (made, nil
// when its answer does not say) against the one asked: another number is
// an error; no answer to a count other than 1 is noted, since a service
// without buckets ignores the field and sells from one.
func madeBuckets(cfg Config, id int64, made *int) error {
	field := bucketsField(cfg.Buckets)
	switch {
	case field == nil:
		return nil
	case made == nil:
		fmt.Fprintf(cfg.Log, "created voucher %d: its answer does not say its buckets (%s asked): a service without buckets sells it from one\n", id, cfg.Buckets)
	case cfg.Buckets != "auto" && *made != field:
		return fmt.Errorf("create voucher %d: %s buckets asked, %d made", id, cfg.Buckets, *made)
	}
	return nil
}
