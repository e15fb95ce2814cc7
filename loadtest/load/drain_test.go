package load

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// signalWriter closes started on its first write: the watch has begun.
type signalWriter struct{ started chan struct{} }

func (w signalWriter) Write(p []byte) (int, error) {
	select {
	case <-w.started:
	default:
		close(w.started)
	}
	return len(p), nil
}

// TestDrainTimesOrdersWritten: the clock runs from the first order written
// after the watch began; with no consumer group on the stream nothing is
// pending. A voucher that had its orders before the watch is an error. The
// watch counts the orders by their counters, holds the counters to the
// orders when drained, and counts a schema without counters order by
// order.
func TestDrainTimesOrdersWritten(t *testing.T) {
	t.Parallel()
	r := newDrainRig(t)
	if o := r.watch(func() { r.order(901, true); r.order(902, true) }); o.err != nil || o.res.Orders != 2 || o.res.Seconds < 0 || o.res.WaitSeconds < 0 {
		t.Fatalf("drain %+v, %v; want 2 orders", o.res, o.err)
	}

	r.cfg.Log = io.Discard
	if _, err := Drain(context.Background(), r.cfg); err == nil || !strings.Contains(err.Error(), "already had 2 orders") {
		t.Fatalf("drain of a voucher drained before the watch: %v", err)
	}

	// Counters that disagree with the orders when the watch ends (an
	// order written without them, two counted by hand): an error, not a
	// figure.
	r.cfg.Expect = 4
	o := r.watch(func() {
		r.order(903, false)
		r.exec("UPDATE order_counts SET n = n + 2 WHERE voucher_id = ? AND slot = 0", r.v.ID)
	})
	if o.err == nil || !strings.Contains(o.err.Error(), "order counters say 4 orders, MySQL holds 3") {
		t.Fatalf("drain with counters off by one: %+v, %v", o.res, o.err)
	}

	// A schema older than the counters: the orders alone are counted.
	r.exec("DROP TABLE order_counts")
	r.cfg.Expect = 6
	if o := r.watch(func() { r.order(904, false); r.order(905, false); r.order(906, false) }); o.err != nil || o.res.Orders != 3 {
		t.Fatalf("drain without counters %+v, %v; want 3 orders", o.res, o.err)
	}
}

// drainRig is a voucher in a database of the test's own, and the drain
// config that watches it.
type drainRig struct {
	t   *testing.T
	g   *gorm.DB
	v   voucher.Voucher
	cfg DrainConfig
}

func newDrainRig(t *testing.T) *drainRig {
	t.Helper()
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t)
	g, err := db.OpenMySQL(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	v := voucher.Voucher{Title: "t", TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	return &drainRig{t: t, g: g, v: v, cfg: DrainConfig{
		VoucherID: v.ID, Expect: 2, RedisURL: testenv.RedisURL(t), MySQLDSN: dsn,
		KeyPrefix: testenv.Prefix(t), Shards: 1, Timeout: time.Minute,
	}}
}

// order writes an order of the voucher, its counters recounted when
// counted, else the row alone.
func (r *drainRig) order(id int64, counted bool) {
	r.t.Helper()
	if counted {
		writeOrder(r.t, r.g, r.v, id, id)
		return
	}
	now := time.Now()
	r.exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (?, ?, ?, ?, ?)", id, id, r.v.ID, now, now)
}

func (r *drainRig) exec(sql string, args ...any) {
	r.t.Helper()
	if err := r.g.Exec(sql, args...).Error; err != nil {
		r.t.Fatal(err)
	}
}

// watch runs a drain while write writes, once the watch began, and
// returns its outcome.
func (r *drainRig) watch(write func()) drainOutcome {
	r.t.Helper()
	started := make(chan struct{})
	r.cfg.Log = signalWriter{started}
	done := startDrain(context.Background(), r.cfg)
	select {
	case <-started:
		write()
		return <-done
	case o := <-done:
		return o
	}
}

// drainOutcome is what Drain returned.
type drainOutcome struct {
	res DrainResult
	err error
}

// startDrain runs Drain in the background; its outcome arrives on the
// channel.
func startDrain(ctx context.Context, cfg DrainConfig) <-chan drainOutcome {
	done := make(chan drainOutcome, 1)
	go func() {
		res, err := Drain(ctx, cfg)
		done <- drainOutcome{res, err}
	}()
	return done
}
