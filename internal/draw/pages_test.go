package draw

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

const pagesSecret = "pages-test-secret-pages-test-secret-0123"

// doneDraw is a fair voucher's draw of entrants entries for stock units,
// drawn and done.
func doneDraw(t *testing.T, dialect string, stock, entrants int) env {
	t.Helper()
	e := newEnv(t, dialect, stock, time.Now().Add(-time.Second))
	e.enterAll(t, 1, entrants)
	if err := e.drawer().Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.voucher(t).DrawDoneAt == nil {
		t.Fatal("the draw is not done after a pass")
	}
	return e
}

// countReads counts the statements db runs from now on.
func countReads(t *testing.T, db *gorm.DB) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	count := func(*gorm.DB) { n.Add(1) }
	for _, err := range []error{
		db.Callback().Query().Before("gorm:query").Register("test:count_query", count),
		db.Callback().Row().Before("gorm:row").Register("test:count_row", count),
		db.Callback().Raw().Before("gorm:raw").Register("test:count_raw", count),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return &n
}

// pagesServer serves p's routes as cmd/api does (without the limits), the
// buyer's route behind a token.
func pagesServer(t *testing.T, p *Pages) string {
	t.Helper()
	gin.SetMode(gin.TestMode)
	signer, err := auth.NewSigner([]byte(pagesSecret))
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.GET("/api/v1/vouchers/:id/draw", p.Status)
	r.GET("/api/v1/vouchers/:id/draw/entries", p.Entries)
	r.GET("/api/v1/vouchers/:id/draw/me", signer.Middleware(), p.Mine)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func buyerToken(t *testing.T, user int64) string {
	t.Helper()
	signer, err := auth.NewSigner([]byte(pagesSecret))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := signer.Mint(auth.Identity{UserID: user, Role: auth.RoleUser}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

type got struct {
	status int
	header http.Header
	body   []byte
}

func fetch(t testing.TB, url string, hdr ...string) got {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return got{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return got{resp.StatusCode, resp.Header, b}
}

// TestPagesReadOnAnIndex: a page of a draw's entries is a range of
// uniq_draw_entries_place (migration 13) read in the key's order, never a
// sort of the voucher's entries; a buyer's entry is read by the primary
// key; two entries at one place of a draw are refused.
func TestPagesReadOnAnIndex(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"mariadb", "sqlite"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			e := doneDraw(t, dialect, 10, 300)
			// Another voucher's entries beside it, so that a plan
			// reading the voucher's rows and sorting them would show.
			rows := make([]entryRow, 300)
			for i := range rows {
				rows[i] = entryRow{VoucherID: e.v.ID + 1, UserID: int64(i + 1), TicketID: int64(5000 + i), Place: i}
			}
			if err := e.db.Exec("INSERT INTO vouchers (id, title, face_value, total_stock, stock, begin_at, end_at, created_at, updated_at) SELECT ?, title, face_value, total_stock, stock, begin_at, end_at, created_at, updated_at FROM vouchers WHERE id = ?", e.v.ID+1, e.v.ID).Error; err != nil {
				t.Fatal(err)
			}
			if err := e.db.CreateInBatches(rows, 100).Error; err != nil {
				t.Fatal(err)
			}
			page := e.db.ToSQL(func(tx *gorm.DB) *gorm.DB { return pageQuery(tx, pageKey{e.v.ID, 99, PageDefault}).Find(&[]entryRow{}) })
			mine := e.db.ToSQL(func(tx *gorm.DB) *gorm.DB { return entryQuery(tx, e.v.ID, 7).Find(&[]entryRow{}) })
			if dialect == "sqlite" {
				for q, want := range map[string]string{page: "USING INDEX uniq_draw_entries_place", mine: "USING INDEX sqlite_autoindex_draw_entries_1"} {
					plan := sqlitePlan(t, e.db, q)
					if !strings.Contains(plan, want) || strings.Contains(plan, "TEMP B-TREE") {
						t.Errorf("%s\nplan: %s\nwant %s, no sort", q, plan, want)
					}
				}
			} else {
				if err := e.db.Exec("ANALYZE TABLE draw_entries").Error; err != nil {
					t.Fatal(err)
				}
				for q, want := range map[string]string{page: "uniq_draw_entries_place", mine: "PRIMARY"} {
					key, extra := mariadbPlan(t, e.db, q)
					if key != want || strings.Contains(extra, "filesort") {
						t.Errorf("%s\nplan: key %q, extra %q; want %s, no filesort", q, key, extra, want)
					}
				}
			}
			dup := entryRow{VoucherID: e.v.ID, UserID: 100_000, TicketID: 1, Place: 5}
			if err := e.db.Create(&dup).Error; err == nil {
				t.Error("a second entry at place 5 of the draw was taken")
			}
		})
	}
}

func sqlitePlan(t *testing.T, db *gorm.DB, q string) string {
	t.Helper()
	var steps []struct{ Detail string }
	if err := db.Raw("EXPLAIN QUERY PLAN " + q).Scan(&steps).Error; err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range steps {
		out = append(out, s.Detail)
	}
	return strings.Join(out, "; ")
}

func mariadbPlan(t *testing.T, db *gorm.DB, q string) (key, extra string) {
	t.Helper()
	var rows []struct {
		Key   *string
		Extra *string
	}
	if err := db.Raw("EXPLAIN " + q).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Key == nil {
		return "", fmt.Sprint(rows)
	}
	if rows[0].Extra != nil {
		extra = *rows[0].Extra
	}
	return *rows[0].Key, extra
}

// TestPagesCostNothingPerVisitor: the database does not see a draw's
// visitors. A done draw of 1,000 entries: 500 visitors asking for its
// status at once cost two reads (the voucher, its counts), every one the
// same answer with its ETag and a day's public Cache-Control, and asked
// with that ETag a 304; 100 readers paging the whole list at once cost
// one read per page; each buyer's own entry costs one read, by its key.
// A draw not done is read again at most once per Fresh, however many
// poll it. The list read through Fetch is the recorded result and checks.
func TestPagesCostNothingPerVisitor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := doneDraw(t, "mariadb", 10, 1000)
	reads := countReads(t, e.db)
	p := NewPages(e.db, PagesConfig{}, quietLog)
	base := pagesServer(t, p)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", base, e.v.ID)

	// The status, 500 visitors at once.
	answers := make([]got, 500)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { <-start; answers[i] = fetch(t, draw) })
	}
	close(start)
	wg.Wait()
	if n := reads.Load(); n != 2 {
		t.Errorf("500 visitors of the status cost %d reads, want 2 (the voucher, its counts)", n)
	}
	first := answers[0]
	var st Status
	if err := json.Unmarshal(first.body, &st); err != nil || st.Draw == nil || st.Draw.Status != "done" || st.Draw.Secret != e.secret() ||
		st.Entries == nil || *st.Entries != 1000 || st.Winners == nil || *st.Winners != 10 {
		t.Fatalf("status %d %s (%v); want done, the secret, 1000 entries and 10 winners", first.status, first.body, err)
	}
	if strings.Contains(string(first.body), `"entries"`) || len(first.body) > 1024 {
		t.Errorf("the status holds the list or more than 1 KiB (%d bytes): %s", len(first.body), first.body)
	}
	etag := first.header.Get("ETag")
	for _, a := range answers {
		if a.status != 200 || string(a.body) != string(first.body) || a.header.Get("ETag") != etag || a.header.Get("Cache-Control") != "public, max-age=86400" {
			t.Fatalf("a visitor got %d %s ETag %q Cache-Control %q; want the first's, cacheable for a day",
				a.status, a.body, a.header.Get("ETag"), a.header.Get("Cache-Control"))
		}
	}
	if a := fetch(t, draw, "If-None-Match", etag); a.status != http.StatusNotModified || len(a.body) != 0 {
		t.Errorf("asked with its ETag %s: %d %q, want 304 and no body", etag, a.status, a.body)
	}

	// The list, 100 readers paging all of it at once, 100 a page.
	want, err := Results(ctx, e.db, e.v.ID)
	if err != nil {
		t.Fatal(err)
	}
	before := reads.Load()
	start = make(chan struct{})
	lists := make([][]Entry, 100)
	for i := range lists {
		wg.Go(func() {
			<-start
			for after := -1; ; {
				a := fetch(t, fmt.Sprintf("%s/entries?after=%d&limit=100", draw, after))
				var pg Page
				if a.status != 200 || json.Unmarshal(a.body, &pg) != nil || a.header.Get("Cache-Control") != "public, max-age=86400" || a.header.Get("ETag") == "" {
					t.Errorf("page after %d: %d %s, Cache-Control %q", after, a.status, a.body, a.header.Get("Cache-Control"))
					return
				}
				lists[i] = append(lists[i], pg.Entries...)
				if pg.NextAfter == nil {
					return
				}
				after = *pg.NextAfter
			}
		})
	}
	close(start)
	wg.Wait()
	if n := reads.Load() - before; n != 10 {
		t.Errorf("100 readers of the list, 10 pages each, cost %d reads, want 10: one per page", n)
	}
	for _, l := range lists {
		if !slices.Equal(l, want.Entries) {
			t.Fatalf("a reader paged %d entries, not the recorded list of %d", len(l), len(want.Entries))
		}
	}
	if pages, bytes := p.Cached(); pages != 10 || bytes > 200_000 {
		t.Errorf("%d pages of %d bytes kept, want the 10 read", pages, bytes)
	}

	// Each buyer's own entry: one read by its key.
	before = reads.Load()
	for _, u := range []int64{1, 500, 1000} {
		a := fetch(t, draw+"/me", "Authorization", "Bearer "+buyerToken(t, u))
		var m Mine
		if a.status != 200 || json.Unmarshal(a.body, &m) != nil || m.Entered == nil || !*m.Entered || m.Entry == nil {
			t.Fatalf("user %d's entry: %d %s", u, a.status, a.body)
		}
		i := slices.IndexFunc(want.Entries, func(en Entry) bool { return en.UserID == u })
		if *m.Entry != want.Entries[i] || m.Status != "done" {
			t.Errorf("user %d's entry %+v, the list holds %+v", u, *m.Entry, want.Entries[i])
		}
		if cc, vary := a.header.Get("Cache-Control"), a.header.Get("Vary"); cc != "private, max-age=86400" || vary != "Authorization" {
			t.Errorf("user %d's entry: Cache-Control %q, Vary %q; want private, by Authorization", u, cc, vary)
		}
	}
	a := fetch(t, draw+"/me", "Authorization", "Bearer "+buyerToken(t, 5000))
	if a.status != 200 || string(a.body) != fmt.Sprintf(`{"voucher_id":%d,"status":"done","entered":false}`, e.v.ID) {
		t.Errorf("a buyer who did not enter: %d %s", a.status, a.body)
	}
	if n := reads.Load() - before; n != 4 {
		t.Errorf("4 buyers' entries cost %d reads, want 4", n)
	}
	if a := fetch(t, draw+"/me"); a.status != http.StatusUnauthorized {
		t.Errorf("the buyer's entry without a token: %d, want 401", a.status)
	}

	// Anyone's check: the published draw read through the pages.
	r, err := Fetch(ctx, http.DefaultClient, base, e.v.ID)
	if err != nil || !slices.Equal(r.Entries, want.Entries) {
		t.Fatalf("Fetch: %d entries, %v; want the recorded %d", len(r.Entries), err, len(want.Entries))
	}
	if err := Check(r); err != nil {
		t.Errorf("the draw fetched does not check: %v", err)
	}

	// Bad pages.
	for _, q := range []string{"after=-2", "after=x", "limit=0", fmt.Sprintf("limit=%d", PageMax+1)} {
		if a := fetch(t, draw+"/entries?"+q); a.status != 400 {
			t.Errorf("?%s answered %d, want 400", q, a.status)
		}
	}
}

// TestPagesPollAnOpenDraw: a draw not done is read once per Fresh however
// many poll it (an injected clock), answered with a second's Cache-Control,
// its list empty; a digest published is shown at the next read; once the
// clock passes Fresh after the database says it is done, the pollers hear
// it.
func TestPagesPollAnOpenDraw(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", 10, time.Now().Add(time.Hour))
	e.enterAll(t, 1, 20)
	reads := countReads(t, e.db)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	p := NewPages(e.db, PagesConfig{Now: func() time.Time { return time.Unix(0, clock.Load()) }}, quietLog)
	base := pagesServer(t, p)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", base, e.v.ID)
	poll := func(n int) []got {
		out := make([]got, n)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range out {
			wg.Go(func() { <-start; out[i] = fetch(t, draw) })
		}
		close(start)
		wg.Wait()
		return out
	}
	for round := range 3 {
		before := reads.Load()
		for _, a := range poll(200) {
			if a.status != 200 || !strings.Contains(string(a.body), `"status":"open"`) || a.header.Get("Cache-Control") != "public, max-age=1" {
				t.Fatalf("round %d: %d %s Cache-Control %q", round, a.status, a.body, a.header.Get("Cache-Control"))
			}
		}
		if n := reads.Load() - before; n != 1 {
			t.Errorf("round %d: 200 pollers cost %d reads, want 1", round, n)
		}
		clock.Add(int64(p.cfg.Fresh))
	}
	if a := fetch(t, draw+"/entries"); a.status != 200 || string(a.body) != fmt.Sprintf(`{"voucher_id":%d,"status":"open","entries":[]}`, e.v.ID) ||
		a.header.Get("Cache-Control") != "public, max-age=1" {
		t.Errorf("the list of an open draw: %d %s %q", a.status, a.body, a.header.Get("Cache-Control"))
	}
	if a := fetch(t, draw+"/me", "Authorization", "Bearer "+buyerToken(t, 3)); a.status != 200 ||
		string(a.body) != fmt.Sprintf(`{"voucher_id":%d,"status":"open"}`, e.v.ID) || a.header.Get("Cache-Control") != "private, no-cache" {
		t.Errorf("the buyer's entry of an open draw: %d %s %q", a.status, a.body, a.header.Get("Cache-Control"))
	}
	// A digest published (the close) shows once read again, though the
	// status it answers is the same.
	if err := e.db.Exec("UPDATE vouchers SET draw_digest = 'd1' WHERE id = ?", e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	clock.Add(int64(p.cfg.Fresh))
	if a := fetch(t, draw); !strings.Contains(string(a.body), `"status":"open"`) || !strings.Contains(string(a.body), `"digest":"d1"`) {
		t.Errorf("a digest published: %s, want it shown", a.body)
	}
	// The database says done: heard once Fresh has passed.
	if err := e.db.Exec("UPDATE vouchers SET draw_done_at = ? WHERE id = ?", time.Now().UTC(), e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	if a := fetch(t, draw); !strings.Contains(string(a.body), `"status":"open"`) {
		t.Errorf("within Fresh: %s, want the status read before", a.body)
	}
	clock.Add(int64(p.cfg.Fresh))
	if a := fetch(t, draw); !strings.Contains(string(a.body), `"status":"done"`) || a.header.Get("Cache-Control") != "public, max-age=86400" {
		t.Errorf("after Fresh: %s %q, want done", a.body, a.header.Get("Cache-Control"))
	}
	if a := fetch(t, fmt.Sprintf("%s/api/v1/vouchers/%d/draw", base, e.v.ID+99)); a.status != 404 ||
		!strings.Contains(string(a.body), "voucher_not_found") {
		t.Errorf("no voucher: %d %s", a.status, a.body)
	}
}

// TestPagesHoldFewConnections: the pages hold at most Reads of the pool's
// connections, however many visitors wait on a database that stalls
// (draw_entries locked by another session): the others wait at most Queue
// and are answered 503 busy with Retry-After, and the pool still serves
// everything else at once. Once the lock goes, the reads held finish.
func TestPagesHoldFewConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := doneDraw(t, "mariadb", 10, 100)
	const reads, visitors = 3, 40
	p := NewPages(e.db, PagesConfig{Reads: reads, Queue: 300 * time.Millisecond}, quietLog)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", pagesServer(t, p), e.v.ID)
	if a := fetch(t, draw); a.status != 200 {
		t.Fatalf("status: %d %s", a.status, a.body)
	}
	sqlDB, err := e.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	lock, err := sqlDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if _, err := lock.ExecContext(ctx, "LOCK TABLES draw_entries WRITE"); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if _, err := lock.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unlock()

	answers := make([]got, visitors)
	var wg sync.WaitGroup
	var busyN, okN atomic.Int64
	for i := range answers {
		// Each visitor a page of its own: none is read for another.
		wg.Go(func() {
			a := fetch(t, fmt.Sprintf("%s/entries?after=%d&limit=1", draw, i))
			switch a.status {
			case http.StatusServiceUnavailable:
				busyN.Add(1)
			case http.StatusOK:
				okN.Add(1)
			}
			answers[i] = a
		})
	}
	busy := func() int { return int(busyN.Load()) }
	most := 0
	testenv.WaitFor(t, 20*time.Second, "the visitors without a read answered busy", func() bool {
		most = max(most, sqlDB.Stats().InUse-1) // the lock's own connection
		// The pool serves others meanwhile, at once.
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var one int
		if err := sqlDB.QueryRowContext(qctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatalf("the pool did not serve a query while the pages waited: %v (%d in use)", err, sqlDB.Stats().InUse)
		}
		return most >= reads && busy() == visitors-reads
	})
	if most > reads {
		t.Errorf("the pages held %d connections, want at most %d", most, reads)
	}
	unlock()
	wg.Wait()
	for _, a := range answers {
		if a.status == http.StatusServiceUnavailable && (!strings.Contains(string(a.body), `"busy"`) || a.header.Get("Retry-After") != "1") {
			t.Errorf("a visitor without a read: %s Retry-After %q, want busy and 1", a.body, a.header.Get("Retry-After"))
		}
	}
	if ok := int(okN.Load()); ok != reads || busy() != visitors-reads {
		t.Errorf("%d answered 200 and %d busy, want %d and %d", ok, busy(), reads, visitors-reads)
	}
}

// TestPagesShowChallengeAtBegin: a draw with a proof of work shows its
// challenge from its begin, to the millisecond, though the status was
// read and rendered just before it (within Fresh): no entrant's page
// waits for the next read to start solving.
func TestPagesShowChallengeAtBegin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", 10, time.Now().Add(time.Hour))
	if err := e.db.Exec("UPDATE vouchers SET pow_bits = 8, draw_pow_nonce = 'n1' WHERE id = ?", e.v.ID).Error; err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(e.v.BeginAt.Add(-time.Millisecond).UnixNano())
	p := NewPages(e.db, PagesConfig{Now: func() time.Time { return time.Unix(0, clock.Load()) }}, quietLog)
	draw := fmt.Sprintf("%s/api/v1/vouchers/%d/draw", pagesServer(t, p), e.v.ID)
	before := fetch(t, draw)
	if before.status != 200 || strings.Contains(string(before.body), `"challenge"`) {
		t.Fatalf("before the begin: %d %s, want no challenge", before.status, before.body)
	}
	clock.Add(int64(2 * time.Millisecond))
	at := fetch(t, draw, "If-None-Match", before.header.Get("ETag"))
	if at.status != 200 || !strings.Contains(string(at.body), `"challenge":"seckill-draw:`) || !strings.Contains(string(at.body), `:n1"`) {
		t.Fatalf("at the begin: %d %s, want the challenge with its nonce", at.status, at.body)
	}
}
