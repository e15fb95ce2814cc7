// Package verify checks the order pipeline's invariants (I1 to I7 of the
// reliability notes) for one voucher, against the database and Redis
// directly. Pipeline tests and the load generator call it after the
// pipeline drained.
package verify

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// Input is what the caller observed: the order ids the API accepted (202)
// and the buyers it accepted them for.
type Input struct {
	VoucherID int64
	// Accepted maps each accepted order id to the buyer it was accepted for.
	Accepted map[int64]int64
	// Refused lists buyers who only ever got definite refusals (sold out,
	// 4xx): none of them may hold an order.
	Refused []int64
	// Unsure lists buyers who got an answer that proves nothing (a 5xx, a
	// dropped connection): they may hold an order nobody saw accepted.
	Unsure []int64
	// Group is the stream consumer group whose pending list must be empty.
	Group string
}

// Report is what the check found. Violations is empty when all holds.
type Report struct {
	TotalStock   int
	DBStock      int
	RedisStock   int64
	RedisState   bool
	Orders       int
	DeadLetters  int
	Pending      int64
	StreamLength int64
	Delayed      int64
	Violations   []string
}

// OK reports whether no invariant is violated.
func (r Report) OK() bool { return len(r.Violations) == 0 }

func (r Report) String() string {
	s := fmt.Sprintf("total_stock=%d db_stock=%d redis_stock=%d orders=%d dead_letters=%d pending=%d stream_len=%d delayed=%d",
		r.TotalStock, r.DBStock, r.RedisStock, r.Orders, r.DeadLetters, r.Pending, r.StreamLength, r.Delayed)
	if r.OK() {
		return s + ": all invariants hold"
	}
	return s + "\nviolations:\n  " + strings.Join(r.Violations, "\n  ")
}

// Check reads the voucher's rows and Redis state and reports every
// invariant that does not hold. An error means the check could not run.
func Check(ctx context.Context, db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, in Input) (Report, error) {
	var r Report
	bad := func(format string, args ...any) { r.Violations = append(r.Violations, fmt.Sprintf(format, args...)) }

	var v struct {
		TotalStock int
		Stock      int
	}
	if err := db.WithContext(ctx).Raw("SELECT total_stock, stock FROM vouchers WHERE id = ?", in.VoucherID).Scan(&v).Error; err != nil {
		return r, fmt.Errorf("read voucher: %w", err)
	}
	r.TotalStock, r.DBStock = v.TotalStock, v.Stock

	type row struct {
		ID     int64
		UserID int64
	}
	var orders []row
	if err := db.WithContext(ctx).Raw("SELECT id, user_id FROM orders WHERE voucher_id = ?", in.VoucherID).Scan(&orders).Error; err != nil {
		return r, fmt.Errorf("read orders: %w", err)
	}
	r.Orders = len(orders)
	var dead []row
	if err := db.WithContext(ctx).Raw("SELECT order_id AS id, user_id FROM dead_letters WHERE voucher_id = ? AND replayed_at IS NULL", in.VoucherID).Scan(&dead).Error; err != nil {
		return r, fmt.Errorf("read dead letters: %w", err)
	}
	r.DeadLetters = len(dead)

	// I1: no oversell, stock never negative.
	if r.Orders > r.TotalStock {
		bad("I1: %d orders for a stock of %d", r.Orders, r.TotalStock)
	}
	if r.DBStock < 0 {
		bad("I1: database stock is %d", r.DBStock)
	}
	// I2: at most one order per buyer.
	byUser := map[int64]int{}
	for _, o := range orders {
		byUser[o.UserID]++
	}
	for u, n := range byUser {
		if n > 1 {
			bad("I2: user %d holds %d orders", u, n)
		}
	}
	// I3: every accepted order is in the database (as an order or, with a
	// reason, a dead letter), for the buyer it was accepted for.
	written := make(map[int64]int64, len(orders))
	for _, o := range orders {
		written[o.ID] = o.UserID
	}
	deadIDs := make(map[int64]bool, len(dead))
	for _, d := range dead {
		deadIDs[d.ID] = true
	}
	missing := 0
	for id, user := range in.Accepted {
		u, ok := written[id]
		switch {
		case ok && u != user:
			bad("I3: order %d was accepted for user %d but written for user %d", id, user, u)
		case !ok && !deadIDs[id]:
			missing++
			if missing <= 10 {
				bad("I3: accepted order %d (user %d) is not in the database", id, user)
			}
		}
	}
	if missing > 10 {
		bad("I3: ... %d accepted orders missing in all", missing)
	}
	// I4: no order that was not accepted, none for a refused buyer.
	if in.Accepted != nil {
		unsure := make(map[int64]bool, len(in.Unsure))
		for _, u := range in.Unsure {
			unsure[u] = true
		}
		extra := 0
		for _, o := range orders {
			if _, ok := in.Accepted[o.ID]; !ok && !unsure[o.UserID] {
				extra++
				if extra <= 10 {
					bad("I4: order %d (user %d) was never accepted", o.ID, o.UserID)
				}
			}
		}
	}
	for _, u := range in.Refused {
		if byUser[u] > 0 {
			bad("I4: refused user %d holds an order", u)
		}
	}
	// I5: conservation in the database, and Redis agrees.
	if r.TotalStock != r.DBStock+r.Orders {
		bad("I5: total stock %d != database stock %d + orders %d", r.TotalStock, r.DBStock, r.Orders)
	}
	n, err := rdb.HGet(ctx, keys.State(in.VoucherID), "stock").Int64()
	switch {
	case err == redis.Nil:
		bad("I5: no Redis state for the voucher")
	case err != nil:
		return r, fmt.Errorf("read redis stock: %w", err)
	default:
		r.RedisState, r.RedisStock = true, n
		if n < 0 {
			bad("I1: Redis stock is %d", n)
		}
		if n != int64(r.DBStock) {
			bad("I5: Redis stock %d != database stock %d", n, r.DBStock)
		}
	}
	// I5: Redis's buyers are the database's (a buyer entry without an
	// order holds a unit no one can buy; an order without one lets its
	// buyer buy again).
	buyers, err := rdb.HGetAll(ctx, keys.Buyers(in.VoucherID)).Result()
	if err != nil {
		return r, fmt.Errorf("read redis buyers: %w", err)
	}
	wrong := 0
	for _, o := range orders {
		if got := buyers[strconv.FormatInt(o.UserID, 10)]; got != strconv.FormatInt(o.ID, 10) {
			if wrong++; wrong <= 10 {
				bad("I5: Redis names order %q for user %d, the database %d", got, o.UserID, o.ID)
			}
		}
	}
	if len(buyers) != len(orders) {
		bad("I5: Redis has %d buyers, the database %d orders", len(buyers), len(orders))
	}
	// I6: the pipeline drained: nothing pending in the group, nothing left
	// in the stream (entries are deleted once acknowledged), nothing
	// waiting in the delay queue. The shard's keys: other vouchers of the
	// shard must have drained too.
	shard := keys.Shard(in.VoucherID)
	stream := keys.Stream(shard)
	if in.Group != "" {
		p, err := rdb.XPending(ctx, stream, in.Group).Result()
		switch {
		case mq.IsNoGroup(err):
			bad("I6: no consumer group %s on the stream", in.Group)
		case err != nil:
			return r, fmt.Errorf("read pending: %w", err)
		default:
			r.Pending = p.Count
		}
		if r.Pending != 0 {
			bad("I6: %d entries pending in group %s", r.Pending, in.Group)
		}
	}
	if r.StreamLength, err = rdb.XLen(ctx, stream).Result(); err != nil {
		return r, fmt.Errorf("read stream length: %w", err)
	}
	if r.StreamLength != 0 {
		bad("I6: %d entries left in the stream", r.StreamLength)
	}
	if r.Delayed, err = rdb.ZCard(ctx, keys.Delayed(shard)).Result(); err != nil {
		return r, fmt.Errorf("read delay queue: %w", err)
	}
	if r.Delayed != 0 {
		bad("I6: %d entries waiting in the delay queue", r.Delayed)
	}
	// The shard's pending-order index (what a rebuild counts as in flight)
	// holds nothing once every order is settled or given back.
	if n, err := rdb.HLen(ctx, keys.Pending(shard)).Result(); err != nil {
		return r, fmt.Errorf("read pending-order index: %w", err)
	} else if n != 0 {
		bad("I6: %d orders left in the shard's pending-order index", n)
	}
	// I7: each accepted order ended exactly once: an order or a dead letter.
	for _, d := range dead {
		if _, ok := written[d.ID]; ok {
			bad("I7: order %d is both an order and a dead letter", d.ID)
		}
	}
	slices.Sort(r.Violations)
	return r, nil
}
