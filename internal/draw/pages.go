package draw

import (
	"cmp"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"seckill/internal/apierr"
	"seckill/internal/auth"
	"seckill/internal/voucher"
)

// Pages serves a draw's result to its visitors at a cost that does not
// grow with them. Every entrant's page polls the draw from its close until
// it is done, then asks once for its own entry; anyone may read the whole
// list, a page at a time:
//
//	route                             reads                                  kept by the instance          HTTP cache
//	----------------------------------+--------------------------------------+-----------------------------+---------------------------------
//	GET /vouchers/{id}/draw           the voucher by id; once done, the      done: for good; before:      done: public, max-age=86400
//	  commitment, state, counts       entry and winner counts, once          Fresh (250ms), one read a   before: public, max-age=1
//	                                                                         time per voucher
//	GET /vouchers/{id}/draw/me        the buyer's entry by primary key       nothing (once per buyer)     private (done: max-age=86400)
//	GET /vouchers/{id}/draw/entries   a page of uniq_draw_entries_place      done pages: CacheBytes       as the draw's
//	  ?after=PLACE&limit=N            (place > after, at most PageMax)
//
// Every answer carries an ETag (the SHA-256 of its body, so every
// instance gives the same one) and If-None-Match is answered 304. Every
// read of the database first takes one of Reads slots (a semaphore below
// the pool's size), waiting at most Queue, else the visitor is answered
// 503 busy: however many visitors, the pages hold at most Reads of the
// pool's connections, and the routes of orders and payments keep the rest.
type Pages struct {
	db    *gorm.DB
	cfg   PagesConfig
	log   *slog.Logger
	slots chan struct{}
	group singleflight.Group

	mu     sync.Mutex
	draws  map[int64]*drawState // fair vouchers' draws, by voucher id
	pages  map[pageKey]*list.Element
	lru    *list.List // of *cachedPage, the most recently used first
	cached int        // bytes of the pages kept
}

// PagesConfig tunes Pages; zero fields take the defaults.
type PagesConfig struct {
	// Fresh is how long a draw not done yet is served from what was read
	// (default 250ms): a page learns the draw is done at most this much
	// after the database says so.
	Fresh time.Duration
	// Reads bounds the database reads of the pages at once (default 8, a
	// quarter of an instance's pool of 32).
	Reads int
	// Queue is the longest a read waits for a slot before the visitor is
	// answered 503 busy (default 1s).
	Queue time.Duration
	// Timeout bounds one read (default 5s): a read stuck on a lock gives
	// its slot back.
	Timeout time.Duration
	// CacheBytes bounds the done draws' pages kept (default 8 MiB, about
	// 100,000 entries).
	CacheBytes int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// PageMax is the most entries a page holds; PageDefault a page without
// limit.
const (
	PageMax     = 500
	PageDefault = 200
)

// maxDraws bounds the draws kept: one per fair voucher asked about.
const maxDraws = 4096

// Cache-Control of the answers: a done draw never changes (its secret is
// published and its entries recorded once); one not done changes at the
// close and when done.
const (
	cacheDone    = "public, max-age=86400"
	cacheOpen    = "public, max-age=1"
	cacheMine    = "private, no-cache"
	cacheMineEnd = "private, max-age=86400"
)

// ErrBusy means the reads of the pages were all taken for longer than the
// queue allows.
var ErrBusy = errors.New("draw pages busy")

// NewPages returns the Pages of an instance, reading db.
func NewPages(db *gorm.DB, cfg PagesConfig, log *slog.Logger) *Pages {
	cfg.Fresh = cmp.Or(cfg.Fresh, 250*time.Millisecond)
	cfg.Reads = cmp.Or(cfg.Reads, 8)
	cfg.Queue = cmp.Or(cfg.Queue, time.Second)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	cfg.CacheBytes = cmp.Or(cfg.CacheBytes, 8<<20)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Pages{db: db, cfg: cfg, log: log, slots: make(chan struct{}, cfg.Reads),
		draws: map[int64]*drawState{}, pages: map[pageKey]*list.Element{}, lru: list.New()}
}

// Status is a draw's small status: what every entrant's page polls.
type Status struct {
	VoucherID int64             `json:"voucher_id"`
	Draw      *voucher.DrawView `json:"draw"`
	// Entries and Winners are counted once the draw is done.
	Entries *int `json:"entry_count,omitempty"`
	Winners *int `json:"winner_count,omitempty"`
}

// Mine is a buyer's own entry: once the draw is done, whether the buyer
// entered and, if so, the entry (its ticket, place and whether it won).
type Mine struct {
	VoucherID int64  `json:"voucher_id"`
	Status    string `json:"status"`
	Entered   *bool  `json:"entered,omitempty"`
	Entry     *Entry `json:"entry,omitempty"`
}

// Page is a run of a draw's entries in its order: those after the place
// asked for. NextAfter, absent on the last page, is the next page's after.
type Page struct {
	VoucherID int64   `json:"voucher_id"`
	Status    string  `json:"status"`
	Entries   []Entry `json:"entries"`
	NextAfter *int    `json:"next_after,omitempty"`
}

// drawState is what an instance knows of one draw: the voucher as read at
// read, its counts once done, and the status last rendered. It is replaced,
// never changed, except rendered under Pages.mu.
type drawState struct {
	v       voucher.Voucher
	read    time.Time
	entries int
	winners int
	// rendered is the status answer for the state it names.
	rendered *answer
}

func (s *drawState) done() bool { return s.v.DrawDoneAt != nil }

// answer is a rendered JSON answer and its ETag.
type answer struct {
	state string // what of the draw it was rendered for (renderKey)
	body  []byte
	etag  string
}

func newAnswer(state string, v any) (*answer, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return &answer{state: state, body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`}, nil
}

// pageKey names a page of a done draw.
type pageKey struct {
	voucher      int64
	after, limit int
}

type cachedPage struct {
	key pageKey
	a   *answer
}

// read runs fn on the database with a slot taken (waiting at most Queue,
// else ErrBusy) and bounded by Timeout.
func (p *Pages) read(ctx context.Context, fn func(tx *gorm.DB) error) error {
	t := time.NewTimer(p.cfg.Queue)
	defer t.Stop()
	select {
	case p.slots <- struct{}{}:
	case <-t.C:
		return ErrBusy
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-p.slots }()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	return fn(p.db.WithContext(ctx))
}

// draw is voucher v's draw as this instance knows it: read again when it
// is not done and older than Fresh, one read at a time per voucher.
// ErrNoDraw for a voucher without one, voucher.ErrNotFound for none.
func (p *Pages) draw(ctx context.Context, v int64) (*drawState, error) {
	if s := p.known(v); s != nil {
		return s, nil
	}
	got, err, _ := p.group.Do("draw:"+strconv.FormatInt(v, 10), func() (any, error) {
		// Read by a call that ended since this one looked.
		if s := p.known(v); s != nil {
			return s, nil
		}
		return p.load(context.WithoutCancel(ctx), v)
	})
	if err != nil {
		return nil, err
	}
	return got.(*drawState), nil
}

// known is voucher v's draw as kept, while it answers: done, or read
// less than Fresh ago; else nil.
func (p *Pages) known(v int64) *drawState {
	p.mu.Lock()
	s := p.draws[v]
	p.mu.Unlock()
	if s != nil && (s.done() || p.cfg.Now().Sub(s.read) < p.cfg.Fresh) {
		return s
	}
	return nil
}

// load reads voucher v's draw and, once done, its counts, and keeps it.
func (p *Pages) load(ctx context.Context, v int64) (*drawState, error) {
	s := &drawState{read: p.cfg.Now()}
	err := p.read(ctx, func(tx *gorm.DB) error {
		var err error
		s.v, err = voucher.NewStore(tx).Get(ctx, v)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !s.v.Fair() {
		return nil, fmt.Errorf("voucher %d: %w", v, ErrNoDraw)
	}
	if s.done() {
		var c struct{ N, W int }
		err := p.read(ctx, func(tx *gorm.DB) error {
			return tx.Raw("SELECT COUNT(*) AS n, COALESCE(SUM(won), 0) AS w FROM draw_entries WHERE voucher_id = ?", v).Scan(&c).Error
		})
		if err != nil {
			return nil, fmt.Errorf("count the entries of voucher %d's draw: %w", v, err)
		}
		s.entries, s.winners = c.N, c.W
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.draws) >= maxDraws {
		p.forgetDraws()
	}
	p.draws[v] = s
	return s, nil
}

// forgetDraws drops the draws not done (read again on the next visit),
// and all of them if that is not enough. Called with mu held.
func (p *Pages) forgetDraws() {
	for id, s := range p.draws {
		if !s.done() {
			delete(p.draws, id)
		}
	}
	if len(p.draws) >= maxDraws {
		clear(p.draws)
	}
}

// renderKey names what a status answer shows that changes with time or
// with the draw: its status, whether the proof of work's challenge is
// shown yet (from the begin) and the digest (from the close).
func renderKey(d *voucher.DrawView) string {
	return d.Status + "|" + strconv.FormatBool(d.Challenge != "") + "|" + d.Digest
}

// status is the status answer of s now.
func (p *Pages) status(s *drawState) (*answer, error) {
	view := voucher.DrawOf(s.v, p.cfg.Now())
	key := renderKey(view)
	p.mu.Lock()
	a := s.rendered
	p.mu.Unlock()
	if a != nil && a.state == key {
		return a, nil
	}
	st := Status{VoucherID: s.v.ID, Draw: view}
	if s.done() {
		st.Entries, st.Winners = &s.entries, &s.winners
	}
	a, err := newAnswer(key, st)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	s.rendered = a
	p.mu.Unlock()
	return a, nil
}

// page is the page of done draw s after place after, at most limit
// entries: from the cache, else read (one read at a time per page).
func (p *Pages) page(ctx context.Context, s *drawState, after, limit int) (*answer, error) {
	k := pageKey{s.v.ID, after, limit}
	if a := p.cachedPage(k); a != nil {
		return a, nil
	}
	got, err, _ := p.group.Do(fmt.Sprintf("page:%d:%d:%d", k.voucher, after, limit), func() (any, error) {
		if a := p.cachedPage(k); a != nil {
			return a, nil
		}
		return p.readPage(context.WithoutCancel(ctx), k)
	})
	if err != nil {
		return nil, err
	}
	return got.(*answer), nil
}

// readPage reads page k from the database and keeps it.
func (p *Pages) readPage(ctx context.Context, k pageKey) (*answer, error) {
	var rows []entryRow
	err := p.read(ctx, func(tx *gorm.DB) error {
		return pageQuery(tx, k).Find(&rows).Error
	})
	if err != nil {
		return nil, fmt.Errorf("read a page of voucher %d's draw: %w", k.voucher, err)
	}
	pg := Page{VoucherID: k.voucher, Status: "done", Entries: make([]Entry, 0, min(len(rows), k.limit))}
	for i, row := range rows {
		if i == k.limit {
			next := pg.Entries[i-1].Place
			pg.NextAfter = &next
			break
		}
		pg.Entries = append(pg.Entries, Entry{UserID: row.UserID, Ticket: row.TicketID, Place: row.Place, Won: row.Won})
	}
	a, err := newAnswer("done", pg)
	if err != nil {
		return nil, err
	}
	p.keepPage(k, a)
	return a, nil
}

// pageQuery selects page k and one entry more (there is a next page when
// it is found), on uniq_draw_entries_place: a range of the key, in its
// order (TestPagesReadOnAnIndex).
func pageQuery(tx *gorm.DB, k pageKey) *gorm.DB {
	return tx.Model(&entryRow{}).Where("voucher_id = ? AND place > ?", k.voucher, k.after).Order("place").Limit(k.limit + 1)
}

// entryQuery selects a buyer's entry, by the primary key.
func entryQuery(tx *gorm.DB, v, user int64) *gorm.DB {
	return tx.Model(&entryRow{}).Where("voucher_id = ? AND user_id = ?", v, user).Limit(1)
}

func (p *Pages) cachedPage(k pageKey) *answer {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.pages[k]
	if !ok {
		return nil
	}
	p.lru.MoveToFront(el)
	return el.Value.(*cachedPage).a
}

// keepPage keeps a done draw's page, dropping the least recently used
// beyond CacheBytes.
func (p *Pages) keepPage(k pageKey, a *answer) {
	size := pageCost(a)
	if size > p.cfg.CacheBytes {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.pages[k]; ok {
		return
	}
	p.pages[k] = p.lru.PushFront(&cachedPage{key: k, a: a})
	p.cached += size
	for p.cached > p.cfg.CacheBytes {
		el := p.lru.Back()
		old := el.Value.(*cachedPage)
		p.lru.Remove(el)
		delete(p.pages, old.key)
		p.cached -= pageCost(old.a)
	}
}

// pageCost is what a kept page costs, its body and about its bookkeeping.
func pageCost(a *answer) int { return len(a.body) + len(a.etag) + 200 }

// Cached reports the pages kept and their bytes, for tests and metrics.
func (p *Pages) Cached() (pages, bytes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pages), p.cached
}

// Status serves GET /api/v1/vouchers/:id/draw: the draw's commitment and
// state and, once done, its secret and how many entered and won.
func (p *Pages) Status(c *gin.Context) {
	s, ok := p.drawOf(c)
	if !ok {
		return
	}
	a, err := p.status(s)
	if err != nil {
		p.fail(c, s.v.ID, err)
		return
	}
	serve(c, a, cacheFor(s))
}

// Mine serves GET /api/v1/vouchers/:id/draw/me: the caller's entry once
// the draw is done, read by its primary key; before, the draw's state.
func (p *Pages) Mine(c *gin.Context) {
	s, ok := p.drawOf(c)
	if !ok {
		return
	}
	m := Mine{VoucherID: s.v.ID, Status: voucher.DrawOf(s.v, p.cfg.Now()).Status}
	cache := cacheMine
	if s.done() {
		user := auth.From(c).UserID
		var rows []entryRow
		err := p.read(c.Request.Context(), func(tx *gorm.DB) error {
			return entryQuery(tx, s.v.ID, user).Find(&rows).Error
		})
		if err != nil {
			p.fail(c, s.v.ID, err)
			return
		}
		entered := len(rows) == 1
		m.Entered = &entered
		if entered {
			m.Entry = &Entry{UserID: rows[0].UserID, Ticket: rows[0].TicketID, Place: rows[0].Place, Won: rows[0].Won}
		}
		cache = cacheMineEnd
	}
	a, err := newAnswer(m.Status, m)
	if err != nil {
		p.fail(c, s.v.ID, err)
		return
	}
	c.Header("Vary", "Authorization")
	serve(c, a, cache)
}

// Entries serves GET /api/v1/vouchers/:id/draw/entries?after=PLACE&limit=N:
// the entries of a done draw after place PLACE (from the first without
// it), at most N (PageDefault, at most PageMax), in the draw's order;
// none before the draw is done.
func (p *Pages) Entries(c *gin.Context) {
	after, limit, ok := pageParams(c)
	if !ok {
		return
	}
	s, ok := p.drawOf(c)
	if !ok {
		return
	}
	if !s.done() {
		a, err := newAnswer("", Page{VoucherID: s.v.ID, Status: voucher.DrawOf(s.v, p.cfg.Now()).Status, Entries: []Entry{}})
		if err != nil {
			p.fail(c, s.v.ID, err)
			return
		}
		serve(c, a, cacheOpen)
		return
	}
	a, err := p.page(c.Request.Context(), s, after, limit)
	if err != nil {
		p.fail(c, s.v.ID, err)
		return
	}
	serve(c, a, cacheDone)
}

// pageParams reads after (a place, -1 or absent for the first page) and
// limit (1 to PageMax); on anything else it answers 400.
func pageParams(c *gin.Context) (after, limit int, ok bool) {
	after, limit = -1, PageDefault
	if s, set := c.GetQuery("after"); set {
		n, err := strconv.Atoi(s)
		if err != nil || n < -1 {
			apierr.BadRequest(c, "after must be a place in the draw's order (0, 1, ...), or -1 for the first page")
			return 0, 0, false
		}
		after = n
	}
	if s, set := c.GetQuery("limit"); set {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > PageMax {
			apierr.BadRequest(c, "limit must be from 1 to "+strconv.Itoa(PageMax))
			return 0, 0, false
		}
		limit = n
	}
	return after, limit, true
}

// drawOf is the draw of the voucher the path names; on a failure it
// answers and reports false.
func (p *Pages) drawOf(c *gin.Context) (*drawState, bool) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return nil, false
	}
	s, err := p.draw(c.Request.Context(), id)
	if err != nil {
		p.fail(c, id, err)
		return nil, false
	}
	return s, true
}

// fail answers a failure of the pages: the translation of their errors.
func (p *Pages) fail(c *gin.Context, v int64, err error) {
	switch {
	case errors.Is(err, voucher.ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "voucher_not_found", "no voucher has this id")
	case errors.Is(err, ErrNoDraw):
		apierr.Abort(c, http.StatusNotFound, "no_draw", "this voucher opens without a draw")
	case errors.Is(err, ErrBusy):
		c.Header("Retry-After", "1")
		apierr.Unavailable(c, "busy", "the draw's pages are busy; try again in a second")
	default:
		p.log.Error("read a draw failed", "voucher", v, "err", err)
		apierr.Unavailable(c, "unavailable", "the draw cannot be read right now")
	}
}

func cacheFor(s *drawState) string {
	if s.done() {
		return cacheDone
	}
	return cacheOpen
}

// serve writes a: 304 when the request's If-None-Match names its ETag.
func serve(c *gin.Context, a *answer, cacheControl string) {
	h := c.Writer.Header()
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", cacheControl)
	if matches(c.GetHeader("If-None-Match"), a.etag) {
		c.Status(http.StatusNotModified)
		return
	}
	c.Data(http.StatusOK, "application/json; charset=utf-8", a.body)
}

// matches reports whether an If-None-Match value names etag (weakly, as
// RFC 9110 compares for it), or is "*".
func matches(header, etag string) bool {
	if header == "" {
		return false
	}
	for tag := range strings.SplitSeq(header, ",") {
		tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
		if tag == etag || tag == "*" {
			return true
		}
	}
	return false
}
