// Package verify checks the order pipeline's invariants (I1 to I7 of the
// reliability notes), the order lifecycle's (I8 to I10) and the order
// counters' agreement with the orders (I11) for one voucher,
// against the database and Redis directly. Pipeline tests and the load
// generator call it after the pipeline drained.
//
// An order is live while it holds a unit (awaiting_payment, paid, used)
// and ended once it gave the unit back (cancelled, refunded). Stock is
// conserved over live orders: total stock = stock + live orders. Ended
// orders stay written: an accepted order later cancelled still counts as
// written (I3), and its buyer may hold a live order beside it (I2).
package verify

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/mq"
	lifecycle "seckill/internal/order"
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

// The order states, in the order the report lists them.
const (
	AwaitingPayment = "awaiting_payment"
	Paid            = "paid"
	Used            = "used"
	Cancelled       = "cancelled"
	Refunded        = "refunded"
)

// States lists every order state: the first three are live.
var States = []string{AwaitingPayment, Paid, Used, Cancelled, Refunded}

// liveState reports whether an order in state holds a unit.
func liveState(state string) bool {
	return state == AwaitingPayment || state == Paid || state == Used
}

// Report is what the check found. Violations is empty when all holds.
type Report struct {
	TotalStock int
	DBStock    int
	RedisStock int64
	RedisState bool
	// Buckets is the voucher's bucket count; for more than one, Alloc
	// and Out sum their alloc and out fields, and BucketStocks holds each
	// bucket's stock (RedisStock is their sum).
	Buckets      int
	Alloc, Out   int64
	BucketStocks []int64
	// Orders counts the voucher's orders, whatever their state; Live
	// those holding a unit; ByState each state's (a state of no order is
	// absent).
	Orders  int
	Live    int
	ByState map[string]int
	// NeedsRefund counts the payments of the voucher's orders that
	// arrived after their order was cancelled and await a refund.
	NeedsRefund  int
	DeadLetters  int
	Pending      int64
	StreamLength int64
	Delayed      int64
	// ExpiryPending, ExpiryLength and ExpiryOverdue are the voucher's
	// shard's pay deadlines: entries held by the expirers, entries not
	// yet handled, and deadlines due but still in the delay queue.
	ExpiryPending, ExpiryLength, ExpiryOverdue int64
	Violations                                 []string
}

// OK reports whether no invariant is violated.
func (r Report) OK() bool { return len(r.Violations) == 0 }

func (r Report) String() string {
	s := fmt.Sprintf("total_stock=%d db_stock=%d redis_stock=%d orders=%d live=%d (%s) needs_refund=%d dead_letters=%d pending=%d stream_len=%d delayed=%d",
		r.TotalStock, r.DBStock, r.RedisStock, r.Orders, r.Live, r.states(), r.NeedsRefund, r.DeadLetters, r.Pending, r.StreamLength, r.Delayed)
	if r.OK() {
		return s + ": all invariants hold"
	}
	return s + "\nviolations:\n  " + strings.Join(r.Violations, "\n  ")
}

// states lists the orders by state, every known state named, then any
// unknown one.
func (r Report) states() string {
	parts := make([]string, 0, len(States))
	for _, st := range States {
		parts = append(parts, fmt.Sprintf("%s=%d", st, r.ByState[st]))
	}
	var odd []string
	for st, n := range r.ByState {
		if !slices.Contains(States, st) {
			odd = append(odd, fmt.Sprintf("%q=%d", st, n))
		}
	}
	slices.Sort(odd)
	return strings.Join(append(parts, odd...), " ")
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
	s.statesHold()        // I8
	s.unitsReturned()     // I9
	s.paymentsMatch()     // I10
	s.countsAgree()       // I11
	slices.Sort(s.r.Violations)
	return s.r, nil
}

// row is a dead letter: its order id and buyer.
type row struct {
	ID     int64
	UserID int64
}

// order is one of the voucher's orders: its id, buyer, state, and which
// of its times are set.
type order struct {
	ID     int64
	UserID int64
	Status string
	// Live is the live column: true when it is 1.
	Live bool
	// LiveSet is false when live is NULL; a live column that is neither 1
	// nor NULL is reported.
	LiveSet      bool
	CancelReason string
	Amount       int64
	PayDeadline  bool
	PaidAt       bool
	UsedAt       bool
	CancelledAt  bool
	RefundedAt   bool
	UnitBackAt   bool
}

// payment is a payment of one of the voucher's orders.
type payment struct {
	ID      int64
	OrderID int64
	Status  string
}

// sale is what Check read of one voucher, and what it found.
type sale struct {
	in Input
	r  Report // the counts read, and the violations found
	// orders are the voucher's orders; dead its dead letters not
	// replayed; payments the payments of its orders.
	orders   []order
	dead     []row
	payments []payment
	// buyerOfOrder maps each order id to its buyer; stateOfOrder to its
	// state; ordersOfUser counts each buyer's orders, liveOfUser each
	// buyer's live ones.
	buyerOfOrder map[int64]int64
	stateOfOrder map[int64]string
	ordersOfUser map[int64]int
	liveOfUser   map[int64]int
	// redisBuyers is Redis's buyers hash: user id -> order id.
	redisBuyers map[string]string
	// noGroup: the stream has no group in.Group.
	noGroup bool
	// indexed counts the entries of the shard's pending-order index.
	indexed int64
	// counted is what the order counters say of the voucher's orders.
	counted []counter
}

// counter is the order counters' count of the voucher's orders in one
// state (and cancel reason), slots summed.
type counter struct {
	Status, CancelReason string
	N, Amount            int64
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
		Buckets    int
	}
	if err := db.WithContext(ctx).Raw("SELECT total_stock, stock, buckets FROM vouchers WHERE id = ?", s.in.VoucherID).Scan(&v).Error; err != nil {
		return fmt.Errorf("read voucher: %w", err)
	}
	s.r.TotalStock, s.r.DBStock, s.r.Buckets = v.TotalStock, v.Stock, max(v.Buckets, 1)
	if err := db.WithContext(ctx).Raw(ordersQuery, s.in.VoucherID).Scan(&s.orders).Error; err != nil {
		return fmt.Errorf("read orders: %w", err)
	}
	if err := db.WithContext(ctx).Raw("SELECT order_id AS id, user_id FROM dead_letters WHERE voucher_id = ? AND replayed_at IS NULL", s.in.VoucherID).Scan(&s.dead).Error; err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	s.r.DeadLetters = len(s.dead)
	if err := db.WithContext(ctx).Raw(paymentsQuery, s.in.VoucherID).Scan(&s.payments).Error; err != nil {
		return fmt.Errorf("read payments: %w", err)
	}
	if err := db.WithContext(ctx).Raw(countersQuery, s.in.VoucherID).Scan(&s.counted).Error; err != nil {
		return fmt.Errorf("read order counters: %w", err)
	}
	s.index()
	return nil
}

// ordersQuery reads the voucher's orders, with which of their times are
// set.
const ordersQuery = `SELECT id, user_id, status,
  COALESCE(live = 1, FALSE) AS live, live IS NOT NULL AS live_set,
  COALESCE(cancel_reason, '') AS cancel_reason, amount,
  pay_deadline IS NOT NULL AS pay_deadline, paid_at IS NOT NULL AS paid_at,
  used_at IS NOT NULL AS used_at, cancelled_at IS NOT NULL AS cancelled_at,
  refunded_at IS NOT NULL AS refunded_at, unit_back_at IS NOT NULL AS unit_back_at
FROM orders WHERE voucher_id = ?`

// countersQuery reads the voucher's order counters, slots summed.
const countersQuery = `SELECT status, cancel_reason, SUM(n) AS n, SUM(amount) AS amount
FROM order_counts WHERE voucher_id = ? GROUP BY status, cancel_reason`

// paymentsQuery reads the payments of the voucher's orders.
const paymentsQuery = `SELECT p.id, p.order_id, p.status FROM payments p
JOIN orders o ON o.id = p.order_id WHERE o.voucher_id = ?`

// index maps the orders by id, counts them by buyer and by state, and
// counts the payments needing a refund.
func (s *sale) index() {
	s.buyerOfOrder = make(map[int64]int64, len(s.orders))
	s.stateOfOrder = make(map[int64]string, len(s.orders))
	s.ordersOfUser = map[int64]int{}
	s.liveOfUser = map[int64]int{}
	s.r.Orders, s.r.Live, s.r.ByState, s.r.NeedsRefund = len(s.orders), 0, map[string]int{}, 0
	for _, o := range s.orders {
		s.buyerOfOrder[o.ID] = o.UserID
		s.stateOfOrder[o.ID] = o.Status
		s.ordersOfUser[o.UserID]++
		s.r.ByState[o.Status]++
		if o.Live {
			s.liveOfUser[o.UserID]++
			s.r.Live++
		}
	}
	for _, p := range s.payments {
		if p.Status == "needs_refund" {
			s.r.NeedsRefund++
		}
	}
}

// named reports the first ten violations of one kind by name, then how
// many there were in all.
type named struct {
	s *sale
	n int
}

// add reports one violation, if fewer than ten were named.
func (c *named) add(format string, args ...any) {
	if c.n++; c.n <= 10 {
		c.s.violation(format, args...)
	}
}

// total reports how many there were in all, when some went unnamed;
// format takes the number.
func (c *named) total(format string) {
	if c.n > 10 {
		c.s.violation(format, c.n)
	}
}

// readRedis reads the voucher's stock and buyers in Redis, over every
// bucket, and what is left in its buckets' shards' streams, groups, delay
// queues and pending-order indexes. The shards' keys: other vouchers of
// the shards must have drained too.
func (s *sale) readRedis(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys) error {
	nb := s.r.Buckets
	s.redisBuyers = map[string]string{}
	s.r.RedisState = true
	for b := range nb {
		shard := keys.BucketShard(s.in.VoucherID, b, nb)
		if err := s.readBucket(ctx, rdb, keys, b, shard); err != nil {
			return err
		}
		if err := s.readShard(ctx, rdb, keys, shard); err != nil {
			return err
		}
	}
	for b := range nb {
		if err := s.readExpiries(ctx, rdb, keys, keys.BucketShard(s.in.VoucherID, b, nb)); err != nil {
			return err
		}
	}
	return nil
}

// readBucket reads one bucket's stock, alloc, out and buyers. A buyer in
// a bucket other than its home is a violation of I2's premise: reported.
func (s *sale) readBucket(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys, b, shard int) error {
	f, err := rdb.HMGet(ctx, keys.StateAt(shard, s.in.VoucherID), "stock", voucher.FieldAlloc, voucher.FieldOut).Result()
	if err != nil {
		return fmt.Errorf("read redis stock of bucket %d: %w", b, err)
	}
	stock, ok := f[0].(string)
	n, err := strconv.ParseInt(stock, 10, 64)
	if !ok || err != nil {
		s.r.RedisState = false
	}
	s.r.RedisStock += n
	s.r.BucketStocks = append(s.r.BucketStocks, n)
	if s.r.Buckets > 1 {
		alloc, _ := f[1].(string)
		out, _ := f[2].(string)
		a, err1 := strconv.ParseInt(alloc, 10, 64)
		o, err2 := strconv.ParseInt(out, 10, 64)
		if err1 != nil || err2 != nil {
			s.violation("I5: bucket %d has no alloc or out (%q, %q)", b, alloc, out)
		}
		s.r.Alloc += a
		s.r.Out += o
	}
	buyers, err := rdb.HGetAll(ctx, keys.BuyersAt(shard, s.in.VoucherID)).Result()
	if err != nil {
		return fmt.Errorf("read redis buyers of bucket %d: %w", b, err)
	}
	for u, o := range buyers {
		if id, err := strconv.ParseInt(u, 10, 64); err == nil && voucher.Home(id, s.r.Buckets) != b {
			s.violation("I2: user %d is a buyer of bucket %d, not of its home bucket", id, b)
		}
		s.redisBuyers[u] = o
	}
	return nil
}

// readShard adds what is left in a shard's stream, group, delay queue and
// pending-order index.
func (s *sale) readShard(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys, shard int) error {
	stream := keys.Stream(shard)
	if s.in.Group != "" {
		p, err := rdb.XPending(ctx, stream, s.in.Group).Result()
		switch {
		case mq.IsNoGroup(err):
			s.noGroup = true
		case err != nil:
			return fmt.Errorf("read pending: %w", err)
		default:
			s.r.Pending += p.Count
		}
	}
	n, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		return fmt.Errorf("read stream length: %w", err)
	}
	s.r.StreamLength += n
	if n, err = rdb.ZCard(ctx, keys.Delayed(shard)).Result(); err != nil {
		return fmt.Errorf("read delay queue: %w", err)
	}
	s.r.Delayed += n
	if n, err = rdb.HLen(ctx, keys.Pending(shard)).Result(); err != nil {
		return fmt.Errorf("read pending-order index: %w", err)
	}
	s.indexed += n
	return nil
}

// readExpiries adds the shard's pay deadlines (those of the orders of one
// bucket): what the expirers hold, what waits on their stream, and what is
// due in the delay queue. A
// stream or group not there yet (no priced order so far) holds nothing.
func (s *sale) readExpiries(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys, shard int) error {
	stream, queue := lifecycle.ExpiryKeys(keys, shard)
	p, err := rdb.XPending(ctx, stream, lifecycle.ExpiryGroup).Result()
	switch {
	case mq.IsNoGroup(err):
	case err != nil:
		return fmt.Errorf("read expiries pending: %w", err)
	default:
		s.r.ExpiryPending += p.Count
	}
	n, err := rdb.XLen(ctx, stream).Result()
	if err != nil {
		return fmt.Errorf("read expiry stream length: %w", err)
	}
	s.r.ExpiryLength += n
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("read redis time: %w", err)
	}
	if n, err = rdb.ZCount(ctx, queue, "-inf", strconv.FormatInt(now.UnixMilli(), 10)).Result(); err != nil {
		return fmt.Errorf("read expiry queue: %w", err)
	}
	s.r.ExpiryOverdue += n
	return nil
}

// noOversell checks I1: no more live orders than stock, and no stock, in
// the database or in Redis, below zero.
func (s *sale) noOversell() {
	if s.r.Live > s.r.TotalStock {
		s.violation("I1: %d live orders for a stock of %d", s.r.Live, s.r.TotalStock)
	}
	if s.r.DBStock < 0 {
		s.violation("I1: database stock is %d", s.r.DBStock)
	}
	if s.r.RedisState && s.r.RedisStock < 0 {
		s.violation("I1: Redis stock is %d", s.r.RedisStock)
	}
	for b, n := range s.r.BucketStocks {
		if n < 0 && s.r.Buckets > 1 {
			s.violation("I1: Redis stock of bucket %d is %d", b, n)
		}
	}
}

// oneOrderPerBuyer checks I2: at most one live order per buyer; ended
// ones beside it are allowed (a buyer may buy again after a cancellation).
func (s *sale) oneOrderPerBuyer() {
	for u, n := range s.liveOfUser {
		if n > 1 {
			s.violation("I2: user %d holds %d live orders", u, n)
		}
	}
}

// acceptedWritten checks I3: every accepted order is in the database (as
// an order in any state, cancelled too, or, with a reason, a dead letter),
// for the buyer it was accepted for. Ten missing ones are named, then their number.
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

// nothingUnaccepted checks I4: no order, in any state, that was not
// accepted, unless its buyer's answer proved nothing (the first ten are
// named), and none, not even an ended one, for a refused buyer. Without a list of accepted orders, only the refused are
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

// conserved checks I5: initial stock = database stock + live orders;
// Redis's stock is initial stock - live orders (the database's, when that
// holds); Redis's buyers are exactly the live orders' buyers, each naming
// its live order (a buyer entry without a live order holds a unit no one
// can buy; a live order without one lets its buyer buy again).
func (s *sale) conserved() {
	if s.r.TotalStock != s.r.DBStock+s.r.Live {
		s.violation("I5: total stock %d != database stock %d + live orders %d", s.r.TotalStock, s.r.DBStock, s.r.Live)
	}
	switch {
	case !s.r.RedisState:
		s.violation("I5: no Redis state for the voucher")
	case s.r.RedisStock != int64(s.r.TotalStock-s.r.Live):
		s.violation("I5: Redis stock %d != total stock %d - live orders %d", s.r.RedisStock, s.r.TotalStock, s.r.Live)
	}
	if s.r.Buckets > 1 && s.r.Alloc+s.r.Out != int64(s.r.TotalStock) {
		s.violation("I5: buckets' alloc %d + units in transit %d != total stock %d", s.r.Alloc, s.r.Out, s.r.TotalStock)
	}
	wrong := 0
	for _, o := range s.orders {
		if !o.Live {
			continue
		}
		if got := s.redisBuyers[strconv.FormatInt(o.UserID, 10)]; got != strconv.FormatInt(o.ID, 10) {
			if wrong++; wrong <= 10 {
				s.violation("I5: Redis names order %q for user %d, the database live order %d", got, o.UserID, o.ID)
			}
		}
	}
	if len(s.redisBuyers) != s.r.Live {
		s.violation("I5: Redis has %d buyers, the database %d live orders", len(s.redisBuyers), s.r.Live)
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
	if s.r.Out != 0 {
		s.violation("I6: %d units still in a transfer between buckets", s.r.Out)
	}
	if s.r.ExpiryPending+s.r.ExpiryLength+s.r.ExpiryOverdue != 0 {
		s.violation("I6: pay deadlines not drained: %d held by the expirers, %d on their stream, %d due in the delay queue",
			s.r.ExpiryPending, s.r.ExpiryLength, s.r.ExpiryOverdue)
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

// statesHold checks I8: every order is in a known state, live exactly
// while its state holds a unit, with the times its state implies and none
// it does not: paid => paid_at; used => paid_at and used_at; cancelled =>
// cancelled_at and a cancel reason (buyer or expired), never paid_at or
// used_at (no order is both paid and cancelled); refunded => paid_at and
// refunded_at; awaiting payment => a pay deadline. A live order never got
// its unit back.
func (s *sale) statesHold() {
	c := named{s: s}
	for _, o := range s.orders {
		for _, v := range o.stateViolations() {
			c.add("I8: %s", v)
		}
	}
	c.total("I8: ... %d state violations in all")
}

// stateViolations says what is wrong with the order's state, by I8's rules.
func (o order) stateViolations() []string {
	if _, known := stateTimes[o.Status]; !known {
		return []string{fmt.Sprintf("order %d (user %d) is in unknown state %q", o.ID, o.UserID, o.Status)}
	}
	var out []string
	for _, rule := range stateRules {
		for _, what := range rule(o) {
			out = append(out, fmt.Sprintf("%s order %d (user %d) %s", o.Status, o.ID, o.UserID, what))
		}
	}
	return out
}

// stateRules are I8's checks of an order in a known state, in the order
// their findings are reported; each says what is wrong, after "<state>
// order <id> (user <id>)".
var stateRules = []func(o order) []string{
	liveAsItsState,
	timesAsItsState,
	cancelReasonKnown,
	deadlineWhileAwaiting,
	unitHeldWhileLive,
}

// liveAsItsState: an order is live exactly while its state holds a unit.
func liveAsItsState(o order) []string {
	switch live := liveState(o.Status); {
	case live && !o.Live:
		return []string{"is not live"}
	case !live && o.LiveSet:
		return []string{"is still live"}
	}
	return nil
}

// timesAsItsState: an order has the times its state implies
// (stateTimes), and no other.
func timesAsItsState(o order) []string {
	want := stateTimes[o.Status]
	var out []string
	for _, t := range o.times() {
		switch {
		case t.set && !slices.Contains(want, t.name):
			out = append(out, "has "+t.name)
		case !t.set && slices.Contains(want, t.name):
			out = append(out, "has no "+t.name)
		}
	}
	return out
}

// cancelReasons are the reasons an order is cancelled for ("" is
// timesAsItsState's to judge).
var cancelReasons = []string{"", "buyer", "expired"}

// cancelReasonKnown: a cancelled order names a known reason.
func cancelReasonKnown(o order) []string {
	if o.Status == Cancelled && !slices.Contains(cancelReasons, o.CancelReason) {
		return []string{fmt.Sprintf("has cancel_reason %q", o.CancelReason)}
	}
	return nil
}

// deadlineWhileAwaiting: an order awaiting payment has a pay deadline.
func deadlineWhileAwaiting(o order) []string {
	if o.Status == AwaitingPayment && !o.PayDeadline {
		return []string{"has no pay_deadline"}
	}
	return nil
}

// unitHeldWhileLive: a live order never got its unit back.
func unitHeldWhileLive(o order) []string {
	if liveState(o.Status) && o.UnitBackAt {
		return []string{"has unit_back_at"}
	}
	return nil
}

// stateTimes names, for each state, the times its orders have; the others
// must be unset.
var stateTimes = map[string][]string{
	AwaitingPayment: nil,
	Paid:            {"paid_at"},
	Used:            {"paid_at", "used_at"},
	Cancelled:       {"cancelled_at", "cancel_reason"},
	Refunded:        {"paid_at", "refunded_at"},
}

// stamp is one of an order's times and whether it is set.
type stamp struct {
	name string
	set  bool
}

// times lists the order's state times (the cancel reason with them).
func (o order) times() []stamp {
	return []stamp{
		{"paid_at", o.PaidAt}, {"used_at", o.UsedAt}, {"cancelled_at", o.CancelledAt},
		{"cancel_reason", o.CancelReason != ""}, {"refunded_at", o.RefundedAt},
	}
}

// unitsReturned checks I9: every ended order gave its unit back to Redis
// (unit_back_at set) and no longer holds its buyer entry there. That it
// gave back exactly one is I5's: the database's conservation counts the
// MySQL side, Redis's stock = initial - live the Redis side.
func (s *sale) unitsReturned() {
	c := named{s: s}
	holder := make(map[string]string, len(s.redisBuyers))
	for u, id := range s.redisBuyers {
		holder[id] = u
	}
	for _, o := range s.orders {
		if _, known := stateTimes[o.Status]; !known || liveState(o.Status) {
			continue // live, or unknown (I8's)
		}
		if !o.UnitBackAt {
			c.add("I9: %s order %d (user %d) did not give its unit back to Redis (no unit_back_at)", o.Status, o.ID, o.UserID)
		}
		if u, ok := holder[strconv.FormatInt(o.ID, 10)]; ok {
			c.add("I9: %s order %d (user %d) still holds Redis's buyer entry of user %s", o.Status, o.ID, o.UserID, u)
		}
	}
	c.total("I9: ... %d ended orders with their unit not back in all")
}

// paymentsMatch checks I10: a succeeded payment belongs to a paid or used
// order, and an order has at most one: a payment of a cancelled order never
// stays succeeded (money that arrived after the cancellation is
// needs_refund, then refunded), a refund moves its order's payment to
// needs_refund in the same transaction, and a second payment of a paid
// order is needs_refund too. So a payment needing a refund, or refunded, belongs to
// an order that could not take it: one that ended, or one another payment
// paid; never to an order still awaiting payment. A payment created and
// never made stays created.
func (s *sale) paymentsMatch() {
	c := named{s: s}
	succeeded := map[int64]int64{}
	for _, p := range s.payments {
		state := s.stateOfOrder[p.OrderID]
		switch {
		case p.Status == "succeeded" && state != Paid && state != Used:
			c.add("I10: payment %d succeeded but its order %d is %s", p.ID, p.OrderID, state)
		case p.Status == "succeeded" && succeeded[p.OrderID] != 0:
			c.add("I10: payments %d and %d both paid order %d", succeeded[p.OrderID], p.ID, p.OrderID)
		case (p.Status == "needs_refund" || p.Status == "refunded") && (state == AwaitingPayment || state == ""):
			c.add("I10: payment %d is %s but its order %d is %s", p.ID, p.Status, p.OrderID, cmp.Or(state, "not written"))
		}
		if p.Status == "succeeded" && succeeded[p.OrderID] == 0 {
			succeeded[p.OrderID] = p.ID
		}
	}
	c.total("I10: ... %d payments at odds with their order in all")
}

// countsAgree checks I11: the order counters (kept by every transaction
// that writes or moves an order) say how many of the voucher's orders are
// in each state, with each cancel reason, and what they amount to, as
// counting the orders does.
func (s *sale) countsAgree() {
	type key struct{ status, reason string }
	type tally struct{ n, amount int64 }
	counted := map[key]tally{}
	for _, o := range s.orders {
		t := counted[key{o.Status, o.CancelReason}]
		counted[key{o.Status, o.CancelReason}] = tally{t.n + 1, t.amount + o.Amount}
	}
	kept := map[key]tally{}
	for _, c := range s.counted {
		if c.N != 0 || c.Amount != 0 {
			kept[key{c.Status, c.CancelReason}] = tally{c.N, c.Amount}
		}
	}
	keys := slices.Collect(maps.Keys(counted))
	for k := range kept {
		if _, ok := counted[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(strings.Compare(a.status, b.status), strings.Compare(a.reason, b.reason))
	})
	for _, k := range keys {
		name := k.status
		if k.reason != "" {
			name += " (" + k.reason + ")"
		}
		if got, want := kept[k], counted[k]; got != want {
			s.violation("I11: the counters hold %d %s orders amounting to %d, the orders are %d amounting to %d",
				got.n, name, got.amount, want.n, want.amount)
		}
	}
}
