package load

import (
	"cmp"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DrawPagesConfig is a load of a draw's public pages (internal/draw's
// Pages) beside a sale: a fair voucher is entered by Entrants buyers; from
// its close every entrant's page polls the draw's small status every
// Every, sending back the last ETag, until the draw is done, then asks
// once for its own entry (/draw/me), as the shop page does; Readers list
// readers page through /draw/entries with the cursor, Passes times each.
// Meanwhile an open-loop purchase stream buys another voucher (Purchases).
// Rounds alternate a round with the draw and one without (the purchase
// stream alone), so the stream's latency with and without the draw come
// from the same run.
type DrawPagesConfig struct {
	URL        string // an instance or nginx
	Secret     string // SECKILL_TOKEN_SECRET, to mint the tokens
	AdminToken string // default minted from Secret

	Entrants    int           // buyers entering the draw, default 20,000
	EntrantBase int64         // user id of the first entrant, default 10,000,000
	DrawStock   int           // units of the fair voucher (its winners), default 100
	Window      time.Duration // from the fair voucher's creation to its close, default 30s: the entering must end before
	Conns       int           // connections of the entrants' pages (entering, then polling), default 256
	Readers     int           // list readers, each on a connection of its own (0: none)
	Passes      int           // each reader's passes through the list once the draw is done, default 2
	PageLimit   int           // entries a list page asks for, default 200
	Every       time.Duration // a page's poll interval, default 500ms
	Lead        time.Duration // the purchase stream starts this long before the close, default 1s
	PagesFor    time.Duration // bound on the pages' run from the close, default 5m
	Timeout     time.Duration // per request, default 10s

	// Purchases is the purchase stream of every round: Rate, Concurrency,
	// Requests (Rate times the stream's seconds), Stock (default:
	// Requests, every purchase a new buyer accepted). Each stream buys a
	// voucher of its own with buyers of its own (UserBase moved on).
	Purchases Config
	Rounds    int      // default 2
	Modes     []string // what each round runs, in turn: draw, no-draw (default both; every other round reversed)
	// Check, when set, checks each stream's voucher after its round.
	Check *CheckConfig
	// Watch, when set, is called as a round's stream starts; the func it
	// returns is called once the stream and the pages are over, and gives
	// what was sampled meanwhile.
	Watch func() func() Usage
	Log   io.Writer
}

// Usage is what a round cost the deployment, sampled while it ran.
type Usage struct {
	DBConns   int   `json:"max_db_connections"`    // the service's connections to its database
	DBThreads int   `json:"max_threads_connected"` // every client of the database server
	RSSKiB    int64 `json:"max_api_rss_kib"`       // the API process's VmRSS
	Samples   int   `json:"samples"`
	// Seconds is the sampled window; APICPU and LoadgenCPU the CPU
	// seconds the API process and the load generator used in it (they
	// share the machine's cores).
	Seconds    float64 `json:"seconds"`
	APICPU     float64 `json:"api_cpu_seconds"`
	LoadgenCPU float64 `json:"loadgen_cpu_seconds"`
}

// PageStats are the answers of one of the pages.
type PageStats struct {
	Requests int            `json:"requests"`
	RPS      float64        `json:"requests_per_second"` // over the pages' run, from the close
	Latency  Latency        `json:"latency_ms"`
	Answers  map[string]int `json:"answers"`
}

// DrawFigures is what the pages of one draw saw.
type DrawFigures struct {
	VoucherID     int64          `json:"voucher_id"`
	Entrants      int            `json:"entrants"`
	EnterSeconds  float64        `json:"enter_seconds"`
	EnterAnswers  map[string]int `json:"enter_answers"`
	ClosesAt      time.Time      `json:"closes_at"`
	DoneAfter     float64        `json:"done_seconds_after_close"` // the first status answer saying done
	Seconds       float64        `json:"pages_seconds"`            // from the close to the last page's last answer
	Status        PageStats      `json:"status"`
	Mine          PageStats      `json:"mine"`
	List          PageStats      `json:"list"`
	PagesRPS      float64        `json:"pages_requests_per_second"`
	EntryCount    int            `json:"entry_count"`  // as the done status says
	WinnerCount   int            `json:"winner_count"` // as the done status says
	Answered      int            `json:"entrants_answered"`
	Won           int            `json:"entrants_told_won"`
	Passes        int            `json:"list_passes"` // complete passes of all readers
	PassEntries   int            `json:"list_entries_read"`
	Problems      []string       `json:"problems,omitempty"`
	ProblemsCount int            `json:"problems_count"`
}

// DrawRound is one round: the purchase stream, with the draw's pages or
// without.
type DrawRound struct {
	Round       int          `json:"round"`
	Mode        string       `json:"mode"`
	Purchases   Summary      `json:"purchases"`
	Draw        *DrawFigures `json:"draw,omitempty"`
	Usage       Usage        `json:"usage"`
	LoadAverage string       `json:"load_average"`
	// Overran: the pages went on after the purchase stream ended, so the
	// stream did not see all of them.
	Overran bool `json:"pages_outlasted_stream,omitempty"`
	// Phases splits a draw round's purchases by when they were due:
	// before the close, from the close to done, from done to the pages'
	// end, after it.
	Phases []StreamPhase `json:"phases,omitempty"`
}

// StreamPhase is the purchases due in one phase of a draw round, From and
// To in seconds since the close.
type StreamPhase struct {
	Name      string  `json:"name"`
	From      float64 `json:"from_s"`
	To        float64 `json:"to_s"`
	Purchases int     `json:"purchases"`
	Latency   Latency `json:"latency_ms"`
}

// slotLatency is one purchase's slot and latency.
type slotLatency struct {
	at  time.Time
	lat time.Duration
}

// phases splits a draw round's purchases by the draw's moments.
func phases(obs []slotLatency, closes time.Time, figs DrawFigures) []StreamPhase {
	done := closes.Add(time.Duration(figs.DoneAfter * float64(time.Second)))
	end := closes.Add(time.Duration(figs.Seconds * float64(time.Second)))
	out := []StreamPhase{{Name: "before the close"}, {Name: "close to done"}, {Name: "done to the pages' end"}, {Name: "after the pages"}}
	bounds := []time.Time{closes, done, end}
	lats := make([][]time.Duration, len(out))
	var first, last time.Time
	for _, o := range obs {
		i, _ := slices.BinarySearchFunc(bounds, o.at, func(b, at time.Time) int { return b.Compare(at) })
		lats[i] = append(lats[i], o.lat)
		if first.IsZero() || o.at.Before(first) {
			first = o.at
		}
		last = maxTime(last, o.at)
	}
	edges := []time.Time{first, closes, done, end, last}
	for i := range out {
		out[i].From, out[i].To = edges[i].Sub(closes).Seconds(), edges[i+1].Sub(closes).Seconds()
		out[i].Purchases, out[i].Latency = len(lats[i]), latencyOf(lats[i])
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// DrawPagesResult is every round and the comparison of the streams.
type DrawPagesResult struct {
	Rounds    []DrawRound `json:"rounds"`
	P99Draw   float64     `json:"median_p99_ms_draw"`
	P99NoDraw float64     `json:"median_p99_ms_no_draw"`
	Ratio     float64     `json:"p99_ratio_draw_to_no_draw"`
	OK        bool        `json:"ok"`
}

// defaults fills the settings left zero and checks them.
func (c *DrawPagesConfig) defaults() error {
	c.Entrants = cmp.Or(c.Entrants, 20_000)
	c.EntrantBase = cmp.Or(c.EntrantBase, 10_000_000)
	c.DrawStock = cmp.Or(c.DrawStock, 100)
	c.Window = cmp.Or(c.Window, 30*time.Second)
	c.Conns = cmp.Or(c.Conns, 256)
	c.Passes = cmp.Or(c.Passes, 2)
	c.PageLimit = cmp.Or(c.PageLimit, 200)
	c.Every = cmp.Or(c.Every, 500*time.Millisecond)
	c.Lead = cmp.Or(c.Lead, time.Second)
	c.PagesFor = cmp.Or(c.PagesFor, 5*time.Minute)
	c.Timeout = cmp.Or(c.Timeout, 10*time.Second)
	c.Rounds = cmp.Or(c.Rounds, 2)
	if len(c.Modes) == 0 {
		c.Modes = []string{"draw", "no-draw"}
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	for _, m := range c.Modes {
		if m != "draw" && m != "no-draw" {
			return fmt.Errorf("mode %q: want draw or no-draw", m)
		}
	}
	switch {
	case c.URL == "":
		return errors.New("no target URL")
	case c.Secret == "":
		return errors.New("no token secret to mint tokens (SECKILL_TOKEN_SECRET)")
	case c.Entrants < 1 || c.Readers < 0 || c.Conns < 1 || c.Passes < 1 || c.PageLimit < 1:
		return errors.New("entrants, connections, passes and the page limit must be positive")
	case c.Purchases.Requests < 1 || c.Purchases.Rate <= 0:
		return errors.New("the purchase stream needs a rate and its purchases")
	}
	return nil
}

// DrawPages runs the rounds and compares the purchase streams' p99 with
// the draw and without.
func DrawPages(ctx context.Context, cfg DrawPagesConfig) (DrawPagesResult, error) {
	if err := cfg.defaults(); err != nil {
		return DrawPagesResult{}, err
	}
	tokens, err := MintTokens(cfg.Secret, cfg.EntrantBase, cfg.Entrants)
	if err != nil {
		return DrawPagesResult{}, err
	}
	d := &drawRun{cfg: cfg, tokens: tokens,
		pages: newClient(cfg.Conns, cfg.Timeout), readers: newClient(cfg.Readers, cfg.Timeout)}
	defer d.pages.CloseIdleConnections()
	defer d.readers.CloseIdleConnections()
	res := DrawPagesResult{OK: true}
	for r := range cfg.Rounds {
		modes := slices.Clone(cfg.Modes)
		if r%2 == 1 {
			slices.Reverse(modes)
		}
		for _, m := range modes {
			fmt.Fprintf(cfg.Log, "round %d/%d: %s, load average %s\n", r+1, cfg.Rounds, m, loadAvg())
			round, err := d.round(ctx, len(res.Rounds), m)
			if err != nil {
				return res, fmt.Errorf("round %d, %s: %w", r+1, m, err)
			}
			round.Round = r + 1
			res.OK = res.OK && round.ok()
			res.Rounds = append(res.Rounds, round)
		}
	}
	res.P99Draw, res.P99NoDraw = medianP99(res.Rounds, "draw"), medianP99(res.Rounds, "no-draw")
	if res.P99NoDraw > 0 {
		res.Ratio = res.P99Draw / res.P99NoDraw
	}
	return res, nil
}

// ok reports whether the round's check and pages found nothing wrong.
func (r DrawRound) ok() bool {
	if c := r.Purchases.Check; c != nil && !c.OK {
		return false
	}
	return r.Draw == nil || r.Draw.ProblemsCount == 0
}

// medianP99 is the median of the purchase p99 of mode's rounds.
func medianP99(rounds []DrawRound, mode string) float64 {
	var xs []float64
	for _, r := range rounds {
		if r.Mode == mode {
			xs = append(xs, r.Purchases.Latency.P99)
		}
	}
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// drawRun is the state of the rounds: the entrants' tokens and the
// clients of the pages and of the list readers.
type drawRun struct {
	cfg            DrawPagesConfig
	tokens         []string
	pages, readers *http.Client
}

// round runs the purchase stream, with a draw's pages when mode is draw.
func (d *drawRun) round(ctx context.Context, n int, mode string) (DrawRound, error) {
	out := DrawRound{Mode: mode}
	var f *follow
	if mode == "draw" {
		var err error
		if f, err = d.open(ctx); err != nil {
			return out, err
		}
		if !sleepUntil(ctx, f.closes.Add(-d.cfg.Lead)) {
			return out, ctx.Err()
		}
	}
	pcfg := d.cfg.Purchases
	pcfg.URL, pcfg.Secret, pcfg.AdminToken, pcfg.Check = d.cfg.URL, d.cfg.Secret, d.cfg.AdminToken, nil
	pcfg.UserBase = cmp.Or(pcfg.UserBase, 100_000) + int64(n*pcfg.Requests)
	pcfg.Users, pcfg.Stock = pcfg.Requests, cmp.Or(pcfg.Stock, pcfg.Requests)
	pcfg.Log = cmp.Or[io.Writer](pcfg.Log, d.cfg.Log)
	stop := func() Usage { return Usage{} }
	if d.cfg.Watch != nil {
		stop = d.cfg.Watch()
	}
	pagesDone := make(chan DrawFigures, 1)
	var obsMu sync.Mutex
	var obs []slotLatency
	if f != nil {
		go func() { pagesDone <- f.run(ctx) }()
		pcfg.Observe = func(at time.Time, lat time.Duration) {
			obsMu.Lock()
			obs = append(obs, slotLatency{at, lat})
			obsMu.Unlock()
		}
	}
	res, err := Run(ctx, pcfg)
	streamEnd := time.Now()
	if f != nil {
		figs := <-pagesDone
		out.Draw = &figs
		out.Overran = f.closes.Add(time.Duration(figs.Seconds * float64(time.Second))).After(streamEnd)
		obsMu.Lock()
		out.Phases = phases(obs, f.closes, figs)
		obsMu.Unlock()
	}
	out.Usage = stop()
	out.LoadAverage = loadAvg()
	if err != nil {
		return out, err
	}
	out.Purchases = res.Summary
	if d.cfg.Check != nil {
		rep, err := check(ctx, *d.cfg.Check, pcfg, res.Summary.VoucherID, res)
		if err != nil {
			return out, err
		}
		out.Purchases.Check = &rep
	}
	return out, nil
}

// open creates the fair voucher, its close Window from now, and enters
// every entrant; the entering must end before the close.
func (d *drawRun) open(ctx context.Context) (*follow, error) {
	cfg := d.cfg
	lc := Config{URL: cfg.URL, Secret: cfg.Secret, AdminToken: cfg.AdminToken, Log: cfg.Log, Buckets: "1"}
	now := time.Now().UTC()
	begin := now.Add(-time.Minute).Truncate(time.Millisecond)
	closes := now.Add(cfg.Window).Truncate(time.Millisecond)
	id, _, err := postVoucher(ctx, d.pages, lc, "draw pages load test", cfg.DrawStock, 0, map[string]any{
		"begin_at": begin.Format(time.RFC3339Nano), "fair_window_ms": closes.Sub(begin).Milliseconds(),
	})
	if err != nil {
		return nil, err
	}
	f := &follow{d: d, voucher: id, closes: closes, base: cfg.URL + "/api/v1/vouchers/" + itoa(id) + "/draw",
		tickets: make([]int64, cfg.Entrants), status: newKindStats(), mine: newKindStats(), list: newKindStats()}
	fmt.Fprintf(cfg.Log, "created fair voucher %d (stock %d), closing at %s; entering %d buyers\n", id, cfg.DrawStock, closes.Format(time.RFC3339Nano), cfg.Entrants)
	start := time.Now()
	answers, err := f.enter(ctx)
	if err != nil {
		return nil, err
	}
	f.figs.EnterSeconds, f.figs.EnterAnswers = time.Since(start).Seconds(), answers
	if answers["202 entered"] != cfg.Entrants {
		return nil, fmt.Errorf("entering the draw: %v; want all %d entered (SECKILL_RATE_LIMIT=off?)", answers, cfg.Entrants)
	}
	if !time.Now().Before(closes) {
		return nil, fmt.Errorf("entering %d buyers took %.1fs, past the close: give a longer --window", cfg.Entrants, f.figs.EnterSeconds)
	}
	fmt.Fprintf(cfg.Log, "entered %d buyers in %.2fs\n", cfg.Entrants, f.figs.EnterSeconds)
	return f, nil
}

// follow is one draw's pages: the entrants' and the list readers'.
type follow struct {
	d       *drawRun
	voucher int64
	closes  time.Time
	base    string  // the draw's status URL
	tickets []int64 // each entrant's ticket, as its entry was answered

	status, mine, list *kindStats
	figs               DrawFigures

	doneAt      atomic.Int64 // unix ns of the first status answer saying done
	counts      sync.Once
	entryCount  int
	winnerCount int
	answered    atomic.Int64
	won         atomic.Int64
	passes      atomic.Int64
	passEntries atomic.Int64

	mu       sync.Mutex
	problems []string
	nProblem int
}

func (f *follow) problem(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nProblem++
	if len(f.problems) < 20 {
		f.problems = append(f.problems, fmt.Sprintf(format, args...))
	}
}

// enter enters every entrant with Conns connections, closed loop, and
// keeps each one's ticket.
func (f *follow) enter(ctx context.Context) (map[string]int, error) {
	var next atomic.Int64
	var mu sync.Mutex
	answers := map[string]int{}
	url := f.d.cfg.URL + "/api/v1/vouchers/" + itoa(f.voucher) + "/orders"
	var wg sync.WaitGroup
	for range f.d.cfg.Conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(f.tickets) {
					return
				}
				key := f.enterOne(ctx, url, i)
				mu.Lock()
				answers[key]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return answers, ctx.Err()
}

// enterOne enters entrant i and names its answer.
func (f *follow) enterOne(ctx context.Context, url string, i int) string {
	var body struct {
		Code   string `json:"code"`
		Status string `json:"status"`
		Ticket string `json:"ticket"`
	}
	status, _, err := f.get(ctx, f.d.pages, http.MethodPost, url, f.d.tokens[i], "", &body)
	if err != nil {
		return "error " + errorClass(err)
	}
	if status == http.StatusAccepted && body.Status == "entered" {
		f.tickets[i], _ = strconv.ParseInt(body.Ticket, 10, 64)
		return "202 entered"
	}
	return strconv.Itoa(status) + " " + body.Code
}

// get sends a request (a bearer token when tok is set, If-None-Match when
// etag is) and decodes a 200's or a 202's body into out.
func (f *follow) get(ctx context.Context, client *http.Client, method, url, tok, etag string, out any) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, nil, err
	}
	if len(b) > 0 && out != nil {
		if err := json.Unmarshal(b, out); err != nil && resp.StatusCode < 300 {
			return resp.StatusCode, resp.Header, fmt.Errorf("decode %s: %w", url, err)
		}
	}
	return resp.StatusCode, resp.Header, nil
}

// retryAfter is how long a page waits after an answer: every, or the
// answer's Retry-After when longer.
func retryAfter(h http.Header, every time.Duration) time.Duration {
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && time.Duration(s)*time.Second > every {
		return time.Duration(s) * time.Second
	}
	return every
}

// run runs the entrants' pages and the list readers from the close until
// every page has its entry and every reader its passes (or PagesFor
// passed), and sums up what they saw.
func (f *follow) run(ctx context.Context) DrawFigures {
	ctx, cancel := context.WithTimeout(ctx, time.Until(f.closes)+f.d.cfg.PagesFor)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { f.poll(ctx) })
	for r := range f.d.cfg.Readers {
		wg.Go(func() { f.read(ctx, r) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		f.problem("the pages did not end within %s of the close", f.d.cfg.PagesFor)
	}
	return f.figures(time.Since(f.closes))
}

// figures sums up the pages' run of elapsed from the close.
func (f *follow) figures(elapsed time.Duration) DrawFigures {
	out := f.figs
	out.VoucherID, out.Entrants, out.ClosesAt, out.Seconds = f.voucher, len(f.tickets), f.closes, elapsed.Seconds()
	if at := f.doneAt.Load(); at > 0 {
		out.DoneAfter = time.Unix(0, at).Sub(f.closes).Seconds()
	}
	out.Status, out.Mine, out.List = f.status.stats(elapsed), f.mine.stats(elapsed), f.list.stats(elapsed)
	out.PagesRPS = float64(out.Status.Requests+out.Mine.Requests+out.List.Requests) / elapsed.Seconds()
	out.EntryCount, out.WinnerCount = f.entryCount, f.winnerCount
	out.Answered, out.Won = int(f.answered.Load()), int(f.won.Load())
	out.Passes, out.PassEntries = int(f.passes.Load()), int(f.passEntries.Load())
	if out.Answered != out.Entrants {
		f.problem("%d of %d entrants were answered their entry", out.Answered, out.Entrants)
	}
	if out.Won != out.WinnerCount || out.EntryCount != out.Entrants {
		f.problem("the done status counts %d entries and %d winners; the entrants were %d, told won %d", out.EntryCount, out.WinnerCount, out.Entrants, out.Won)
	}
	if want := f.d.cfg.Readers * f.d.cfg.Passes; out.Passes != want {
		f.problem("%d list passes complete, want %d", out.Passes, want)
	}
	f.mu.Lock()
	out.Problems, out.ProblemsCount = slices.Clone(f.problems), f.nProblem
	f.mu.Unlock()
	return out
}

// kindStats collects one page's answers and their latency.
type kindStats struct {
	mu      sync.Mutex
	lat     []time.Duration
	answers map[string]int
}

func newKindStats() *kindStats { return &kindStats{answers: map[string]int{}} }

func (k *kindStats) add(status int, err error, took time.Duration) {
	key := strconv.Itoa(status)
	if err != nil {
		key = "error " + errorClass(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lat = append(k.lat, took)
	k.answers[key]++
}

func (k *kindStats) stats(elapsed time.Duration) PageStats {
	k.mu.Lock()
	defer k.mu.Unlock()
	return PageStats{Requests: len(k.lat), RPS: float64(len(k.lat)) / elapsed.Seconds(), Latency: latencyOf(slices.Clone(k.lat)), Answers: maps.Clone(k.answers)}
}

// entrant is one entrant's page: when it asks next, the ETag of the last
// status it read, and whether it asks for its own entry (the draw is done).
type entrant struct {
	due  time.Time
	etag string
	mine bool
}

// dueHeap orders the entrants' pages by when they ask next.
type dueHeap struct {
	pages []entrant
	idx   []int32
}

func (h *dueHeap) Len() int           { return len(h.idx) }
func (h *dueHeap) Less(a, b int) bool { return h.pages[h.idx[a]].due.Before(h.pages[h.idx[b]].due) }
func (h *dueHeap) Swap(a, b int)      { h.idx[a], h.idx[b] = h.idx[b], h.idx[a] }
func (h *dueHeap) Push(x any)         { h.idx = append(h.idx, x.(int32)) }
func (h *dueHeap) Pop() any {
	x := h.idx[len(h.idx)-1]
	h.idx = h.idx[:len(h.idx)-1]
	return x
}

// poll runs every entrant's page on Conns connections: a scheduler hands
// each page to a free connection when it is due, as a browser's timer
// would fire. A page asks from the close (spread over the first Every),
// again Every after each answer (or its Retry-After), and once the draw
// is done asks for its own entry; it ends when it has it.
func (f *follow) poll(ctx context.Context) {
	n := len(f.tickets)
	h := &dueHeap{pages: make([]entrant, n), idx: make([]int32, 0, n)}
	for i := range n {
		h.pages[i].due = f.closes.Add(time.Duration(int64(f.d.cfg.Every) * int64(i) / int64(n)))
		h.idx = append(h.idx, int32(i))
	}
	heap.Init(h)
	var mu sync.Mutex
	back := make(chan struct{}, 1) // a page went back on the heap
	ready := make(chan int32)
	var left atomic.Int64
	left.Store(int64(n))
	finished := make(chan struct{})
	var wg sync.WaitGroup
	for range f.d.cfg.Conns {
		wg.Go(func() {
			for {
				select {
				case <-finished:
					return
				case <-ctx.Done():
					return
				case i := <-ready:
					if f.ask(ctx, int(i), &h.pages[i]) {
						if left.Add(-1) == 0 {
							close(finished)
						}
						continue
					}
					mu.Lock()
					heap.Push(h, i)
					mu.Unlock()
					select {
					case back <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	dispatch(ctx, h, &mu, back, ready, finished)
	wg.Wait()
}

// dispatch hands each page of h to ready when it is due, until finished
// or ctx ends; back says a page went back on h.
func dispatch(ctx context.Context, h *dueHeap, mu *sync.Mutex, back <-chan struct{}, ready chan<- int32, finished <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		mu.Lock()
		wait := time.Hour
		next := int32(-1)
		if h.Len() > 0 {
			if wait = time.Until(h.pages[h.idx[0]].due); wait <= 0 {
				next = heap.Pop(h).(int32)
			}
		}
		mu.Unlock()
		if next >= 0 {
			select {
			case ready <- next:
				continue
			case <-finished:
				return
			case <-ctx.Done():
				return
			}
		}
		t.Reset(wait)
		select {
		case <-t.C:
		case <-back:
		case <-finished:
			return
		case <-ctx.Done():
			return
		}
	}
}

// ask makes entrant i's page's next request; true when the page is over.
func (f *follow) ask(ctx context.Context, i int, p *entrant) bool {
	if p.mine {
		return f.askMine(ctx, i, p)
	}
	var body struct {
		Draw *struct {
			Status string `json:"status"`
		} `json:"draw"`
		Entries *int `json:"entry_count"`
		Winners *int `json:"winner_count"`
	}
	start := time.Now()
	status, h, err := f.get(ctx, f.d.pages, http.MethodGet, f.base, "", p.etag, &body)
	now := time.Now()
	f.status.add(status, err, now.Sub(start))
	switch {
	case err == nil && status == http.StatusOK && body.Draw != nil && body.Draw.Status == "done":
		f.sawDone(now, body.Entries, body.Winners)
		p.mine, p.due = true, now
	case err == nil && status == http.StatusOK:
		p.etag, p.due = h.Get("ETag"), now.Add(f.d.cfg.Every)
	default: // 304 not modified, 503 busy, 429, an error
		p.due = now.Add(retryAfter(h, f.d.cfg.Every))
	}
	return false
}

// sawDone keeps the moment a status first said done, and the counts it
// gave.
func (f *follow) sawDone(at time.Time, entries, winners *int) {
	f.doneAt.CompareAndSwap(0, at.UnixNano())
	f.counts.Do(func() {
		if entries == nil || winners == nil {
			f.problem("a done status without its counts")
			return
		}
		f.entryCount, f.winnerCount = *entries, *winners
	})
}

// askMine asks for entrant i's own entry; true when it is answered (or
// refused for good), false to ask again.
func (f *follow) askMine(ctx context.Context, i int, p *entrant) bool {
	var body struct {
		Status  string `json:"status"`
		Entered *bool  `json:"entered"`
		Entry   *Entry `json:"entry"`
	}
	start := time.Now()
	status, h, err := f.get(ctx, f.d.pages, http.MethodGet, f.base+"/me", f.d.tokens[i], "", &body)
	now := time.Now()
	f.mine.add(status, err, now.Sub(start))
	user := f.d.cfg.EntrantBase + int64(i)
	switch {
	case err == nil && status >= 400 && status < 500 && status != http.StatusTooManyRequests:
		f.problem("user %d: /draw/me answered %d", user, status)
		return true
	case err != nil || status != http.StatusOK || body.Status != "done":
		p.due = now.Add(retryAfter(h, f.d.cfg.Every))
		return false
	case body.Entered == nil || !*body.Entered || body.Entry == nil:
		f.problem("user %d: /draw/me says it did not enter", user)
		return true
	case body.Entry.UserID != user || body.Entry.Ticket != f.tickets[i]:
		f.problem("user %d: /draw/me answers user %d, ticket %d; its entry was ticket %d", user, body.Entry.UserID, body.Entry.Ticket, f.tickets[i])
		return true
	}
	if body.Entry.Won {
		f.won.Add(1)
	}
	f.answered.Add(1)
	return true
}

// Entry is an entry as the draw's pages show it.
type Entry struct {
	UserID int64 `json:"user_id"`
	Ticket int64 `json:"ticket,string"`
	Place  int   `json:"place"`
	Won    bool  `json:"won"`
}

// listPage is a page of the draw's list.
type listPage struct {
	Status    string  `json:"status"`
	Entries   []Entry `json:"entries"`
	NextAfter *int    `json:"next_after"`
}

// read is list reader r: from the close (spread over the first Every) it
// reads the list from its first page to its last, Passes times once the
// draw is done.
func (f *follow) read(ctx context.Context, r int) {
	cfg := f.d.cfg
	if !sleepUntil(ctx, f.closes.Add(cfg.Every*time.Duration(r)/time.Duration(max(cfg.Readers, 1)))) {
		return
	}
	for pass := 0; pass < cfg.Passes && ctx.Err() == nil; {
		wait := f.pass(ctx)
		if wait == 0 {
			pass++
			continue
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return
		}
	}
}

// pass reads the list once with the cursor and holds it to the draw:
// every entrant once, at places 0, 1, ... in turn, with its ticket. It
// returns how long to wait before a pass again when the draw is not done
// yet, else 0.
func (f *follow) pass(ctx context.Context) time.Duration {
	seen := make([]bool, len(f.tickets))
	after, place := -1, 0
	for ctx.Err() == nil {
		pg, wait := f.page(ctx, after)
		switch {
		case wait > 0 && after < 0:
			return wait
		case wait > 0:
			sleepUntil(ctx, time.Now().Add(wait))
			continue
		case pg.Status != "done":
			return f.d.cfg.Every
		}
		for _, e := range pg.Entries {
			f.hold(e, seen, place)
			place++
		}
		if pg.NextAfter == nil {
			break
		}
		after = *pg.NextAfter
	}
	if ctx.Err() != nil {
		return 0
	}
	if place != len(f.tickets) {
		f.problem("a pass through the list read %d entries, want %d", place, len(f.tickets))
	}
	f.passes.Add(1)
	f.passEntries.Add(int64(place))
	return 0
}

// page reads the list's page after place after (-1: the first); wait is
// above 0 when it must be asked again that much later.
func (f *follow) page(ctx context.Context, after int) (listPage, time.Duration) {
	url := f.base + "/entries?limit=" + strconv.Itoa(f.d.cfg.PageLimit)
	if after >= 0 {
		url += "&after=" + strconv.Itoa(after)
	}
	var pg listPage
	start := time.Now()
	status, h, err := f.get(ctx, f.d.readers, http.MethodGet, url, "", "", &pg)
	f.list.add(status, err, time.Since(start))
	if err != nil || status != http.StatusOK {
		return pg, retryAfter(h, f.d.cfg.Every)
	}
	return pg, 0
}

// hold checks entry e, read at place in a pass that has seen seen.
func (f *follow) hold(e Entry, seen []bool, place int) {
	i := e.UserID - f.d.cfg.EntrantBase
	switch {
	case i < 0 || i >= int64(len(seen)):
		f.problem("the list holds user %d, who did not enter", e.UserID)
		return
	case seen[i]:
		f.problem("a pass read user %d twice", e.UserID)
	case e.Place != place || e.Ticket != f.tickets[i]:
		f.problem("user %d at place %d with ticket %d, read at place %d; its ticket %d", e.UserID, e.Place, e.Ticket, place, f.tickets[i])
	}
	seen[i] = true
}

// loadAvg is /proc/loadavg's first three fields ("" where there is none).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
