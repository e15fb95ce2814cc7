package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// kind is what an answer means for the buyer's order.
type kind int

const (
	accepted      kind = iota // 202: an order was taken
	refused                   // a definite no: nothing was taken
	indeterminate             // the purchase may or may not have run
)

// classify names an answer for the outcome counts and says what it means.
// A 5xx or a transport error is indeterminate: the purchase script may have
// run before the instance died or the reply was lost. 503 not_ready is the
// script's own refusal, so it is definite.
func classify(status int, code string, err error) (string, kind) {
	if err != nil {
		return "error " + errorClass(err), indeterminate
	}
	key := strconv.Itoa(status)
	if code != "" {
		key += " " + code
	}
	switch {
	case status == http.StatusAccepted:
		return "202 accepted", accepted
	case status == http.StatusServiceUnavailable && code == "not_ready":
		return key, refused
	case status >= 500:
		return key, indeterminate
	}
	return key, refused
}

func errorClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_reset"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "other"
}

// firer sends purchases and keeps what came back, per buyer.
type firer struct {
	cfg      Config
	client   *http.Client
	tokens   []string
	ids      []int64 // user id of each buyer
	vouchers []int64 // buyer u buys vouchers[u mod len]

	locks  [64]sync.Mutex // stripes over buyers: repeats of one buyer run concurrently
	buyers []buyer

	mu       sync.Mutex
	problemL []string
}

func (f *firer) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.problemL) < 20 {
		f.problemL = append(f.problemL, fmt.Sprintf(format, args...))
	}
}

func (f *firer) problems() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.problemL)
}

// counters are read by the progress line while the workers run.
type counters struct {
	sent, done, accepted, soldOut, other, errs atomic.Int64
}

// worker's own figures, merged at the end.
type tally struct {
	latencies []time.Duration
	outcomes  map[string]int
	answers   []answer // accepted and sold_out, for the tail
}

// fire sends one purchase per schedule entry with cfg.Concurrency workers
// and returns the figures of this phase.
func (f *firer) fire(ctx context.Context, sched []int32, midway func(), midwayAt int) (Summary, error) {
	cfg := f.cfg
	p := &phase{f: f, sched: sched, midway: midway, midwayAt: midwayAt, deadline: time.Now().Add(cfg.Duration)}
	tallies := make([]tally, cfg.Concurrency)
	p.urls = make([]string, len(f.vouchers))
	for i, v := range f.vouchers {
		p.urls[i] = cfg.URL + "/api/v1/vouchers/" + itoa(v) + "/orders"
	}

	p.start = time.Now()
	stopProgress := f.progress(&p.cnt, len(sched), p.start)
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		tallies[w] = tally{latencies: make([]time.Duration, 0, len(sched)/cfg.Concurrency+1), outcomes: map[string]int{}}
		wg.Add(1)
		go func(t *tally) {
			defer wg.Done()
			p.work(ctx, t)
		}(&tallies[w])
	}
	wg.Wait()
	elapsed := time.Since(p.start)
	stopProgress()
	if err := ctx.Err(); err != nil {
		return Summary{}, err
	}
	sum := p.summary(tallies, elapsed)
	if sum.Requests < len(sched) {
		fmt.Fprintf(cfg.Log, "stopped after %s: %d of %d purchases sent\n", cfg.Duration, sum.Requests, len(sched))
	}
	return sum, nil
}

// phase is one fire: the schedule its workers take purchases from in
// turn, its clock and the counters the progress line reads.
type phase struct {
	f               *firer
	sched           []int32
	urls            []string // the purchase URL of each voucher
	start, deadline time.Time
	next            atomic.Int64 // the next schedule entry to send
	cnt             counters
	midway          func() // run once, when entry midwayAt is taken
	midwayAt        int
}

// work is one worker: it sends the next purchase of the schedule until
// none is left, the deadline passed or ctx ended.
func (p *phase) work(ctx context.Context, t *tally) {
	for ctx.Err() == nil && time.Now().Before(p.deadline) {
		i := p.next.Add(1) - 1
		if i >= int64(len(p.sched)) {
			return
		}
		if i == int64(p.midwayAt) && p.midway != nil {
			go p.midway()
		}
		if !p.send(ctx, t, i) {
			return
		}
	}
}

// send makes purchase i of the schedule and keeps its answer; false when
// ctx ended while it waited for its slot.
func (p *phase) send(ctx context.Context, t *tally, i int64) bool {
	cfg := p.f.cfg
	at := time.Now()
	if cfg.Rate > 0 {
		// Open loop: the purchase is due at its slot, and its
		// latency counts from there even if we are late.
		at = p.start.Add(time.Duration(float64(i) / cfg.Rate * float64(time.Second)))
		if !sleepUntil(ctx, at) {
			return false
		}
	}
	p.cnt.sent.Add(1)
	u := p.sched[i]
	status, code, order, err := p.f.purchase(ctx, p.urls[int(u)%len(p.urls)], p.f.tokens[u], p.f.ids[u])
	now := time.Now()
	t.latencies = append(t.latencies, now.Sub(at))
	if cfg.Observe != nil {
		cfg.Observe(at, now.Sub(at))
	}
	key, k := classify(status, code, err)
	if k == accepted || code == "sold_out" {
		t.answers = append(t.answers, answer{at: now.Sub(p.start), latency: now.Sub(at), soldOut: k != accepted})
	}
	t.outcomes[key]++
	p.f.record(u, k, code, order)
	p.cnt.count(k, code, err)
	return true
}

// count adds one answer to the progress line's counters.
func (c *counters) count(k kind, code string, err error) {
	c.done.Add(1)
	switch {
	case k == accepted:
		c.accepted.Add(1)
	case code == "sold_out":
		c.soldOut.Add(1)
	case err != nil:
		c.errs.Add(1)
	default:
		c.other.Add(1)
	}
}

// summary merges the workers' tallies into the phase's figures.
func (p *phase) summary(tallies []tally, elapsed time.Duration) Summary {
	cfg := p.f.cfg
	sum := Summary{Concurrency: cfg.Concurrency, Rate: cfg.Rate, Outcomes: map[string]int{}, Seconds: elapsed.Seconds()}
	var all []time.Duration
	var answers []answer
	for _, t := range tallies {
		all = append(all, t.latencies...)
		answers = append(answers, t.answers...)
		for k, n := range t.outcomes {
			sum.Outcomes[k] += n
		}
	}
	sum.Requests = len(all)
	sum.RPS = float64(sum.Requests) / elapsed.Seconds()
	sum.Latency = latencyOf(all)
	sum.Tail = tailOf(answers)
	return sum
}

// purchase sends one purchase and reads the answer's code and order id.
func (f *firer) purchase(ctx context.Context, url, token string, user int64) (int, string, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, "", 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	// The ceiling server (loadtest/ceiling) takes the buyer from here; the
	// service ignores it and reads the token.
	req.Header.Set("X-Loadtest-User", strconv.FormatInt(user, 10))
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Code    string `json:"code"`
		OrderID string `json:"order_id"`
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return 0, "", 0, err
	}
	_ = json.Unmarshal(b, &body)
	order, _ := strconv.ParseInt(body.OrderID, 10, 64)
	return resp.StatusCode, body.Code, order, nil
}

// record keeps what buyer u learned, and notes answers that contradict each
// other: two acceptances, or an already_purchased naming another order.
func (f *firer) record(u int32, k kind, code string, order int64) {
	l := &f.locks[int(u)%len(f.locks)]
	l.Lock()
	defer l.Unlock()
	b := &f.buyers[u]
	b.pressed = true
	user := f.ids[u]
	switch {
	case k == accepted:
		b.accepts++
		if b.accepts > 1 {
			f.problem("user %d was accepted twice (orders %d and %d)", user, b.accepted, order)
		}
		if order <= 0 {
			f.problem("user %d: a 202 without an order id", user)
		}
		if b.accepted == 0 {
			b.accepted = order
		}
	case code == "already_purchased":
		if order > 0 && b.held != 0 && b.held != order {
			f.problem("user %d: already_purchased named orders %d and %d", user, b.held, order)
		}
		if order > 0 {
			b.held = order
		}
	case k == indeterminate:
		b.indeterminate = true
	}
}

// progress prints a line every cfg.Progress until the returned func is called.
func (f *firer) progress(c *counters, total int, start time.Time) func() {
	if f.cfg.Progress < 0 {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(f.cfg.Progress)
		defer t.Stop()
		last, lastAt := int64(0), start
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				d := c.done.Load()
				fmt.Fprintf(f.cfg.Log, "%6.1fs  %d/%d done  %6.0f/s  accepted %d  sold_out %d  other %d  errors %d\n",
					now.Sub(start).Seconds(), d, total, float64(d-last)/now.Sub(lastAt).Seconds(),
					c.accepted.Load(), c.soldOut.Load(), c.other.Load(), c.errs.Load())
				last, lastAt = d, now
			}
		}
	}()
	return func() { close(stop); <-done }
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
