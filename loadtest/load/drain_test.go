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
	drain := func(ids ...int64) DrainResult {
		t.Helper()
		started := make(chan struct{})
		cfg.Log = signalWriter{started}
		done := startDrain(ctx, cfg)
		var r drainOutcome
		select {
		case <-started:
			for _, id := range ids {
				insert(id)
			}
			r = <-done
		case r = <-done:
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.res
	}

	if r := drain(901, 902); r.Orders != 2 || r.Seconds < 0 || r.WaitSeconds < 0 {
		t.Fatalf("drain %+v; want 2 orders", r)
	}

	cfg.Log = io.Discard
	if _, err := Drain(ctx, cfg); err == nil || !strings.Contains(err.Error(), "already had 2 orders") {
		t.Fatalf("drain of a voucher drained before the watch: %v", err)
	}

	// A schema older than the counters: the orders alone are counted.
	if err := g.Exec("DROP TABLE order_counts").Error; err != nil {
		t.Fatal(err)
	}
	counted = false
	cfg.Expect = 5
	if r := drain(903, 904, 905); r.Orders != 3 {
		t.Fatalf("drain without counters %+v; want 3 orders", r)
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
