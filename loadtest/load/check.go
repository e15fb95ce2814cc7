package load

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

// CheckConfig says where the pipeline's state is read after a run.
type CheckConfig struct {
	RedisURL  string // SECKILL_REDIS_URL of the deployment: one server or a Redis Cluster
	MySQLDSN  string // SECKILL_MYSQL_DSN of the deployment
	KeyPrefix string // SECKILL_KEY_PREFIX, default seckill
	Shards    int    // SECKILL_SHARDS, default 1
	Group     string // the workers' consumer group, default order-writers
	// DrainTimeout bounds the wait for the pipeline to drain, default 2m.
	DrainTimeout time.Duration
}

// Report is what the check found after the drain. Orders counts the
// orders written, whatever became of them since (an order that expired
// unpaid was still sold); Live those still holding a unit; ByState each
// state's (awaiting_payment, paid, used, cancelled, refunded).
type Report struct {
	OK           bool           `json:"ok"`
	Orders       int            `json:"orders"`
	ExpectOrders string         `json:"expected_orders"`
	Live         int            `json:"live_orders"`
	ByState      map[string]int `json:"orders_by_state"`
	NeedsRefund  int            `json:"payments_needing_refund"`
	DeadLetters  int            `json:"dead_letters"`
	DBStock      int            `json:"mysql_stock"`
	RedisStock   int64          `json:"redis_stock"`
	Pending      int64          `json:"pending"`
	StreamLength int64          `json:"stream_length"`
	Unsure       int            `json:"buyers_with_only_unsure_answers"`
	DrainSeconds float64        `json:"drain_seconds"`
	Violations   []string       `json:"violations,omitempty"`
}

// check waits until the pipeline drained (or DrainTimeout passed) and checks
// the invariants of internal/verify (the lifecycle's too: stock conserved
// over live orders, every cancellation's unit back) plus the load test's
// own: orders written = min(stock, buyers), no dead letters, answers that
// agree with each other. The buyers never pay: with a price and a pay
// window shorter than the run, orders expire and their units are sold
// again, which this expectation does not foresee.
//
// A buyer whose purchases got no definite answer (a 502 when an instance
// died, a timeout) may or may not hold an order: the purchase script may have
// run. Such an order is allowed when it is the buyer's only one; it is read
// from MySQL, since the buyer was never told its id.
func check(ctx context.Context, cc CheckConfig, cfg Config, vid int64, res Result) (Report, error) {
	cc.Group = cmp.Or(cc.Group, "order-writers")
	cc.DrainTimeout = cmp.Or(cc.DrainTimeout, 2*time.Minute)
	g, err := db.OpenMySQL(cc.MySQLDSN, 4)
	if err != nil {
		return Report{}, err
	}
	defer db.Close(g)
	rdb, keys, err := openSale(cc.RedisURL, cc.KeyPrefix, cc.Shards)
	if err != nil {
		return Report{}, err
	}
	defer rdb.Close()

	a := readAnswers(res, vid, cc.Group)
	start := time.Now()
	rep, err := waitConsistent(ctx, g, rdb, keys, cc.DrainTimeout, a, cfg.Log)
	if err != nil {
		return Report{}, err
	}
	out := Report{
		Orders: rep.Orders, Live: rep.Live, ByState: rep.ByState, NeedsRefund: rep.NeedsRefund,
		DeadLetters: rep.DeadLetters, DBStock: rep.DBStock, RedisStock: rep.RedisStock,
		Pending: rep.Pending, StreamLength: rep.StreamLength, Unsure: len(a.unsure),
		DrainSeconds: time.Since(start).Seconds(), Violations: rep.Violations,
	}
	if !rep.OK() {
		out.Violations = append(out.Violations, fmt.Sprintf("the pipeline did not drain to a consistent state within %s", cc.DrainTimeout))
	}
	out.Violations = append(out.Violations, res.problems...)
	out.Violations = append(out.Violations, a.problems...)
	if rep.DeadLetters > 0 {
		out.Violations = append(out.Violations, fmt.Sprintf("%d dead letters: a clean sale makes none", rep.DeadLetters))
	}
	var bad string
	out.ExpectOrders, bad = a.expectOrders(rep, res.Summary.Outcomes["409 sold_out"] > 0)
	if bad != "" {
		out.Violations = append(out.Violations, bad)
	}
	out.OK = len(out.Violations) == 0
	return out, nil
}

// answers is what the buyers were told: the orders accepted (id -> buyer)
// and the buyers refused, for verify; those told nothing definite; the
// answers that disagree with each other.
type answers struct {
	in                verify.Input
	unsure            map[int64]bool
	problems          []string
	pressed, definite int // buyers who pressed; those of them with a definite order
}

// readAnswers sorts the buyers of a run by what they were told.
func readAnswers(res Result, vid int64, group string) answers {
	a := answers{in: verify.Input{VoucherID: vid, Accepted: map[int64]int64{}, Group: group}, unsure: map[int64]bool{}}
	for i, b := range res.buyers {
		user := res.ids[i]
		if !b.pressed {
			continue
		}
		a.pressed++
		switch {
		case b.accepted != 0:
			a.definite++
			a.in.Accepted[b.accepted] = user
			if b.held != 0 && b.held != b.accepted {
				a.problems = append(a.problems, fmt.Sprintf("user %d was accepted with order %d but told it holds order %d", user, b.accepted, b.held))
			}
		case b.held != 0:
			// An earlier purchase whose answer was lost took this order;
			// the buyer was told its id, so it must land like any other.
			a.definite++
			a.in.Accepted[b.held] = user
		case b.indeterminate:
			a.unsure[user] = true
		default:
			a.in.Refused = append(a.in.Refused, user)
		}
	}
	return a
}

// waitConsistent checks the invariants every 100ms, logging the drain
// every second, until they hold or timeout passes; it returns the last
// report.
func waitConsistent(ctx context.Context, g *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, timeout time.Duration, a answers, log io.Writer) (verify.Report, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	lastLog := start
	for {
		if err := allowUnsure(ctx, g, a.in.VoucherID, a.unsure, a.in.Accepted); err != nil {
			return verify.Report{}, err
		}
		rep, err := verify.Check(ctx, g, rdb, keys, a.in)
		if err != nil {
			return verify.Report{}, err
		}
		if rep.OK() || time.Now().After(deadline) {
			return rep, nil
		}
		if time.Since(lastLog) >= time.Second {
			fmt.Fprintf(log, "draining: %d orders in MySQL (%d live), %d pending, %d in the stream\n", rep.Orders, rep.Live, rep.Pending, rep.StreamLength)
			lastLog = time.Now()
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return verify.Report{}, ctx.Err()
		}
	}
}

// expectOrders is the orders the sale should have written, and what is
// wrong with rep's count ("" when nothing): min(stock, distinct buyers)
// when every answer was definite; with unsure answers, a sold-out sale
// still sells exactly its stock, another between the definite orders and
// that minimum.
func (a answers) expectOrders(rep verify.Report, soldOut bool) (string, string) {
	stock := rep.TotalStock
	want := min(stock, a.pressed)
	switch {
	case len(a.unsure) == 0:
		if rep.Orders != want {
			return fmt.Sprint(want), fmt.Sprintf("%d orders, want min(stock %d, buyers %d) = %d", rep.Orders, stock, a.pressed, want)
		}
		return fmt.Sprint(want), ""
	case soldOut:
		if rep.Orders != stock {
			return fmt.Sprint(stock), fmt.Sprintf("sold out, but %d orders for a stock of %d", rep.Orders, stock)
		}
		return fmt.Sprint(stock), ""
	default:
		if rep.Orders < a.definite || rep.Orders > want {
			return fmt.Sprintf("%d..%d", a.definite, want), fmt.Sprintf("%d orders, want between %d (definitely accepted) and %d", rep.Orders, a.definite, want)
		}
		return fmt.Sprintf("%d..%d", a.definite, want), ""
	}
}

// allowUnsure adds to accepted the orders MySQL holds for buyers whose
// answers were all unsure.
func allowUnsure(ctx context.Context, g *gorm.DB, vid int64, unsure map[int64]bool, accepted map[int64]int64) error {
	if len(unsure) == 0 {
		return nil
	}
	var rows []struct {
		ID     int64
		UserID int64
	}
	if err := g.WithContext(ctx).Raw("SELECT id, user_id FROM orders WHERE voucher_id = ?", vid).Scan(&rows).Error; err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	for _, r := range rows {
		if unsure[r.UserID] {
			if _, known := accepted[r.ID]; !known {
				accepted[r.ID] = r.UserID
			}
		}
	}
	return nil
}
