package fault

import (
	"context"
	"fmt"
	"net/http"
	"seckill/internal/testenv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
)

// Each burst: 1,800 purchases by 600 buyers pressing three times each,
// for a stock of 500, so the sale is still on when a fault is injected
// (after an eighth of the burst).
const (
	stock    = 500
	users    = 600
	requests = 1800
	settle   = 60 * time.Second
)

// 1. A worker dies after its commit and before its ack (a deterministic
// crash point): the batch is delivered again to another worker, changes
// nothing, and is acknowledged.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	api := c.start("api", map[string]string{"SECKILL_ROLE": "api"})
	vid := c.createVoucher(api.base, stock)
	crashy := c.start("crashy-worker", map[string]string{"SECKILL_ROLE": "worker", "SECKILL_CRASH_POINT": "after_commit_before_ack"})
	s := newSale()
	c.burst(s, []string{api.base}, vid, users, requests, nil)
	testenv.WaitFor(t, 20*time.Second, "crash point reached", crashy.exited)
	if code := crashy.cmd.ProcessState.ExitCode(); code != 3 {
		t.Fatalf("crashy worker exited %d, want 3 (the crash point)", code)
	}
	committed := c.orders()
	if committed == 0 {
		t.Fatal("the crash point was reached with nothing committed")
	}
	c.start("worker", map[string]string{"SECKILL_ROLE": "worker"})
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d; want %d and 0", rep.Orders, rep.DeadLetters, stock)
	}
	report(t, fmt.Sprintf("worker exit(3) after committing %d orders, before acking them", committed), s, rep)
}

// 2. A worker is killed while it holds a batch, and never comes back:
// another instance reclaims its entries after the idle time.
func TestKilledWorkerNeverRestarted(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	api := c.start("api", map[string]string{"SECKILL_ROLE": "api"})
	vid := c.createVoucher(api.base, stock)
	// The victim stops dead once it has read a batch, holding it.
	victim := c.start("victim", map[string]string{"SECKILL_ROLE": "worker", "SECKILL_CRASH_POINT": "hang_after_read"})
	s := newSale()
	c.burst(s, []string{api.base}, vid, users, requests, nil)
	var held int64
	testenv.WaitFor(t, 20*time.Second, "the victim holds a batch", func() bool {
		held = c.heldByOthers("")
		return held > 0
	})
	victim.signal(t, syscall.SIGKILL)
	c.start("survivor", map[string]string{"SECKILL_ROLE": "worker"})
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d; want %d and 0", rep.Orders, rep.DeadLetters, stock)
	}
	report(t, fmt.Sprintf("SIGKILL of a worker holding %d entries, never restarted", held), s, rep)
}

// 3. SIGTERM in the middle of the load: the instance stops taking
// requests, finishes its batch, exits 0; nothing is acked without commit
// and the other instance takes the rest.
func TestSIGTERMMidLoad(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	a := c.start("a", nil)
	b := c.start("b", nil)
	vid := c.createVoucher(a.base, stock)
	s := newSale()
	c.burst(s, []string{b.base}, vid, users, requests, func() {
		if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	})
	if code := a.wait(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("a exited %d after SIGTERM, want 0", code)
	}
	rep := c.quiesce(s, vid, settle)
	report(t, "SIGTERM to one of two instances mid-burst", s, rep)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d; want %d and 0", rep.Orders, rep.DeadLetters, stock)
	}
}

// 4. MariaDB paused, then killed, mid-load: the workers back off, ack
// nothing, dead-letter nothing (the outage lasts several reclaim idle
// times, so entries must not be passed around meanwhile), and drain when
// MariaDB is back.
func TestMariaDBOutage(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	c.env["SECKILL_WARM_INTERVAL"] = "1h" // keep the warmer off MariaDB
	api := c.start("api", nil)
	c.start("other", nil)
	vid := c.createVoucher(api.base, stock)
	c.maria.Pause(t)
	s := newSale()
	c.burst(s, []string{api.base}, vid, users, requests/2, nil)
	// Accepted orders wait in the stream, none acked: the workers read
	// them (soon after the burst; a read may still be on its way) and hold
	// them pending.
	testenv.WaitFor(t, 10*time.Second, "orders read and held pending while MariaDB is paused", func() bool {
		return c.pending() > 0
	})
	// The outage lasts five reclaim idle times (SECKILL_RECLAIM_IDLE=1s):
	// holding the fault is the scenario, not a wait for a result.
	<-time.After(5 * time.Second)
	c.maria.Resume(t)
	c.burst(s, []string{api.base}, vid, users, requests/2, func() { c.maria.Kill(t) })
	c.maria.Restart(t)
	rep := c.quiesce(s, vid, settle)
	if d := c.deadLetters(); len(d) != 0 {
		t.Fatalf("dead letters %v after a database outage; want none", d)
	}
	report(t, "mariadbd SIGSTOP for 5 s during a burst (two instances), SIGCONT; then SIGKILL mid-burst and restart", s, rep)
}

// 5. Redis killed with -9 under AOF always and restarted on the same dir:
// nothing acknowledged is lost, groups and pending lists come back, the
// workers resume by themselves.
func TestRedisKilledWithAOF(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	a := c.start("a", nil)
	b := c.start("b", nil)
	vid := c.createVoucher(a.base, stock)
	s := newSale()
	var slowest time.Duration
	c.burst(s, []string{a.base, b.base}, vid, users, requests, func() {
		c.redis.Kill(t)
		// While Redis is down, purchases fail fast with 503.
		tok := token(t, 800_000, auth.RoleUser)
		for range 5 {
			began := time.Now()
			ans := c.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", a.base, vid), tok, nil)
			s.record(800_000, ans)
			slowest = max(slowest, time.Since(began))
			if ans.status != http.StatusServiceUnavailable {
				t.Errorf("purchase with Redis down: %+v, want 503", ans)
			}
		}
		c.redis.Restart(t)
	})
	if slowest > 5*time.Second {
		t.Errorf("a purchase with Redis down took %s; want a quick 503", slowest)
	}
	rep := c.quiesce(s, vid, settle)
	if d := c.deadLetters(); len(d) != 0 {
		t.Fatalf("dead letters %v; want none", d)
	}
	report(t, fmt.Sprintf("redis-server SIGKILL mid-burst (slowest 503 while down: %s), restarted on its AOF (appendfsync always)", slowest.Round(time.Millisecond)), s, rep)
}

// 6. Redis restarted without persistence: everything in it is gone.
// Purchases answer 503 not_ready (never sold_out, never 202) until the
// state is rebuilt from MySQL; then old buyers are still refused and the
// stock is right.
func TestRedisRestartedEmpty(t *testing.T) {
	t.Parallel()
	c := newCluster(t, false)
	c.env["SECKILL_WARM_INTERVAL"] = "2s"
	a := c.start("a", nil)
	vid := c.createVoucher(a.base, stock)
	s := newSale()
	c.burst(s, []string{a.base}, vid, users/4, users/4, nil) // fewer buyers than stock
	c.quiesce(s, vid, settle)
	sold := c.orders()

	c.redis.Kill(t)
	c.redis.Restart(t)
	// Right after the restart, until the warmer rebuilt the state, every
	// purchase fails closed.
	var notReady, other atomic.Int64
	probe := token(t, 900_000, auth.RoleUser)
	url := fmt.Sprintf("%s/api/v1/vouchers/%d/orders", a.base, vid)
	testenv.WaitFor(t, 60*time.Second, "a purchase accepted once the state is rebuilt", func() bool {
		ans := c.do("POST", url, probe, nil)
		if ans.status == http.StatusServiceUnavailable {
			notReady.Add(1)
			return false
		}
		if ans.status != http.StatusAccepted || ans.err != nil {
			t.Fatalf("after an empty restart: %+v; want 503 until rebuilt, then 202", ans)
		}
		s.record(900_000, ans)
		other.Add(1)
		return true
	})
	if notReady.Load() == 0 {
		t.Fatal("no purchase was refused with 503 before the rebuild")
	}
	// Old buyers still hold their orders.
	c.burst(s, []string{a.base}, vid, users/4, users/4, nil)
	if s.codes["accepted"] != sold+1 {
		t.Fatalf("accepted %d after rebuild, want %d (old buyers refused)", s.codes["accepted"], sold+1)
	}
	c.burst(s, []string{a.base}, vid, users, requests, nil)
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d; want %d and 0", rep.Orders, rep.DeadLetters, stock)
	}
	report(t, fmt.Sprintf("redis-server without persistence killed and restarted empty; %d purchases answered 503 before the rebuild", notReady.Load()), s, rep)
}

// 7 and 8. Buyer locks held elsewhere: those messages go through the
// delay queue (polled by three instances) until the locks are free, and
// each lands exactly once.
func TestHeldLocksGoThroughDelayQueue(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	c.env["SECKILL_MAX_ATTEMPTS"] = "1000"
	a := c.start("a", nil)
	b := c.start("b", nil)
	c.start("c", nil)
	vid := c.createVoucher(a.base, stock)
	ctx := context.Background()
	const heldUsers = 50
	for u := range heldUsers {
		key := fmt.Sprintf("%s:lock:buyer:%d:%d", c.prefix, vid, 1000+u)
		if err := c.rdb.Set(ctx, key, "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s := newSale()
	c.burst(s, []string{a.base, b.base}, vid, users, requests, nil)
	testenv.WaitFor(t, 20*time.Second, "held buyers in the delay queue", func() bool {
		n, _ := c.rdb.ZCard(ctx, c.keys.Delayed(0)).Result()
		return n > 0
	})
	for u := range heldUsers {
		c.rdb.Del(ctx, fmt.Sprintf("%s:lock:buyer:%d:%d", c.prefix, vid, 1000+u))
	}
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d", rep.Orders, rep.DeadLetters)
	}
	report(t, fmt.Sprintf("buyer locks of %d buyers held elsewhere, then freed; three instances polling the delay queue", heldUsers), s, rep)
}

// 9. A poison message amid good ones: it is dead-lettered with its reason,
// the good ones land, the worker runs on.
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	a := c.start("a", nil)
	vid := c.createVoucher(a.base, stock)
	s := newSale()
	c.burst(s, []string{a.base}, vid, users, requests, func() {
		err := c.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: c.keys.Stream(0), Values: map[string]any{"v": "1", "order": "garbage"}}).Err()
		if err != nil {
			t.Error(err)
		}
	})
	rep := c.quiesce(s, vid, settle)
	if d := c.deadLetters(); d["undecodable"] != 1 || len(d) != 1 {
		t.Fatalf("dead letters %v, want one undecodable", d)
	}
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d; want %d and 0", rep.Orders, rep.DeadLetters, stock)
	}
	report(t, "an undecodable stream entry in the middle of a burst", s, rep)
}

// 10. Hostile input and 1,000 concurrent purchases from one buyer against
// the real binary: exactly one success, 4xx for the bad input, no side
// effects.
func TestHostileInputAndOneBuyer(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	a := c.start("a", nil)
	vid := c.createVoucher(a.base, stock)
	tok := token(t, 4242, auth.RoleUser)
	for _, path := range []string{"abc", "0", "-1", "99999999999999999999", "1.5", fmt.Sprint(vid + 100)} {
		ans := c.do("POST", a.base+"/api/v1/vouchers/"+path+"/orders", tok, nil)
		if ans.status < 400 || ans.status >= 500 || ans.code == "" {
			t.Errorf("purchase of voucher %q: %+v, want a 4xx with a code", path, ans)
		}
	}
	for _, bad := range []string{"", "Bearer", "Bearer x.y.z", "Bearer " + tok + "x"} {
		req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", a.base, vid), nil)
		req.Header.Set("Authorization", bad)
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401", bad, resp.StatusCode)
		}
	}
	s := newSale()
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s.record(4242, c.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", a.base, vid), tok, nil))
		}()
	}
	close(start)
	wg.Wait()
	if s.codes["accepted"] != 1 || s.codes["already_purchased"] != 999 {
		t.Fatalf("one buyer, 1,000 presses: %v; want 1 accepted and 999 already_purchased", s.codes)
	}
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != 1 || rep.DBStock != stock-1 {
		t.Fatalf("after hostile input: %s", rep)
	}
	report(t, "malformed ids and tokens, then 1,000 concurrent purchases by one buyer", s, rep)
}

// 11. Three independent lock nodes, one killed mid-load: locks keep a
// majority, everything lands.
func TestLockNodeKilled(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	var nodes []string
	var servers []interface{ Kill(testing.TB) }
	for range 3 {
		n := startLockNode(t)
		nodes = append(nodes, n.URL())
		servers = append(servers, n)
	}
	c.env["SECKILL_LOCK_NODES"] = strings.Join(nodes, ",")
	a := c.start("a", nil)
	b := c.start("b", nil)
	vid := c.createVoucher(a.base, stock)
	s := newSale()
	c.burst(s, []string{a.base, b.base}, vid, users, requests, func() { servers[2].Kill(t) })
	rep := c.quiesce(s, vid, settle)
	if rep.Orders != stock || rep.DeadLetters != 0 {
		t.Fatalf("orders %d dead letters %d", rep.Orders, rep.DeadLetters)
	}
	report(t, "one of three lock nodes SIGKILLed mid-burst", s, rep)
}

// orders counts the orders in MySQL.
func (c *cluster) orders() int {
	c.t.Helper()
	var n int
	if err := c.openDB().Raw("SELECT COUNT(*) FROM orders").Scan(&n).Error; err != nil {
		c.t.Fatal(err)
	}
	return n
}

// pending is the group's pending count.
func (c *cluster) pending() int64 {
	p, err := c.rdb.XPending(context.Background(), c.keys.Stream(0), group).Result()
	if err != nil {
		return 0
	}
	return p.Count
}

// heldByOthers counts the entries pending with consumers other than name.
func (c *cluster) heldByOthers(name string) int64 {
	cs, err := c.rdb.XInfoConsumers(context.Background(), c.keys.Stream(0), group).Result()
	if err != nil {
		return 0
	}
	var n int64
	for _, x := range cs {
		if x.Name != name {
			n += x.Pending
		}
	}
	return n
}
