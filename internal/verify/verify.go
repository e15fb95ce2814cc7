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
// invariant that does not hold. It reads everything first, then checks
// each invariant on what it read. An error means the check could not run;
// the report then holds the counts read so far and no violations.
func Check(ctx context.Context, db *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, in Input) (Report, error) {
	s := sale{in: in}
	if err := s.readDatabase(ctx, db); err != nil {
		return s.r, err
	}
	if err := s.readRedis(ctx, rdb, keys); err != nil {
		return s.r, err
	}
	s.noOversell()        // I1
	s.oneOrderPerBuyer()  // I2
	s.acceptedWritten()   // I3
	s.nothingUnaccepted() // I4
	s.conserved()         // I5
	s.drained()           // I6
	s.endedOnce()         // I7
	slices.Sort(s.r.Violations)
	return s.r, nil
}

// row is an order or a dead letter: its order id and buyer.
type row struct {
	ID     int64
	UserID int64
}

// sale is what Check read of one voucher, and what it found.
type sale struct {
	in Input
	r  Report // the counts read, and the violations found
	// orders and dead are the voucher's orders and its dead letters not
	// replayed.
	orders, dead []row
	// buyerOfOrder maps each order id to its buyer; ordersOfUser counts
	// each buyer's orders.
	buyerOfOrder map[int64]int64
	ordersOfUser map[int64]int
	// redisBuyers is Redis's buyers hash: user id -> order id.
	redisBuyers map[string]string
	// noGroup: the stream has no group in.Group.
	noGroup bool
	// indexed counts the entries of the shard's pending-order index.
	indexed int64
}

// violation records an invariant that does not hold.
func (s *sale) violation(format string, args ...any) {
	s.r.Violations = append(s.r.Violations, fmt.Sprintf(format, args...))
}

// readDatabase reads the voucher's stock, orders and live dead letters.
func (s *sale) readDatabase(ctx context.Context, db *gorm.DB) error {
	var v struct {
		TotalStock int
		Stock      int
	}
	if err := db.WithContext(ctx).Raw("SELECT total_stock, stock FROM vouchers WHERE id = ?", s.in.VoucherID).Scan(&v).Error; err != nil {
		return fmt.Errorf("read voucher: %w", err)
	}
	s.r.TotalStock, s.r.DBStock = v.TotalStock, v.Stock
	if err := db.WithContext(ctx).Raw("SELECT id, user_id FROM orders WHERE voucher_id = ?", s.in.VoucherID).Scan(&s.orders).Error; err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	s.r.Orders = len(s.orders)
	if err := db.WithContext(ctx).Raw("SELECT order_id AS id, user_id FROM dead_letters WHERE voucher_id = ? AND replayed_at IS NULL", s.in.VoucherID).Scan(&s.dead).Error; err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	s.r.DeadLetters = len(s.dead)
	s.index()
	return nil
}

// index maps the orders by id and counts them by buyer.
func (s *sale) index() {
	s.buyerOfOrder = make(map[int64]int64, len(s.orders))
	s.ordersOfUser = map[int64]int{}
	for _, o := range s.orders {
		s.buyerOfOrder[o.ID] = o.UserID
		s.ordersOfUser[o.UserID]++
	}
}

// readRedis reads the voucher's stock and buyers in Redis, and what is
// left in its shard's stream, group, delay queue and pending-order index.
// The shard's keys: other vouchers of the shard must have drained too.
func (s *sale) readRedis(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys) error {
	n, err := rdb.HGet(ctx, keys.State(s.in.VoucherID), "stock").Int64()
	switch {
	case err == redis.Nil:
	case err != nil:
		return fmt.Errorf("read redis stock: %w", err)
	default:
		s.r.RedisState, s.r.RedisStock = true, n
	}
	if s.redisBuyers, err = rdb.HGetAll(ctx, keys.Buyers(s.in.VoucherID)).Result(); err != nil {
		return fmt.Errorf("read redis buyers: %w", err)
	}
	shard := keys.Shard(s.in.VoucherID)
	stream := keys.Stream(shard)
	if s.in.Group != "" {
		p, err := rdb.XPending(ctx, stream, s.in.Group).Result()
		switch {
		case mq.IsNoGroup(err):
			s.noGroup = true
		case err != nil:
			return fmt.Errorf("read pending: %w", err)
		default:
			s.r.Pending = p.Count
		}
	}
	if s.r.StreamLength, err = rdb.XLen(ctx, stream).Result(); err != nil {
		return fmt.Errorf("read stream length: %w", err)
	}
	if s.r.Delayed, err = rdb.ZCard(ctx, keys.Delayed(shard)).Result(); err != nil {
		return fmt.Errorf("read delay queue: %w", err)
	}
	if s.indexed, err = rdb.HLen(ctx, keys.Pending(shard)).Result(); err != nil {
		return fmt.Errorf("read pending-order index: %w", err)
	}
	return nil
}

// noOversell checks I1: no more orders than stock, and no stock, in the
// database or in Redis, below zero.
func (s *sale) noOversell() {
	if s.r.Orders > s.r.TotalStock {
		s.violation("I1: %d orders for a stock of %d", s.r.Orders, s.r.TotalStock)
	}
	if s.r.DBStock < 0 {
		s.violation("I1: database stock is %d", s.r.DBStock)
	}
	if s.r.RedisState && s.r.RedisStock < 0 {
		s.violation("I1: Redis stock is %d", s.r.RedisStock)
	}
}

// oneOrderPerBuyer checks I2: at most one order per buyer.
func (s *sale) oneOrderPerBuyer() {
	for u, n := range s.ordersOfUser {
		if n > 1 {
			s.violation("I2: user %d holds %d orders", u, n)
		}
	}
}

// acceptedWritten checks I3: every accepted order is in the database (as
// an order or, with a reason, a dead letter), for the buyer it was
// accepted for. Ten missing ones are named, then their number.
func (s *sale) acceptedWritten() {
	lettered := make(map[int64]bool, len(s.dead))
	for _, d := range s.dead {
		lettered[d.ID] = true
	}
	missing := 0
	for id, user := range s.in.Accepted {
		u, ok := s.buyerOfOrder[id]
		switch {
		case ok && u != user:
			s.violation("I3: order %d was accepted for user %d but written for user %d", id, user, u)
		case !ok && !lettered[id]:
			missing++
			if missing <= 10 {
				s.violation("I3: accepted order %d (user %d) is not in the database", id, user)
			}
		}
	}
	if missing > 10 {
		s.violation("I3: ... %d accepted orders missing in all", missing)
	}
}

// nothingUnaccepted checks I4: no order that was not accepted, unless its
// buyer's answer proved nothing (the first ten are named), and none for a
// refused buyer. Without a list of accepted orders, only the refused are
// checked.
func (s *sale) nothingUnaccepted() {
	if s.in.Accepted != nil {
		unsure := make(map[int64]bool, len(s.in.Unsure))
		for _, u := range s.in.Unsure {
			unsure[u] = true
		}
		extra := 0
		for _, o := range s.orders {
			if _, ok := s.in.Accepted[o.ID]; !ok && !unsure[o.UserID] {
				if extra++; extra <= 10 {
					s.violation("I4: order %d (user %d) was never accepted", o.ID, o.UserID)
				}
			}
		}
	}
	for _, u := range s.in.Refused {
		if s.ordersOfUser[u] > 0 {
			s.violation("I4: refused user %d holds an order", u)
		}
	}
}

// conserved checks I5: initial stock = database stock + orders; Redis's
// stock is the database's; Redis's buyers are the database's (a buyer
// entry without an order holds a unit no one can buy; an order without
// one lets its buyer buy again).
func (s *sale) conserved() {
	if s.r.TotalStock != s.r.DBStock+s.r.Orders {
		s.violation("I5: total stock %d != database stock %d + orders %d", s.r.TotalStock, s.r.DBStock, s.r.Orders)
	}
	switch {
	case !s.r.RedisState:
		s.violation("I5: no Redis state for the voucher")
	case s.r.RedisStock != int64(s.r.DBStock):
		s.violation("I5: Redis stock %d != database stock %d", s.r.RedisStock, s.r.DBStock)
	}
	wrong := 0
	for _, o := range s.orders {
		if got := s.redisBuyers[strconv.FormatInt(o.UserID, 10)]; got != strconv.FormatInt(o.ID, 10) {
			if wrong++; wrong <= 10 {
				s.violation("I5: Redis names order %q for user %d, the database %d", got, o.UserID, o.ID)
			}
		}
	}
	if len(s.redisBuyers) != len(s.orders) {
		s.violation("I5: Redis has %d buyers, the database %d orders", len(s.redisBuyers), len(s.orders))
	}
}

// drained checks I6: nothing pending in the group, nothing left in the
// stream (entries are deleted once acknowledged), nothing waiting in the
// delay queue, and nothing in the shard's pending-order index (what a
// rebuild counts as in flight) once every order is settled or given back.
func (s *sale) drained() {
	if s.in.Group != "" {
		if s.noGroup {
			s.violation("I6: no consumer group %s on the stream", s.in.Group)
		}
		if s.r.Pending != 0 {
			s.violation("I6: %d entries pending in group %s", s.r.Pending, s.in.Group)
		}
	}
	if s.r.StreamLength != 0 {
		s.violation("I6: %d entries left in the stream", s.r.StreamLength)
	}
	if s.r.Delayed != 0 {
		s.violation("I6: %d entries waiting in the delay queue", s.r.Delayed)
	}
	if s.indexed != 0 {
		s.violation("I6: %d orders left in the shard's pending-order index", s.indexed)
	}
}

// endedOnce checks I7: each accepted order ended exactly once, as an order
// or as a dead letter.
func (s *sale) endedOnce() {
	for _, d := range s.dead {
		if _, ok := s.buyerOfOrder[d.ID]; ok {
			s.violation("I7: order %d is both an order and a dead letter", d.ID)
		}
	}
}
