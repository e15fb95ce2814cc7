package load

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// Worker starts one order worker for a burst's drain and returns how to
// stop it. The expiry measurement starts it after the purchases were
// accepted, so the drain is timed on its own, and stops it once the
// burst's orders are settled (written, and for a priced voucher expired).
type Worker interface {
	Start(ctx context.Context) (stop func(context.Context) error, err error)
}

// ExpiryConfig is one measurement of what unpaid orders cost: bursts of
// Units purchases by Units distinct buyers, nobody paying, on a free
// voucher and on a priced one in turn, round after round.
type ExpiryConfig struct {
	URL        string
	Secret     string // SECKILL_TOKEN_SECRET, to mint buyer tokens
	AdminToken string // to create the vouchers; default minted from Secret

	Units       int   // units of each voucher, and buyers of each burst; default 2000
	Price       int64 // the priced voucher's price in cents (face value 100); default 50
	Rounds      int   // default 3
	Concurrency int   // default 64

	// Check is where MySQL and Redis are read: the drain, the expiries
	// and the invariants.
	Check CheckConfig
	// Worker, when set, is started for each burst once its purchases are
	// accepted (the instances behind URL run SECKILL_ROLE=api). Nil: the
	// deployment's own workers write while the purchases are fired, and
	// the drain rate is the pipeline's, bounded by the firing.
	Worker Worker
	// ExpiryTimeout bounds the wait for a priced burst's orders to expire
	// and their units to be back, default 3m.
	ExpiryTimeout time.Duration
	// LoadAverage, when set, is recorded before each burst.
	LoadAverage func() string
	Log         io.Writer
}

func (c *ExpiryConfig) defaults() error {
	c.Units = cmp.Or(c.Units, 2000)
	c.Price = cmp.Or(c.Price, 50)
	c.Rounds = cmp.Or(c.Rounds, 3)
	c.Concurrency = cmp.Or(c.Concurrency, 64)
	c.ExpiryTimeout = cmp.Or(c.ExpiryTimeout, 3*time.Minute)
	c.Check.Group = cmp.Or(c.Check.Group, "order-writers")
	c.Check.DrainTimeout = cmp.Or(c.Check.DrainTimeout, 2*time.Minute)
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.LoadAverage == nil {
		c.LoadAverage = func() string { return "" }
	}
	switch {
	case c.URL == "":
		return errors.New("no target URL")
	case c.Secret == "":
		return errors.New("no token secret to mint buyer tokens (SECKILL_TOKEN_SECRET)")
	case c.Check.RedisURL == "" || c.Check.MySQLDSN == "":
		return errors.New("the Redis and MySQL of the deployment are needed (SECKILL_REDIS_URL, SECKILL_MYSQL_DSN)")
	case c.Price < 1 || c.Price > voucherFaceValue:
		return fmt.Errorf("the price must be from 1 to the face value, %d", voucherFaceValue)
	case c.Units < 1 || c.Rounds < 1 || c.Concurrency < 1:
		return errors.New("units, rounds and concurrency must be positive")
	}
	return nil
}

// Burst kinds: a free voucher's orders are written paid; a priced one's
// awaiting payment, with a deadline scheduled on the expiry queue.
const (
	BurstFree   = "free"
	BurstPriced = "priced"
)

// Burst is one burst of purchases and what became of its orders.
type Burst struct {
	Round       int     `json:"round"`
	Kind        string  `json:"kind"`
	VoucherID   int64   `json:"voucher_id"`
	Price       int64   `json:"price"`
	Accepted    int     `json:"accepted"`
	FireSeconds float64 `json:"fire_seconds"`
	FireRPS     float64 `json:"fire_requests_per_second"`
	// Drain is the writing of the accepted orders into MySQL.
	Drain DrainResult `json:"drain"`
	// Expiry is what the expiries did, for a priced burst.
	Expiry      *ExpiryStats `json:"expiry,omitempty"`
	Check       Report       `json:"check"`
	LoadAverage string       `json:"load_average"`
}

// ExpiryStats is how the units of a priced burst came back: every figure
// in seconds, read from MySQL.
type ExpiryStats struct {
	Orders int `json:"orders"`
	// BackLate is unit_back_at - pay_deadline: how long after its
	// deadline each unit was back on sale in Redis.
	BackLate Quantiles `json:"unit_back_after_deadline_s"`
	// CancelLate is cancelled_at - pay_deadline: the order cancelled in
	// MySQL.
	CancelLate Quantiles `json:"cancelled_after_deadline_s"`
	// DeadlineSpread is the last deadline - the first: the burst of
	// deadlines, as wide as the drain that wrote the orders.
	DeadlineSpread float64 `json:"deadline_spread_s"`
	// AllBack is the last unit back - the first deadline.
	AllBack float64 `json:"all_back_after_first_deadline_s"`
	// Window is the median pay_deadline - created_at (SECKILL_PAY_WINDOW).
	Window float64 `json:"pay_window_s"`

	back []float64 // BackLate's samples, for the figures over every round
}

// Quantiles summarises a sample.
type Quantiles struct {
	N   int     `json:"n"`
	Min float64 `json:"min"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// QuantilesOf sorts xs in place and summarises it; a quantile is the
// nearest-rank value (the sample at rank ceil-ish p*n, as latencyOf takes
// them).
func QuantilesOf(xs []float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{}
	}
	slices.Sort(xs)
	at := func(p float64) float64 {
		i := int(p*float64(len(xs))+0.5) - 1
		return xs[min(max(i, 0), len(xs)-1)]
	}
	return Quantiles{N: len(xs), Min: xs[0], P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: xs[len(xs)-1]}
}

// Median is the middle value of xs (the upper one of an even count), as
// bench takes its medians; 0 for none. xs is sorted in place.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// ExpiryResult is the whole measurement.
type ExpiryResult struct {
	Units  int     `json:"units"`
	Price  int64   `json:"price"`
	Rounds int     `json:"rounds"`
	Bursts []Burst `json:"bursts"`
	// Medians over the rounds of the drain rate, orders per second, and
	// priced / free.
	FreeDrainRate   float64 `json:"median_free_drain_orders_per_second"`
	PricedDrainRate float64 `json:"median_priced_drain_orders_per_second"`
	DrainRatio      float64 `json:"priced_over_free_drain"`
	// BackLate is unit_back_at - pay_deadline over every priced burst's
	// orders together.
	BackLate    Quantiles `json:"unit_back_after_deadline_s"`
	OK          bool      `json:"ok"`
	Violations  []string  `json:"violations,omitempty"`
	LoadAverage string    `json:"load_average_end"`
}

// Summarise fills the medians, the pooled quantiles and the verdict from
// the bursts.
func (r *ExpiryResult) Summarise() {
	var free, priced, back []float64
	r.Violations = nil
	for _, b := range r.Bursts {
		switch b.Kind {
		case BurstFree:
			free = append(free, b.Drain.Rate)
		case BurstPriced:
			priced = append(priced, b.Drain.Rate)
			if b.Expiry != nil {
				back = append(back, b.Expiry.back...)
			}
		}
		for _, v := range b.Check.Violations {
			r.Violations = append(r.Violations, fmt.Sprintf("round %d, %s voucher %d: %s", b.Round, b.Kind, b.VoucherID, v))
		}
	}
	r.FreeDrainRate, r.PricedDrainRate = Median(free), Median(priced)
	r.DrainRatio = 0
	if r.FreeDrainRate > 0 {
		r.DrainRatio = r.PricedDrainRate / r.FreeDrainRate
	}
	if len(back) > 0 {
		r.BackLate = QuantilesOf(back)
	}
	r.OK = len(r.Violations) == 0
}

// burstOrder is the kinds of round r (0-based), alternated so that
// neither kind always runs first, on a machine warmed by the other.
func burstOrder(r int) []string {
	if r%2 == 0 {
		return []string{BurstFree, BurstPriced}
	}
	return []string{BurstPriced, BurstFree}
}

// Expiry runs the measurement: each round a burst on a fresh free voucher
// and one on a fresh priced voucher, in alternating order. A burst fires
// Units purchases by Units distinct buyers, times the drain of the
// accepted orders into MySQL, for a priced voucher waits until every order
// expired and its unit is back in Redis, then checks the invariants.
// Violations are in the result (OK false); an error means the measurement
// could not be made.
func Expiry(ctx context.Context, cfg ExpiryConfig) (ExpiryResult, error) {
	if err := cfg.defaults(); err != nil {
		return ExpiryResult{}, err
	}
	out := ExpiryResult{Units: cfg.Units, Price: cfg.Price, Rounds: cfg.Rounds}
	tokens, err := MintTokens(cfg.Secret, 100_000, cfg.Units)
	if err != nil {
		return out, err
	}
	g, err := db.OpenMySQL(cfg.Check.MySQLDSN, 2)
	if err != nil {
		return out, err
	}
	defer db.Close(g)
	client := newClient(cfg.Concurrency, 10*time.Second)
	defer client.CloseIdleConnections()
	e := expiryRun{cfg: cfg, g: g, client: client, tokens: tokens}
	for r := range cfg.Rounds {
		for _, kind := range burstOrder(r) {
			fmt.Fprintf(cfg.Log, "round %d/%d: %s voucher, %d buyers, load average %s\n", r+1, cfg.Rounds, kind, cfg.Units, cfg.LoadAverage())
			b, err := e.burst(ctx, r+1, kind)
			if err != nil {
				return out, fmt.Errorf("round %d, %s burst: %w", r+1, kind, err)
			}
			out.Bursts = append(out.Bursts, b)
		}
	}
	out.LoadAverage = cfg.LoadAverage()
	out.Summarise()
	return out, nil
}

// expiryRun is what every burst of one measurement shares.
type expiryRun struct {
	cfg    ExpiryConfig
	g      *gorm.DB
	client *http.Client
	tokens []string
}

// burst is one burst of one kind: the voucher, the purchases, the drain,
// the expiries, the check.
func (e expiryRun) burst(ctx context.Context, round int, kind string) (Burst, error) {
	b, lc, err := e.newBurst(ctx, round, kind)
	if err != nil {
		return b, err
	}
	drained := e.watchDrain(ctx, b.VoucherID, e.cfg.Units)
	res, stop, err := e.fire(ctx, &b, lc, drained)
	if err != nil {
		return b, err
	}
	// The worker stops once its orders are settled, or on the way out.
	defer func() {
		if stop != nil {
			_ = stop(context.WithoutCancel(ctx))
		}
	}()
	if err := e.settle(ctx, &b, drained); err != nil {
		return b, err
	}
	if err := e.checkBurst(ctx, &b, lc, res); err != nil {
		return b, err
	}
	s := stop
	stop = nil
	if err := s(ctx); err != nil {
		return b, fmt.Errorf("stop the worker: %w", err)
	}
	return b, nil
}

// newBurst creates the burst's voucher, priced for a priced burst, and
// the run that buys it.
func (e expiryRun) newBurst(ctx context.Context, round int, kind string) (Burst, Config, error) {
	cfg := e.cfg
	b := Burst{Round: round, Kind: kind, LoadAverage: cfg.LoadAverage()}
	if kind == BurstPriced {
		b.Price = cfg.Price
	}
	lc := Config{
		URL: cfg.URL, Secret: cfg.Secret, AdminToken: cfg.AdminToken, Users: cfg.Units, Requests: cfg.Units,
		Concurrency: cfg.Concurrency, Tokens: e.tokens, UserBase: 100_000, Seed: uint64(round), Progress: -1, Log: cfg.Log,
	}
	if err := lc.defaults(); err != nil {
		return b, lc, err
	}
	vid, _, err := createVoucher(ctx, e.client, lc, "expiry load test", cfg.Units, b.Price)
	if err != nil {
		return b, lc, err
	}
	b.VoucherID, lc.VoucherID = vid, vid
	return b, lc, nil
}

// fire sends the burst's purchases, the drain's watch begun before them
// when the deployment's workers write as they arrive; every purchase must
// be accepted. With cfg.Worker, it then starts the worker once the watch
// has begun, and returns how to stop it.
func (e expiryRun) fire(ctx context.Context, b *Burst, lc Config, drained *drainWatcher) (Result, func(context.Context) error, error) {
	cfg := e.cfg
	if cfg.Worker == nil {
		// The deployment's workers write as the purchases arrive: the
		// watch begins before the first purchase.
		if err := drained.started(ctx); err != nil {
			return Result{}, nil, err
		}
	}
	res, err := Run(ctx, lc)
	if err != nil {
		drained.cancel()
		return res, nil, err
	}
	b.FireSeconds, b.FireRPS = res.Summary.Seconds, res.Summary.RPS
	b.Accepted = res.Summary.Outcomes["202 accepted"]
	if b.Accepted != cfg.Units {
		drained.cancel()
		return res, nil, fmt.Errorf("%d of %d purchases accepted (%v): a burst measures a voucher sold to every buyer", b.Accepted, cfg.Units, res.Summary.Outcomes)
	}
	if cfg.Worker == nil {
		return res, func(context.Context) error { return nil }, nil
	}
	if err := drained.started(ctx); err != nil {
		return res, nil, err
	}
	stop, err := cfg.Worker.Start(ctx)
	if err != nil {
		drained.cancel()
		return res, nil, fmt.Errorf("start a worker: %w", err)
	}
	return res, stop, nil
}

// settle waits for the drain and, for a priced voucher, until every
// order expired with its unit back.
func (e expiryRun) settle(ctx context.Context, b *Burst, drained *drainWatcher) error {
	var err error
	if b.Drain, err = drained.result(); err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	fmt.Fprintf(e.cfg.Log, "  drained %d orders in %.3fs: %.0f orders/s\n", b.Drain.Orders, b.Drain.Seconds, b.Drain.Rate)
	if b.Kind != BurstPriced {
		return nil
	}
	if err := e.waitExpired(ctx, b.VoucherID, b.Accepted); err != nil {
		return err
	}
	st, err := e.expiryStats(ctx, b.VoucherID)
	if err != nil {
		return err
	}
	b.Expiry = &st
	fmt.Fprintf(e.cfg.Log, "  every unit back: after its deadline p50 %.3fs p99 %.3fs max %.3fs; deadlines spread over %.3fs\n",
		st.BackLate.P50, st.BackLate.P99, st.BackLate.Max, st.DeadlineSpread)
	return nil
}

// checkBurst checks the invariants after the burst, and for a priced
// voucher that every unit is back on sale in Redis.
func (e expiryRun) checkBurst(ctx context.Context, b *Burst, lc Config, res Result) error {
	cfg := e.cfg
	var err error
	if b.Check, err = check(ctx, cfg.Check, lc, b.VoucherID, res); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if b.Kind == BurstPriced && b.Check.RedisStock != int64(cfg.Units) {
		b.Check.Violations = append(b.Check.Violations, fmt.Sprintf("Redis stock %d after every order expired, want all %d units back", b.Check.RedisStock, cfg.Units))
		b.Check.OK = false
	}
	if b.Check.OK {
		fmt.Fprintf(cfg.Log, "  check OK: %v, Redis stock %d\n", b.Check.ByState, b.Check.RedisStock)
	} else {
		fmt.Fprintf(cfg.Log, "  check FAILED: %s\n", strings.Join(b.Check.Violations, "; "))
	}
	return nil
}

// drainWatcher is a Drain running beside the burst.
type drainWatcher struct {
	began  chan struct{} // closed once the watch counted the orders before it
	done   chan struct{}
	res    DrainResult
	err    error
	cancel context.CancelFunc
}

// watchDrain starts timing the drain of the voucher's expect orders.
func (e expiryRun) watchDrain(ctx context.Context, vid int64, expect int) *drainWatcher {
	ctx, cancel := context.WithCancel(ctx)
	w := &drainWatcher{began: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	cc := e.cfg.Check
	go func() {
		defer close(w.done)
		w.res, w.err = Drain(ctx, DrainConfig{
			VoucherID: vid, Expect: expect, RedisURL: cc.RedisURL, MySQLDSN: cc.MySQLDSN,
			KeyPrefix: cc.KeyPrefix, Shards: cc.Shards, Group: cc.Group, Timeout: cc.DrainTimeout,
			Log: &firstWrite{signal: w.began},
		})
	}()
	return w
}

// started waits until the watch counted the orders before it (Drain's
// first line), so that no order written afterwards escapes its clock.
func (w *drainWatcher) started(ctx context.Context) error {
	select {
	case <-w.began:
		return nil
	case <-w.done:
		return fmt.Errorf("drain watch: %w", w.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *drainWatcher) result() (DrainResult, error) {
	<-w.done
	w.cancel()
	return w.res, w.err
}

// firstWrite closes signal at the first write: Drain writes its first
// line once it counted the orders already there.
type firstWrite struct {
	signal chan struct{}
	once   sync.Once
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.once.Do(func() { close(f.signal) })
	return len(p), nil
}

// waitExpired waits until each of the voucher's n orders is cancelled as
// expired with its unit back in Redis (unit_back_at set). Nobody paid, so
// every order must end so; the wait fails after ExpiryTimeout, or at once
// when an order ended otherwise.
func (e expiryRun) waitExpired(ctx context.Context, vid int64, n int) error {
	deadline := time.Now().Add(e.cfg.ExpiryTimeout)
	lastLog := time.Now()
	for {
		var c struct {
			Orders, Back, Expired, Awaiting int64
		}
		err := e.g.WithContext(ctx).Raw(`SELECT COUNT(*) AS orders,
  COALESCE(SUM(status = 'cancelled' AND cancel_reason = 'expired' AND unit_back_at IS NOT NULL), 0) AS back,
  COALESCE(SUM(status = 'cancelled' AND cancel_reason = 'expired'), 0) AS expired,
  COALESCE(SUM(status = 'awaiting_payment'), 0) AS awaiting
FROM orders WHERE voucher_id = ?`, vid).Scan(&c).Error
		if err != nil {
			return fmt.Errorf("count expired orders: %w", err)
		}
		switch {
		case c.Back == int64(n) && c.Orders == int64(n):
			return nil
		case c.Orders-c.Awaiting-c.Expired > 0:
			return fmt.Errorf("voucher %d: %d of %d orders ended otherwise than expired, and nobody paid", vid, c.Orders-c.Awaiting-c.Expired, c.Orders)
		case time.Now().After(deadline):
			return fmt.Errorf("voucher %d after %s: %d orders, %d awaiting payment, %d expired, %d units back", vid, e.cfg.ExpiryTimeout, c.Orders, c.Awaiting, c.Expired, c.Back)
		}
		if time.Since(lastLog) >= 2*time.Second {
			fmt.Fprintf(e.cfg.Log, "  waiting for expiries: %d awaiting payment, %d expired, %d units back\n", c.Awaiting, c.Expired, c.Back)
			lastLog = time.Now()
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return ctx.Err()
		}
	}
}

// expiryStats reads from MySQL how late after their deadlines the
// voucher's orders were cancelled and their units back on sale, and how
// the deadlines spread. MySQL computes the differences: both times come
// from the service's clock, stored alike.
func (e expiryRun) expiryStats(ctx context.Context, vid int64) (ExpiryStats, error) {
	var rows []struct {
		BackUS, CancelUS, WindowUS int64
	}
	err := e.g.WithContext(ctx).Raw(`SELECT TIMESTAMPDIFF(MICROSECOND, pay_deadline, unit_back_at) AS back_us,
  TIMESTAMPDIFF(MICROSECOND, pay_deadline, cancelled_at) AS cancel_us,
  TIMESTAMPDIFF(MICROSECOND, created_at, pay_deadline) AS window_us
FROM orders WHERE voucher_id = ?`, vid).Scan(&rows).Error
	if err != nil {
		return ExpiryStats{}, fmt.Errorf("read expiry times: %w", err)
	}
	var span struct{ SpreadUS, AllBackUS int64 }
	err = e.g.WithContext(ctx).Raw(`SELECT TIMESTAMPDIFF(MICROSECOND, MIN(pay_deadline), MAX(pay_deadline)) AS spread_us,
  TIMESTAMPDIFF(MICROSECOND, MIN(pay_deadline), MAX(unit_back_at)) AS all_back_us
FROM orders WHERE voucher_id = ?`, vid).Scan(&span).Error
	if err != nil {
		return ExpiryStats{}, fmt.Errorf("read deadline spread: %w", err)
	}
	return expiryStatsOf(rows, span.SpreadUS, span.AllBackUS), nil
}

// expiryStatsOf turns the per-order microsecond differences into
// seconds and their quantiles.
func expiryStatsOf(rows []struct{ BackUS, CancelUS, WindowUS int64 }, spreadUS, allBackUS int64) ExpiryStats {
	back := make([]float64, len(rows))
	cancel := make([]float64, len(rows))
	window := make([]float64, len(rows))
	for i, r := range rows {
		back[i], cancel[i], window[i] = float64(r.BackUS)/1e6, float64(r.CancelUS)/1e6, float64(r.WindowUS)/1e6
	}
	st := ExpiryStats{
		Orders: len(rows), BackLate: QuantilesOf(back), CancelLate: QuantilesOf(cancel),
		DeadlineSpread: float64(spreadUS) / 1e6, AllBack: float64(allBackUS) / 1e6, Window: Median(window),
	}
	st.back = back
	return st
}
