package load

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

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
// watch counts the orders by their counters, and a schema without counters
// order by order.
func TestDrainTimesOrdersWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.MySQLDSN(t)
	g, err := db.OpenMySQL(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(g)
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	v := voucher.Voucher{Title: "t", TotalStock: 5, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	if err := voucher.NewStore(g).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	counted := true
	insert := func(id int64) {
		t.Helper()
		if counted {
			writeOrder(t, g, v, id, id) // and recounted
			return
		}
		now := time.Now()
		if err := g.Exec("INSERT INTO orders (id, user_id, voucher_id, accepted_at, created_at) VALUES (?, ?, ?, ?, ?)", id, id, v.ID, now, now).Error; err != nil {
			t.Fatal(err)
		}
	}
	cfg := DrainConfig{
		VoucherID: v.ID, Expect: 2, RedisURL: testenv.RedisURL(t), MySQLDSN: dsn,
		KeyPrefix: testenv.Prefix(t), Shards: 1, Timeout: time.Minute,
	}
	// drain watches while write writes; the watch's outcome.
	drain := func(write func()) drainOutcome {
		t.Helper()
		started := make(chan struct{})
		cfg.Log = signalWriter{started}
		done := startDrain(ctx, cfg)
		select {
		case <-started:
			write()
			return <-done
		case r := <-done:
			return r
		}
	}
	orders := func(ids ...int64) func() {
		return func() {
			for _, id := range ids {
				insert(id)
			}
		}
	}

	if r := drain(orders(901, 902)); r.err != nil || r.res.Orders != 2 || r.res.Seconds < 0 || r.res.WaitSeconds < 0 {
		t.Fatalf("drain %+v, %v; want 2 orders", r.res, r.err)
	}

	cfg.Log = io.Discard
	if _, err := Drain(ctx, cfg); err == nil || !strings.Contains(err.Error(), "already had 2 orders") {
		t.Fatalf("drain of a voucher drained before the watch: %v", err)
	}

	// Counters that disagree with the orders when the watch ends (an
	// order written without them, two counted by hand): an error, not a
	// figure.
	cfg.Expect = 4
	r := drain(func() {
		counted = false
		insert(903)
		if err := g.Exec("UPDATE order_counts SET n = n + 2 WHERE voucher_id = ? AND slot = 0", v.ID).Error; err != nil {
			t.Error(err)
		}
	})
	if r.err == nil || !strings.Contains(r.err.Error(), "order counters say 4 orders, MySQL holds 3") {
		t.Fatalf("drain with counters off by one: %+v, %v", r.res, r.err)
	}

	// A schema older than the counters: the orders alone are counted.
	if err := g.Exec("DROP TABLE order_counts").Error; err != nil {
		t.Fatal(err)
	}
	cfg.Expect = 6
	if r := drain(orders(904, 905, 906)); r.err != nil || r.res.Orders != 3 {
		t.Fatalf("drain without counters %+v, %v; want 3 orders", r.res, r.err)
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
