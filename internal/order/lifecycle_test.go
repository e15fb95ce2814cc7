package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// lifeWindow is the pay window of the lifecycle tests: long enough that
// no deadline passes on its own, so a deadline passes only when a test
// moves its clock past it.
const lifeWindow = time.Hour

// lifeDBs are the databases the service runs on.
var lifeDBs = []string{"mariadb", "sqlite"}

// testClock is the lifecycle's clock: the wall clock, moved ahead by what
// the test says.
type testClock struct{ ahead atomic.Int64 }

func (c *testClock) now() time.Time { return time.Now().Add(time.Duration(c.ahead.Load())) }

// pass moves the clock ahead by d.
func (c *testClock) pass(d time.Duration) { c.ahead.Add(int64(d)) }

// moveCounter counts the moves a lifecycle reports as made now, and the
// failed Redis and MySQL calls it reports.
type moveCounter struct {
	nopLifecycleObserver
	mu        sync.Mutex
	moves     map[string]int
	redisErrs map[string]int
	mysqlErrs int
}

func (m *moveCounter) MySQLError(string) { m.mu.Lock(); m.mysqlErrs++; m.mu.Unlock() }

func (m *moveCounter) mysqlErrors() int { m.mu.Lock(); defer m.mu.Unlock(); return m.mysqlErrs }

func (m *moveCounter) Moved(move string) { m.mu.Lock(); m.moves[move]++; m.mu.Unlock() }

func (m *moveCounter) count(move string) int { m.mu.Lock(); defer m.mu.Unlock(); return m.moves[move] }

func (m *moveCounter) RedisError(op string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.redisErrs == nil {
		m.redisErrs = map[string]int{}
	}
	m.redisErrs[op]++
}

func (m *moveCounter) redisErrors(op string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.redisErrs[op]
}

// lifeEnv is one database (MariaDB or SQLite) and Redis with a voucher on
// sale in a ready shard, the writer that turns purchases into orders (and
// schedules their deadlines), and the lifecycle on a clock the test moves.
type lifeEnv struct {
	db    *gorm.DB
	rdb   *redis.Client
	keys  voucher.Keys
	clock *testClock
	moves *moveCounter
	life  *Lifecycle
	exp   *Expiries
	w     *Writer
	v     voucher.Voucher
	next  *atomic.Int64
}

// eachLifeDB runs f on a fresh env of each database, in parallel; the
// voucher has this price and stock.
func eachLifeDB(t *testing.T, price int64, stock int, f func(t *testing.T, e lifeEnv)) {
	t.Helper()
	for _, name := range lifeDBs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newLifeEnv(t, name, price, stock))
		})
	}
}

func newLifeEnv(t *testing.T, dialect string, price int64, stock int) lifeEnv {
	t.Helper()
	return newLifeEnvOf(t, dialect, price, stock, 1)
}

// newLifeEnvOf is newLifeEnv with this many shards, all ready.
func newLifeEnvOf(t *testing.T, dialect string, price int64, stock, shards int) lifeEnv {
	t.Helper()
	g := testenv.DB(t, dialect)
	ctx := context.Background()
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), shards)
	e := lifeEnv{db: g, rdb: rdb, keys: keys, clock: &testClock{}, moves: &moveCounter{moves: map[string]int{}}, next: new(atomic.Int64)}
	e.next.Store(10_000)
	e.life = e.lifecycle()
	e.exp = NewExpiries(rdb, keys)
	e.w = NewWriter(g, rdb, keys, WriterConfig{PayWindow: lifeWindow, Expiries: e.exp}, quietLog)
	e.v = e.newVoucher(t, price, stock)
	// The shards are ready, as after the service's warm-up.
	for shard := range shards {
		if err := voucher.NewState(rdb, keys).MarkReady(ctx, shard); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// lifecycle is another instance's lifecycle on the env's clock, counting
// its moves with the env's.
func (e lifeEnv) lifecycle() *Lifecycle {
	return NewLifecycle(e.db, e.rdb, e.keys, LifecycleConfig{Observer: e.moves, Now: e.clock.now}, quietLog)
}

// lifecycleAhead is a lifecycle whose clock runs d ahead of the wall clock.
func (e lifeEnv) lifecycleAhead(d time.Duration) *Lifecycle {
	return NewLifecycle(e.db, e.rdb, e.keys, LifecycleConfig{Observer: e.moves, Now: func() time.Time { return time.Now().Add(d) }}, quietLog)
}

// newVoucher puts a voucher on sale in the database and in Redis.
func (e lifeEnv) newVoucher(t *testing.T, price int64, stock int) voucher.Voucher {
	t.Helper()
	ctx := context.Background()
	v := voucher.Voucher{Title: "t", FaceValue: 5000, Price: price, TotalStock: stock, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(24 * time.Hour)}
	if err := voucher.NewStore(e.db).Create(ctx, &v); err != nil {
		t.Fatal(err)
	}
	if _, err := voucher.NewState(e.rdb, e.keys).Load(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	return v
}

// purchase is an accepted purchase: its order id, buyer and stream message.
type purchase struct {
	order, user, voucher int64
	m                    mq.Message
}

// reserve makes a new buyer's purchase of voucher v in Redis, as the API
// does; it is not written yet.
func (e lifeEnv) reserve(t *testing.T, v int64) purchase {
	t.Helper()
	id := e.next.Add(1)
	return e.reserveFor(t, v, id, id)
}

// reserveFor makes this buyer's purchase with this order id.
func (e lifeEnv) reserveFor(t *testing.T, v, user, id int64) purchase {
	t.Helper()
	if _, err := voucher.NewReserver(e.rdb, e.keys).Reserve(context.Background(), v, user, id); err != nil {
		t.Fatalf("buyer %d buys voucher %d: %v", user, v, err)
	}
	m := voucher.Message{OrderID: id, UserID: user, VoucherID: v, AcceptedAt: time.Now()}
	return purchase{order: id, user: user, voucher: v, m: mq.Message{Stream: "s", ID: "1-" + strconv.FormatInt(id, 10), Values: m.Encode()}}
}

// write hands the purchases' messages to the writer, each acked.
func (e lifeEnv) write(t *testing.T, ps ...purchase) {
	t.Helper()
	batch := make([]mq.Message, len(ps))
	for i, p := range ps {
		batch[i] = p.m
	}
	for i, o := range handle(t, e.w, batch) {
		if o != mq.Ack {
			t.Fatalf("order %d: outcome %v, want Ack", ps[i].order, o)
		}
	}
}

// buy is a new buyer's purchase of the env's voucher, written.
func (e lifeEnv) buy(t *testing.T) purchase {
	t.Helper()
	p := e.reserve(t, e.v.ID)
	e.write(t, p)
	return p
}

func (e lifeEnv) order(t *testing.T, id int64) Order {
	t.Helper()
	var o Order
	if err := e.db.Where("id = ?", id).Take(&o).Error; err != nil {
		t.Fatalf("order %d: %v", id, err)
	}
	return o
}

// sale is what the database and Redis say of a voucher and one buyer.
type sale struct {
	stock      int64  // the database's
	redisStock int64  // Redis's
	entry      string // the buyer's entry in Redis ("" when none)
}

func (e lifeEnv) sale(t *testing.T, v, user int64) sale {
	t.Helper()
	ctx := context.Background()
	var s sale
	if err := e.db.Raw("SELECT stock FROM vouchers WHERE id = ?", v).Scan(&s.stock).Error; err != nil {
		t.Fatal(err)
	}
	n, err := e.rdb.HGet(ctx, e.keys.State(v), "stock").Int64()
	if err != nil {
		t.Fatal(err)
	}
	s.redisStock = n
	entry, err := e.rdb.HGet(ctx, e.keys.Buyers(v), strconv.FormatInt(user, 10)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	s.entry = entry
	return s
}

// up is the sale after a unit of the buyer's order came back.
func (s sale) up() sale { return sale{stock: s.stock + 1, redisStock: s.redisStock + 1} }

// unready and ready drop and restore the shard's ready marker: while it is
// gone the release script gives nothing back (the shard is being rebuilt).
func (e lifeEnv) unready(t *testing.T) {
	t.Helper()
	if err := e.rdb.Del(context.Background(), e.keys.Ready(0)).Err(); err != nil {
		t.Fatal(err)
	}
}

func (e lifeEnv) ready(t *testing.T) {
	t.Helper()
	if err := voucher.NewState(e.rdb, e.keys).MarkReady(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
}

// describe spells every column of an order, times in milliseconds, to
// tell whether a row changed.
func describe(o Order) string {
	ms := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return strconv.FormatInt(t.UnixMilli(), 10)
	}
	str := func(s *string) string {
		if s == nil {
			return "-"
		}
		return *s
	}
	live := "-"
	if o.Live != nil {
		live = strconv.Itoa(*o.Live)
	}
	return fmt.Sprintf("id=%d user=%d voucher=%d status=%s live=%s amount=%d deadline=%s paid=%s used=%s cancelled=%s reason=%s refunded=%s back=%s",
		o.ID, o.UserID, o.VoucherID, o.Status, live, o.Amount, ms(o.PayDeadline), ms(o.PaidAt), ms(o.UsedAt),
		ms(o.CancelledAt), str(o.CancelReason), ms(o.RefundedAt), ms(o.UnitBackAt))
}

// within reports whether a recorded time lies between from and to, give
// or take the database's millisecond.
func within(at *time.Time, from, to time.Time) bool {
	return at != nil && !at.Before(from.Add(-time.Millisecond)) && !at.After(to.Add(time.Millisecond))
}

// stampOf is the time the action records.
func stampOf(o Order, a Action) *time.Time {
	switch a {
	case Pay:
		return o.PaidAt
	case Cancel, Expire:
		return o.CancelledAt
	case Redeem:
		return o.UsedAt
	}
	return o.RefundedAt
}

// outcome is what an action does to an order in one state.
type outcome uint8

const (
	moves   outcome = iota // moved now
	repeats                // already in the target state: nothing changes, no error
	wrong                  // ErrWrongState
	notDue                 // ErrNotDue
)

// lifeActions are the actions in the order of the rows of lifeStates.
var lifeActions = [...]Action{Pay, Cancel, Expire, Redeem, Refund}

// targets: where each action takes an order, and whether its unit comes
// back (spelled here, not read from the code's table).
var targets = [...]struct {
	status, reason string
	givesBack      bool
}{
	Pay:    {StatusPaid, "", false},
	Cancel: {StatusCancelled, CancelByBuyer, true},
	Expire: {StatusCancelled, CancelExpired, true},
	Redeem: {StatusUsed, "", false},
	Refund: {StatusRefunded, "", true},
}

// lifeStates: every state an order can be in, how it gets there from
// awaiting payment, and what each action does from it.
var lifeStates = []struct {
	name   string
	status string
	// past: its pay deadline has passed (the actions run on a clock two
	// windows ahead).
	past  bool
	reach []Action
	//       pay cancel expire redeem refund
	want [5]outcome
}{
	{"awaiting payment, deadline ahead", StatusAwaitingPayment, false, nil, [5]outcome{moves, moves, notDue, wrong, wrong}},
	{"awaiting payment, deadline past", StatusAwaitingPayment, true, nil, [5]outcome{moves, moves, moves, wrong, wrong}},
	{"paid", StatusPaid, true, []Action{Pay}, [5]outcome{repeats, wrong, wrong, moves, moves}},
	{"used", StatusUsed, true, []Action{Pay, Redeem}, [5]outcome{wrong, wrong, wrong, repeats, wrong}},
	{"cancelled by buyer", StatusCancelled, true, []Action{Cancel}, [5]outcome{wrong, repeats, wrong, wrong, wrong}},
	{"cancelled expired", StatusCancelled, true, []Action{Expire}, [5]outcome{wrong, wrong, repeats, wrong, wrong}},
	{"refunded", StatusRefunded, true, []Action{Pay, Refund}, [5]outcome{wrong, wrong, wrong, wrong, repeats}},
}

// TestLifecycleTransitions enumerates the lifecycle: every action from
// every state moves the order, repeats (changes nothing, no error), or is
// refused (ErrWrongState naming the state, ErrNotDue), on MariaDB and
// SQLite. A move records its time on the lifecycle's clock; a move that
// gives the unit back raises the database's stock and Redis's by exactly
// one, removes the buyer entry and records unit_back_at; anything else
// leaves the row, both stocks and the buyer entry as they were. A move
// made again is a repeat.
func TestLifecycleTransitions(t *testing.T) {
	t.Parallel()
	eachLifeDB(t, 1990, 100, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		late := e.lifecycleAhead(2 * lifeWindow)
		for _, st := range lifeStates {
			for i, a := range lifeActions {
				t.Run(st.name+"/"+a.String(), func(t *testing.T) {
					p := e.buy(t)
					l := e.life
					if st.past {
						l = late
					}
					for _, r := range st.reach {
						if _, _, err := l.Do(ctx, r, p.order); err != nil {
							t.Fatalf("reach %s: %s: %v", st.name, r, err)
						}
					}
					before, was := e.order(t, p.order), e.sale(t, p.voucher, p.user)
					if before.Status != st.status {
						t.Fatalf("order is %s, want %s", before.Status, st.status)
					}
					movesBefore := e.moves.count(a.String())
					from := l.now().UTC()
					got, moved, err := l.Do(ctx, a, p.order)
					to := l.now().UTC()
					after, now := e.order(t, p.order), e.sale(t, p.voucher, p.user)
					want := st.want[i]
					switch want {
					case moves:
						if err != nil || !moved {
							t.Fatalf("%s: moved %v, %v; want moved", a, moved, err)
						}
						tg := targets[a]
						if after.Status != tg.status || tg.reason != "" && (after.CancelReason == nil || *after.CancelReason != tg.reason) {
							t.Fatalf("after %s: %s; want %s %s", a, describe(after), tg.status, tg.reason)
						}
						if describe(got) != describe(after) {
							t.Errorf("Do returned %s, the database holds %s", describe(got), describe(after))
						}
						if !within(stampOf(after, a), from, to) {
							t.Errorf("after %s: %s; want its time between %s and %s (the lifecycle's clock)", a, describe(after), from, to)
						}
						if e.moves.count(a.String()) != movesBefore+1 {
							t.Errorf("moves %s heard %d times, want once", a, e.moves.count(a.String())-movesBefore)
						}
						wantSale := was
						if tg.givesBack {
							wantSale = was.up()
							if after.Live != nil || after.UnitBackAt == nil {
								t.Errorf("after %s: %s; want not live and its unit back", a, describe(after))
							}
						} else if after.Live == nil || *after.Live != 1 || after.UnitBackAt != nil {
							t.Errorf("after %s: %s; want still live", a, describe(after))
						}
						if now != wantSale {
							t.Errorf("after %s: sale %+v, want %+v (before %+v)", a, now, wantSale, was)
						}
						// Made again: a repeat.
						again, moved, err := l.Do(ctx, a, p.order)
						if err != nil || moved || describe(again) != describe(after) {
							t.Errorf("%s again: %s, moved %v, %v; want %s unchanged", a, describe(again), moved, err, describe(after))
						}
						if s := e.sale(t, p.voucher, p.user); s != now {
							t.Errorf("%s again: sale %+v, want %+v", a, s, now)
						}
						return
					case repeats:
						if err != nil || moved {
							t.Errorf("%s: moved %v, %v; want a repeat (no move, no error)", a, moved, err)
						}
					case wrong:
						var se *StateError
						if !errors.Is(err, ErrWrongState) || !errors.As(err, &se) || se.Status != st.status || se.Action != a || moved {
							t.Errorf("%s: moved %v, %v; want ErrWrongState naming %s", a, moved, err, st.status)
						}
					case notDue:
						if !errors.Is(err, ErrNotDue) || moved {
							t.Errorf("%s: moved %v, %v; want ErrNotDue", a, moved, err)
						}
					}
					if describe(after) != describe(before) {
						t.Errorf("%s changed the order: %s, was %s", a, describe(after), describe(before))
					}
					if now != was {
						t.Errorf("%s changed the sale: %+v, was %+v", a, now, was)
					}
					if e.moves.count(a.String()) != movesBefore {
						t.Errorf("%s heard as a move", a)
					}
				})
			}
		}
	})
}

// TestLifecycleRaces: 300 goroutines released at once make a mix of
// moves on one overdue order, over 21 orders: cancel against expire, pay
// against expire, and all three. Exactly one move is made; every other
// call is a repeat or ErrWrongState. The order ends as exactly one of
// paid or cancelled; a cancelled order's unit is back exactly once in the
// database and in Redis, and its buyer entry is gone; a paid one keeps
// both.
func TestLifecycleRaces(t *testing.T) {
	t.Parallel()
	const orders, callers = 21, 300
	mixes := [][]Action{{Cancel, Expire}, {Pay, Expire}, {Pay, Cancel, Expire}}
	eachLifeDB(t, 1990, orders, func(t *testing.T, e lifeEnv) {
		ctx := context.Background()
		late := e.lifecycleAhead(2 * lifeWindow)
		for n := range orders {
			mix := mixes[n%len(mixes)]
			p := e.buy(t)
			was := e.sale(t, p.voucher, p.user)
			var moved [len(lifeActions)]atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for g := range callers {
				a := mix[g%len(mix)]
				wg.Go(func() {
					<-start
					_, m, err := late.Do(ctx, a, p.order)
					if err != nil && !errors.Is(err, ErrWrongState) {
						t.Errorf("order %d: %s: %v", p.order, a, err)
					}
					if m {
						moved[a].Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			total := int64(0)
			for i := range moved {
				total += moved[i].Load()
			}
			o := e.order(t, p.order)
			if total != 1 {
				t.Fatalf("order %d (%v): %d moves made, want exactly 1; order %s", p.order, mix, total, describe(o))
			}
			s := e.sale(t, p.voucher, p.user)
			switch {
			case o.Status == StatusPaid && moved[Pay].Load() == 1:
				if s != was || o.Live == nil {
					t.Fatalf("order %d paid: sale %+v, was %+v; %s", p.order, s, was, describe(o))
				}
			case o.Status == StatusCancelled && (moved[Cancel].Load() == 1 || moved[Expire].Load() == 1):
				if s != was.up() || o.Live != nil || o.UnitBackAt == nil {
					t.Fatalf("order %d cancelled: sale %+v, want %+v (one unit back); %s", p.order, s, was.up(), describe(o))
				}
			default:
				t.Fatalf("order %d: %s after moves pay %d cancel %d expire %d", p.order, describe(o), moved[Pay].Load(), moved[Cancel].Load(), moved[Expire].Load())
			}
		}
	})
}
