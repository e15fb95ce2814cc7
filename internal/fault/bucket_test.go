package fault

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/bucket"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

// The sale of one hot voucher whose stock is split into buckets, one per
// master of a Redis Cluster of three (issue 21): every master sells, units
// move to the buckets whose buyers come, and a master's failure stops only
// its own bucket.
const buckets = 3

// bucketSale is one voucher of buckets buckets on a Redis Cluster, the
// instances selling it, and what its buyers were told, by home bucket.
type bucketSale struct {
	*cluster
	rc    *testenv.Cluster
	crdb  *redis.ClusterClient
	insts map[string]*instance
	v     int64
	sale  *sale

	mu     sync.Mutex
	byHome [buckets]map[string]int // answers by code, per home bucket
	// firstSoldOut and lastSale are when the first sold_out and the last
	// 202 were answered.
	firstSoldOut, lastSale time.Time
	// timed holds every press's answer time, by home bucket.
	timed [buckets][]timedAnswer
}

// timedAnswer is when a press was sent, how long its answer took, its
// HTTP status (0: none) and whether a 503 said when to retry.
type timedAnswer struct {
	at     time.Time
	took   time.Duration
	status int
	// bare: a 503 without Retry-After.
	bare bool
}

// latency is the p-th percentile (0 < p <= 1) of the answer times of
// home b's presses sent in [from, to) whose status keep accepts, and how
// many there were.
func (w *bucketSale) latency(b int, from, to time.Time, p float64, keep func(status int) bool) (time.Duration, int) {
	w.mu.Lock()
	var ds []time.Duration
	for _, a := range w.timed[b] {
		if !a.at.Before(from) && a.at.Before(to) && keep(a.status) {
			ds = append(ds, a.took)
		}
	}
	w.mu.Unlock()
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(math.Ceil(p*float64(len(ds))))-1)], len(ds)
}

// newBucketSale starts the cluster and MariaDB; instances are started by
// the scenario (start), and the voucher is created by the first one.
func newBucketSale(t *testing.T, opt testenv.ClusterOptions, extra map[string]string) *bucketSale {
	t.Helper()
	rc := testenv.StartCluster(t, opt)
	c := &cluster{t: t, prefix: "seckill"}
	c.maria = testenv.StartMariaDB(t)
	c.dsn = c.maria.CreateDatabase(t)
	c.keys = voucher.KeysFor(c.prefix, shards, true)
	c.env = settings(rc.URL(), c.dsn)
	c.env["SECKILL_SHARDS"] = strconv.Itoa(shards)
	// A transfer cut short is finished or returned within about a second.
	c.env["SECKILL_BUCKET_STALE_AFTER"] = "1s"
	c.env["SECKILL_BUCKET_APPLY_WINDOW"] = "500ms"
	for k, v := range extra {
		c.env[k] = v
	}
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	// The harness sees a worker start by its consumer on shard 0's stream.
	c.rdb = rc.MasterOf(t, c.keys.Stream(0)).Client(t)
	w := &bucketSale{cluster: c, rc: rc, crdb: rc.Client(t), insts: map[string]*instance{}, sale: newSale()}
	for b := range w.byHome {
		w.byHome[b] = map[string]int{}
	}
	return w
}

// replicatedSale is the voucher of stock units on 3 masters with a
// replica each, sold by two instances whose purchases and transfers wait
// for a replica (WAIT 1, 300ms), with extra settings; every replica is in
// step when it returns.
func replicatedSale(t *testing.T, stock int, extra map[string]string) (w *bucketSale, a, b *instance) {
	t.Helper()
	env := map[string]string{"SECKILL_REDIS_WAIT_REPLICAS": "1", "SECKILL_REDIS_WAIT_TIMEOUT": "300ms"}
	maps.Copy(env, extra)
	w = newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second}, env)
	a, b = w.run("a", nil), w.run("b", nil)
	w.create(a.base, stock)
	w.rc.WaitHealthy(t, time.Minute)
	return w, a, b
}

// run starts an instance with extra settings.
func (w *bucketSale) run(name string, extra map[string]string) *instance {
	in := w.start(name, extra)
	w.insts[name] = in
	return in
}

// create puts the voucher on sale, in buckets buckets, through base.
func (w *bucketSale) create(base string, stock int) {
	w.t.Helper()
	a := w.do("POST", base+"/api/v1/vouchers", token(w.t, 1, auth.RoleAdmin), map[string]any{
		"title": "hot", "face_value": 100, "stock": stock, "buckets": buckets,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if a.status != http.StatusCreated {
		w.t.Fatalf("create voucher of %d buckets: %+v", buckets, a)
	}
	w.v = a.order
	for b := range buckets {
		for c := range b {
			if w.master(b) == w.master(c) {
				w.t.Fatalf("buckets %d and %d share master %s", c, b, w.master(b).Addr)
			}
		}
	}
}

// shard is the shard of bucket b.
func (w *bucketSale) shard(b int) int { return w.keys.BucketShard(w.v, b, buckets) }

// master is the node serving bucket b now.
func (w *bucketSale) master(b int) *testenv.ClusterNode {
	w.t.Helper()
	return w.rc.MasterOf(w.t, w.keys.Stream(w.shard(b)))
}

// press buys the voucher for user at base and records the answer.
func (w *bucketSale) press(base string, user int64, tok string) answer {
	sent := time.Now()
	a := w.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, w.v), tok, nil)
	took := time.Since(sent)
	w.sale.record(user, a)
	code := a.code
	switch {
	case a.err != nil:
		code = "transport_error"
	case a.status == http.StatusAccepted:
		code = "accepted"
	}
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	home := voucher.Home(user, buckets)
	w.byHome[home][code]++
	w.timed[home] = append(w.timed[home], timedAnswer{at: sent, took: took, status: a.status,
		bare: a.status == http.StatusServiceUnavailable && a.retryAfter == ""})
	switch {
	case code == "accepted":
		w.lastSale = now
	case code == "sold_out" && w.firstSoldOut.IsZero():
		w.firstSoldOut = now
	}
	return a
}

// failed counts the answers of buyers of home b that sold nothing and
// refused nothing: 5xx and dropped connections.
func (w *bucketSale) failed(b int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for code, k := range w.byHome[b] {
		if code == "transport_error" || code == "not_ready" || code == "unavailable" || code == "not_replicated" || code == "busy" {
			n += k
		}
	}
	return n
}

// inTransit sums the units the voucher's buckets lent in transfers still
// open (their out fields); -1 when they cannot be read.
func (w *bucketSale) inTransit() int64 {
	var sum int64
	for b := range buckets {
		n, err := w.crdb.HGet(context.Background(), w.keys.StateAt(w.shard(b), w.v), voucher.FieldOut).Int64()
		if err != nil {
			return -1
		}
		sum += n
	}
	return sum
}

// recovered waits until a buyer of home b gets a definite answer again
// (the purchase script ran on a ready bucket), and returns how long that
// took.
func (w *bucketSale) recovered(b int, within time.Duration) time.Duration {
	w.t.Helper()
	began := time.Now()
	probe := homeOnly(b, 900_000, 1)[0]
	tok := token(w.t, probe, auth.RoleUser)
	bases := make([]string, 0, len(w.insts))
	for _, in := range w.insts {
		if !in.exited() {
			bases = append(bases, in.base)
		}
	}
	tries := 0
	testenv.WaitFor(w.t, within, fmt.Sprintf("a definite answer to a buyer of bucket %d", b), func() bool {
		tries++
		a := w.press(bases[tries%len(bases)], probe, tok)
		return a.err == nil && a.status < 500
	})
	return time.Since(began)
}

// accepted counts the 202s of buyers of home b.
func (w *bucketSale) accepted(b int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.byHome[b]["accepted"]
}

func (w *bucketSale) answers() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprint(w.byHome)
}

// buyersFrom returns n buyers from first on: a share skew of them at home in
// bucket 0, the others at home elsewhere (skew 0: every user in turn).
func buyersFrom(first int64, n int, skew float64) []int64 {
	out := make([]int64, 0, n)
	home0 := int(float64(n) * skew)
	var zero, other int
	for u := first; len(out) < n; u++ {
		switch {
		case skew == 0:
			out = append(out, u)
		case voucher.Home(u, buckets) == 0 && zero < home0:
			out = append(out, u)
			zero++
		case voucher.Home(u, buckets) != 0 && other < n-home0:
			out = append(out, u)
			other++
		}
	}
	return out
}

// burst is presses under way.
type burst struct {
	answered atomic.Int64
	done     chan struct{}
}

// fire sends one press per buyer, conc at a time, at the bases in turn
// (a base that is gone answers transport errors); it returns at once.
func (w *bucketSale) fire(buyers []int64, bases []string, conc int) *burst {
	w.t.Helper()
	tokens := make([]string, len(buyers))
	for i, u := range buyers {
		tokens[i] = token(w.t, u, auth.RoleUser)
	}
	r := &burst{done: make(chan struct{})}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				w.press(bases[i%len(bases)], buyers[i], tokens[i])
				r.answered.Add(1)
			}
		}()
	}
	go func() {
		for i := range buyers {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		close(r.done)
	}()
	return r
}

func (r *burst) reach(t *testing.T, k int64) {
	t.Helper()
	testenv.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d purchases answered", k), func() bool { return r.answered.Load() >= k })
}

func (r *burst) wait(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the burst did not end within 3m")
	}
}

// evalsha reads each master's EVALSHA calls so far (INFO commandstats).
func (w *bucketSale) evalsha() map[string]int64 {
	w.t.Helper()
	out := map[string]int64{}
	for _, m := range w.rc.Masters(w.t) {
		info, err := m.Client(w.t).Info(context.Background(), "commandstats").Result()
		if err != nil {
			w.t.Fatalf("commandstats of %s: %v", m.Addr, err)
		}
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				out[m.Addr] = n
			}
		}
	}
	return out
}

// settle waits until the pipeline drained and every invariant holds,
// the accepted orders that ended as neither order nor dead letter aside:
// those are lost, and returned for the scenario to judge.
func (w *bucketSale) settle(within time.Duration) (verify.Report, []int64) {
	w.t.Helper()
	g := w.openDB()
	ctx := context.Background()
	var last string
	deadline := time.Now().Add(within)
	for {
		in := w.sale.input(w.v)
		lost, err := w.lost(ctx)
		if err == nil {
			for _, id := range lost {
				delete(in.Accepted, id)
			}
			var rep verify.Report
			rep, err = verify.Check(ctx, g, w.crdb, w.keys, in)
			again, err2 := w.lost(ctx)
			if err == nil && err2 == nil && rep.OK() && slices.Equal(again, lost) {
				return rep, lost
			}
			last = fmt.Sprintf("check error %v; %s", err, rep)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("the sale did not settle within %s: %s", within, last)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// lost lists, sorted, the accepted orders that are neither an order nor a
// dead letter now.
func (w *bucketSale) lost(ctx context.Context) ([]int64, error) {
	var ended []int64
	err := w.openDB().WithContext(ctx).Raw("SELECT id FROM orders WHERE voucher_id = ? UNION SELECT order_id FROM dead_letters WHERE voucher_id = ?", w.v, w.v).Scan(&ended).Error
	if err != nil {
		return nil, err
	}
	done := make(map[int64]bool, len(ended))
	for _, id := range ended {
		done[id] = true
	}
	s := w.sale
	s.mu.Lock()
	defer s.mu.Unlock()
	var lost []int64
	for id := range s.accepted {
		if !done[id] {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	return lost, nil
}

// One buyer pressing 400 times at once on both instances gets one order;
// then a stampede from two instances on one voucher of three buckets: each
// master runs about a third of the purchase scripts, and every invariant
// holds. The instances only sell (SECKILL_ROLE=api) while the scripts are
// counted, so that the worker's scripts are not; a worker drains after.
func TestClusterBucketsSpreadScripts(t *testing.T) {
	const stock, buyers = 1500, 3000
	// No answers from the instances' memory: every press runs the
	// purchase script, the one-per-buyer check included.
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1}, map[string]string{"SECKILL_LOCAL_REFUSALS_TTL": "off"})
	a := w.run("a", map[string]string{"SECKILL_ROLE": "api"})
	b := w.run("b", map[string]string{"SECKILL_ROLE": "api"})
	w.create(a.base, stock)
	w.oneBuyerEverywhere(t, homeOnly(2, 5_000, 1)[0], 400)
	before := w.evalsha()
	w.fire(buyersFrom(10_000, buyers, 0), []string{a.base, b.base}, 64).wait(t)
	after := w.evalsha()
	w.run("worker", map[string]string{"SECKILL_ROLE": "worker"})
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("lost accepted orders %v", lost)
	}
	if rep.Live != stock {
		t.Fatalf("%d units sold of %d to %d buyers and one who pressed everywhere; answers %s", rep.Live, stock, buyers, w.answers())
	}
	var total int64
	for addr := range after {
		total += after[addr] - before[addr]
	}
	for addr := range after {
		share := float64(after[addr]-before[addr]) / float64(total)
		t.Logf("master %s ran %d of %d purchase scripts (%.1f%%)", addr, after[addr]-before[addr], total, 100*share)
		if share < 0.25 || share > 0.42 {
			t.Errorf("master %s ran %.1f%% of the purchase scripts; want 25%% to 42%%", addr, 100*share)
		}
	}
	t.Logf("answers by home bucket %s; checked I1-I7: %s", w.answers(), rep)
}

// Demand three times the stock, four buyers in five at home in bucket 0:
// every unit is sold, moved to bucket 0 as its buyers come, and no buyer
// is told sold_out long before the last unit is sold (the first sold_out
// and the last sale come within the bound below of each other: units
// in transit are answered 503 busy, never sold_out).
func TestClusterSkewedBuyersSellAll(t *testing.T) {
	const stock, buyers = 300, 900
	const bound = 2 * time.Second
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1}, nil)
	a := w.run("a", nil)
	b := w.run("b", nil)
	w.create(a.base, stock)
	w.fire(buyersFrom(20_000, buyers, 0.8), []string{a.base, b.base}, 32).wait(t)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("lost accepted orders %v", lost)
	}
	if rep.Live != stock {
		t.Fatalf("%d units sold of %d; answers by home %s", rep.Live, stock, w.answers())
	}
	w.mu.Lock()
	gap := w.firstSoldOut.Sub(w.lastSale)
	first, last := w.firstSoldOut, w.lastSale
	w.mu.Unlock()
	if !first.IsZero() && last.Sub(first) > bound {
		t.Errorf("the first sold_out came %s before the last unit was sold; want at most %s", last.Sub(first), bound)
	}
	t.Logf("first sold_out %s after the last sale (negative: before it); answers by home bucket %s; checked I1-I7: %s",
		gap.Round(time.Millisecond), w.answers(), rep)
}

// kill -9 of one bucket's master in the middle of a sale, purchases
// confirmed by a replica: buyers of the other buckets are never answered
// 503, no accepted order is lost, and the bucket sells again after the
// failover (rebuilt from the others' alloc and the database).
func TestClusterBucketMasterKilled(t *testing.T) {
	const stock, buyers, killed = 3000, 2400, 1
	w, a, b := replicatedSale(t, stock, nil)
	victim := w.master(killed)
	start := time.Now()
	r := w.fire(buyersFrom(30_000, buyers, 0), []string{a.base, b.base}, 32)
	r.reach(t, buyers/4)
	victim.Kill(t)
	began := time.Now()
	w.rc.WaitFailover(t, victim, time.Minute)
	failover := time.Since(began)
	ended := time.Now()
	// Back as a replica, so the promoted master has one again.
	victim.Restart(t)
	w.rc.WaitHealthy(t, time.Minute)
	r.wait(t)
	back := w.recovered(killed, 90*time.Second)
	// The killed bucket's buyers buy again: pressed until one is accepted,
	// since a wave can fall whole inside the shard's master_changed
	// rebuild.
	w.sellsWithin(killed, 40_000, time.Minute)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("%d orders confirmed by a replica were lost: %v", len(lost), lost)
	}
	for h := range buckets {
		if n := w.failed(h); h != killed && n != 0 {
			t.Errorf("buyers of bucket %d, on a master that ran on, got %d answers 503 or none", h, n)
		}
	}
	t.Logf("failover in %s; the bucket answered again %s after the burst; answers by home bucket %s; checked I1-I7: %s",
		failover.Round(time.Millisecond), back.Round(time.Millisecond), w.answers(), rep)
	// The rebuild fenced the other buckets (no lending) for its apply
	// window (500ms here) and the time to fence, drain and count: bounded
	// at 3s.
	const pauseSeries = "seckill_bucket_rebuild_pause_seconds"
	var rebuilds, within, secs float64
	for _, in := range []*instance{a, b} {
		rebuilds += w.counter(in, pauseSeries+"_count")
		within += w.counter(in, pauseSeries+`_bucket{le="3"}`)
		secs += w.counter(in, pauseSeries+"_sum")
	}
	t.Logf("%.0f bucket rebuilds fenced the other buckets for %.3fs on average", rebuilds, secs/max(rebuilds, 1))
	if rebuilds == 0 || within != rebuilds {
		t.Errorf("%.0f bucket rebuilds reported a pause, %.0f of them within 3s: want at least one, each within 3s", rebuilds, within)
	}
	// A dead bucket fails fast: its buyers' 503s come within 250ms
	// (p99), each saying when to retry, and the other buckets' buyers
	// wait no longer than before the kill (2x, or 100ms on this shared
	// machine).
	all := func(int) bool { return true }
	busy := func(st int) bool { return st == http.StatusServiceUnavailable }
	// Every press of the dead bucket sent during the failover counts,
	// whatever it was answered: one that hung and then sold counts too.
	dead, n := w.latency(killed, began, ended, 0.99, all)
	_, pauses := w.latency(killed, began, ended, 0.99, busy)
	_, none := w.latency(killed, began, ended, 0.99, func(st int) bool { return st == 0 })
	t.Logf("the dead bucket's buyers during the failover: p99 of their %d answers (%d of them 503) %s", n, pauses, dead.Round(time.Millisecond))
	if pauses == 0 || dead >= 250*time.Millisecond || none != 0 {
		t.Errorf("the dead bucket's buyers during the failover: p99 of %d answers %s, %d of them 503, %d unanswered; want 503s within 250ms and none unanswered",
			n, dead, pauses, none)
	}
	if bare := w.bare(); bare != 0 {
		t.Errorf("%d answers 503 without Retry-After", bare)
	}
	for h := range buckets {
		if h == killed {
			continue
		}
		before, nb := w.latency(h, start, began, 0.99, all)
		during, nd := w.latency(h, began, ended, 0.99, all)
		t.Logf("bucket %d's buyers: p99 %s before the kill (%d answers), %s during the failover (%d)",
			h, before.Round(time.Millisecond), nb, during.Round(time.Millisecond), nd)
		if during > max(2*before, 100*time.Millisecond) {
			t.Errorf("bucket %d's buyers: p99 %s during the failover, %s before: want within 2x (or 100ms)", h, during, before)
		}
	}
}

// bare counts the answers 503 without Retry-After.
func (w *bucketSale) bare() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, as := range w.timed {
		for _, a := range as {
			if a.bare {
				n++
			}
		}
	}
	return n
}

// oneBuyerEverywhere releases n presses of one buyer at once, on every
// instance in turn (instances that have not sold the voucher yet send the
// first press to bucket 0 and learn its buckets from the script): exactly
// one is accepted, the rest name that order.
func (w *bucketSale) oneBuyerEverywhere(t *testing.T, user int64, n int) {
	t.Helper()
	var bases []string
	for _, in := range w.insts {
		bases = append(bases, in.base)
	}
	tok := token(t, user, auth.RoleUser)
	start := make(chan struct{})
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i] = w.press(bases[i%len(bases)], user, tok)
		}()
	}
	close(start)
	wg.Wait()
	orders := map[int64]int{}
	for _, a := range answers {
		if a.status == http.StatusAccepted || a.code == "already_purchased" {
			orders[a.order]++
		}
	}
	won := 0
	for _, a := range answers {
		if a.status == http.StatusAccepted {
			won++
		}
	}
	if won != 1 || len(orders) != 1 {
		t.Fatalf("one buyer pressing %d times on %d instances at once: %d accepted, orders named %v; want one", n, len(bases), won, orders)
	}
}

// homeOnly returns n buyers from first on whose home is bucket b.
func homeOnly(b int, first int64, n int) []int64 {
	var out []int64
	for u := first; len(out) < n; u++ {
		if voucher.Home(u, buckets) == b {
			out = append(out, u)
		}
	}
	return out
}

// An instance exits in the middle of a transfer of units between buckets
// (after the donor gave them, after the receiver took them in): the other
// instance's recovery loop returns or finishes the transfer, every unit is
// sold once, and no buyer holds two orders.
func TestClusterTransferCrashPoints(t *testing.T) {
	for _, point := range []string{"after_take_before_apply", "after_apply_before_close"} {
		t.Run(point, func(t *testing.T) {
			const stock = 90
			w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1}, nil)
			crash := w.run("crash", map[string]string{"SECKILL_CRASH_POINT": point})
			b := w.run("b", nil)
			w.create(b.base, stock)
			// Bucket 0's buyers come to the crashing instance until its
			// first transfer stops it half-way.
			w.fire(homeOnly(0, 50_000, stock/buckets+5), []string{crash.base}, 4).wait(t)
			if code := crash.wait(t, 0); code != 3 {
				t.Fatalf("the instance exited with %d, want 3 at %s", code, point)
			}
			// Everyone else buys at the other instance, twice the stock;
			// the units of the cut transfer are in transit (503 busy) until
			// the recovery loop returns or finishes it, and are sold after.
			w.fire(buyersFrom(60_000, 2*stock, 0.5), []string{b.base}, 16).wait(t)
			testenv.WaitFor(t, 30*time.Second, "no transfer open", func() bool { return w.inTransit() == 0 })
			w.fire(buyersFrom(90_000, stock, 0), []string{b.base}, 16).wait(t)
			rep, lost := w.settle(time.Minute)
			// The purchases the crashed instance had accepted landed (its
			// worker wrote them or the other's took them over).
			if len(lost) != 0 {
				t.Fatalf("lost accepted orders %v", lost)
			}
			if rep.Live != stock {
				t.Fatalf("%d units sold of %d; answers by home %s", rep.Live, stock, w.answers())
			}
			t.Logf("answers by home bucket %s; checked I1-I7 (alloc + in transit = total, nothing in transit): %s", w.answers(), rep)
		})
	}
}

// An instance dies in the middle of a transfer (after the donor gave the
// units, before the receiver took them in) and the donor's master is
// killed with it; its replica takes over (WAIT 1). With the default
// apply window and stale-after, the last units, those in transit and the
// donor bucket's own, sell within 5s of the failover's end (the issue
// measured 14.2-14.3 s on 3e46bea), every unit is sold once and no
// accepted order is lost.
func TestClusterInstanceAndDonorKilledMidMove(t *testing.T) {
	const stock = 300
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second}, map[string]string{
		"SECKILL_REDIS_WAIT_REPLICAS": "1", "SECKILL_REDIS_WAIT_TIMEOUT": "300ms",
		// The defaults, not the harness's short ones.
		"SECKILL_BUCKET_STALE_AFTER": "", "SECKILL_BUCKET_APPLY_WINDOW": "",
	})
	crash := w.run("crash", map[string]string{"SECKILL_CRASH_POINT": "after_take_before_apply"})
	b := w.run("b", nil)
	w.create(b.base, stock)
	w.rc.WaitHealthy(t, time.Minute)
	// Bucket 0's buyers come to the crashing instance until its first
	// transfer stops it half-way; the donor's master dies at once.
	w.fire(homeOnly(0, 50_000, stock/buckets+5), []string{crash.base}, 4).wait(t)
	if code := crash.wait(t, 0); code != 3 {
		t.Fatalf("the instance exited with %d, want 3 after the take", code)
	}
	donor := -1
	for bk := range buckets {
		n, err := w.crdb.HGet(context.Background(), w.keys.StateAt(w.shard(bk), w.v), voucher.FieldOut).Int64()
		if err == nil && n > 0 {
			donor = bk
		}
	}
	if donor < 0 {
		t.Fatal("no bucket has units in transit after the crash")
	}
	victim := w.master(donor)
	victim.Kill(t)
	w.rc.WaitFailover(t, victim, time.Minute)
	failedOver := time.Now()
	// Buyers of every bucket keep coming at the other instance until the
	// voucher is sold out.
	next := int64(60_000)
	testenv.WaitFor(t, time.Minute, "the voucher sold out", func() bool {
		w.fire(buyersFrom(next, 60, 0), []string{b.base}, 16).wait(t)
		next += 60
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.firstSoldOut.After(failedOver)
	})
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("lost accepted orders %v", lost)
	}
	if rep.Live != stock {
		t.Fatalf("%d units sold of %d; answers by home %s", rep.Live, stock, w.answers())
	}
	w.mu.Lock()
	last := w.lastSale.Sub(failedOver)
	w.mu.Unlock()
	t.Logf("donor bucket %d; the last unit sold %s after the failover; answers by home bucket %s; checked I1-I7: %s",
		donor, last.Round(time.Millisecond), w.answers(), rep)
	if last > 5*time.Second {
		t.Errorf("the last unit sold %s after the failover, want within 5s", last.Round(time.Millisecond))
	}
}

// One bucket's master restarts empty (no persistence, no replica): that
// bucket is rebuilt from the database and the other buckets' alloc while
// the other buckets never stop selling; nothing is oversold or sold twice.
// Orders that bucket accepted and that had not reached the database are
// lost with its data (no persistence): only its buyers may lose one.
func TestClusterBucketMasterRestartedEmpty(t *testing.T) {
	const stock, buyers, emptied = 3000, 2400, 2
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1, ExtraArgs: []string{"--save", ""}}, nil)
	a := w.run("a", nil)
	b := w.run("b", nil)
	w.create(a.base, stock)
	victim := w.master(emptied)
	r := w.fire(buyersFrom(70_000, buyers, 0), []string{a.base, b.base}, 32)
	r.reach(t, buyers/4)
	victim.Kill(t)
	victim.Restart(t)
	w.rc.WaitHealthy(t, time.Minute)
	r.wait(t)
	w.recovered(emptied, 90*time.Second)
	before := w.accepted(emptied)
	w.fire(homeOnly(emptied, 80_000, 100), []string{a.base, b.base}, 8).wait(t)
	if w.accepted(emptied) == before {
		t.Errorf("no buyer of bucket %d was accepted after its master restarted; answers %s", emptied, w.answers())
	}
	rep, lost := w.settle(2 * time.Minute)
	buyerOf := map[int64]int64{}
	w.sale.mu.Lock()
	for id, u := range w.sale.accepted {
		buyerOf[id] = u
	}
	w.sale.mu.Unlock()
	for _, id := range lost {
		if h := voucher.Home(buyerOf[id], buckets); h != emptied {
			t.Errorf("order %d of a buyer of bucket %d was lost; only bucket %d lost its data", id, h, emptied)
		}
	}
	for h := range buckets {
		if n := w.failed(h); h != emptied && n != 0 {
			t.Errorf("buyers of bucket %d, on a master that ran on, got %d answers 503 or none", h, n)
		}
	}
	t.Logf("lost %d orders of bucket %d; answers by home bucket %s; checked I1-I7: %s", len(lost), emptied, w.answers(), rep)
}

// A priced voucher of three buckets on one Redis (three shards): some
// winners cancel, half never pay; the cancelled and expired units go back
// to their buckets and a second stampede of new buyers sells exactly
// those, wherever its buyers' homes are.
func TestBucketedUnitsResold(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	c.env["SECKILL_SHARDS"] = strconv.Itoa(shards)
	c.keys = voucher.NewKeys(c.prefix, shards)
	c.withLifecycle(8 * time.Second)
	a := c.start("a", nil)
	b := c.start("b", nil)
	bases := []string{a.base, b.base}
	resp := c.do("POST", a.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
		"title": "priced", "face_value": 1000, "price": price, "stock": lifeStock, "buckets": buckets,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if resp.status != http.StatusCreated {
		t.Fatalf("create priced voucher of %d buckets: %+v", buckets, resp)
	}
	vid := resp.order
	s := newSale()
	won := c.stampede(s, bases, vid, 10_000, lifeBuyers)
	if len(won) != lifeStock {
		t.Fatalf("%d winners of %d units; answers %v", len(won), lifeStock, s.codes)
	}
	payers, unpaid := split(won)
	c.waitStates(vid, map[string]int{"awaiting_payment": lifeStock}, 20*time.Second)
	cancelled := 0
	for u, id := range unpaid {
		if cancelled == 5 {
			break
		}
		if a := c.do("POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", bases[cancelled%2], id), token(t, u, auth.RoleUser), nil); a.status != http.StatusOK {
			t.Fatalf("buyer %d cancels order %d: %+v", u, id, a)
		}
		cancelled++
	}
	c.pay(bases, payers)
	c.waitStates(vid, map[string]int{"expired": len(unpaid) - cancelled, "paid": len(payers), "awaiting_payment": 0}, lifeSettle)
	c.waitOnSale(bases, vid, len(unpaid), 20*time.Second)
	again := c.stampede(s, bases, vid, 20_000, lifeBuyers)
	if len(again) != len(unpaid) {
		t.Fatalf("second stampede: %d winners, want the %d units given back; answers %v", len(again), len(unpaid), s.codes)
	}
	homes := make([]int, buckets)
	for u := range again {
		homes[voucher.Home(u, buckets)]++
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": len(again)}, 20*time.Second)
	c.pay(bases, again)
	rep := c.settle(s, vid, lifeSettle)
	if rep.Live != lifeStock || rep.ByState["paid"] != lifeStock {
		t.Fatalf("final orders: %s; want %d live and paid", rep, lifeStock)
	}
	t.Logf("%d cancelled and %d expired units resold to buyers at home in buckets %v; checked I1-I10: %s", cancelled, len(unpaid)-cancelled, homes, rep)
}

// fenceOf is the rebuild fence on bucket b: "<nb>:<token>" of the rebuild
// holding it, "" when none.
func (w *bucketSale) fenceOf(b int) string {
	fences, err := bucket.Fences(context.Background(), w.crdb, w.keys, w.v, buckets)
	if err != nil {
		w.t.Fatal(err)
	}
	return fences[b]
}

// A rebuild stalls past its leases: the instance rebuilding a bucket whose
// master restarted stops (SIGSTOP, as a paused machine would) after
// writing the bucket and before reopening its shard. The other instance
// takes the rebuild over once the leases lapse, and the stalled one
// resumes while the newer rebuild counts the buckets, then both sell on,
// with units moving between the buckets. The stalled rebuild makes
// nothing live and lifts none of the newer one's fences: every unit is
// sold once, none is lost, and I1-I7 hold.
func TestClusterStalledRebuildTakenOver(t *testing.T) {
	const stock, rebuilt = 1500, 2
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1, AppendOnly: true},
		map[string]string{"SECKILL_REBUILD_LEASE": "1s"})
	a := w.run("a", map[string]string{"SECKILL_CRASH_POINT": "stop_after_bucket_rebuild"})
	b := w.run("b", nil)
	w.create(b.base, stock)
	// Skewed buyers: units move to bucket 0 from the others.
	w.fire(buyersFrom(10_000, stock/3, 0.6), []string{a.base, b.base}, 16).wait(t)
	// b pauses, so that a rebuilds the bucket whose master restarts (its
	// data kept, but another master identity: the shard is rebuilt).
	b.pause(t)
	victim := w.master(rebuilt)
	victim.Kill(t)
	victim.Restart(t)
	w.rc.WaitHealthy(t, time.Minute)
	testenv.WaitFor(t, time.Minute, "instance a stopped in its rebuild", a.stopped)
	stale := w.fenceOf(rebuilt)
	if stale == "" {
		t.Fatalf("no fence on bucket %d, which a was rebuilding", rebuilt)
	}
	b.resume(t)
	// b's rebuild (or its recovery loop, lifting a fence whose lease is
	// gone) takes a's fence over: a's guard no longer holds.
	testenv.WaitFor(t, time.Minute, "instance a's fence taken over", func() bool { return w.fenceOf(rebuilt) != stale })
	// a wakes with its fence gone (b may still be counting, or done).
	a.resume(t)
	w.fire(buyersFrom(20_000, stock, 0.6), []string{a.base, b.base}, 32).wait(t)
	// The load may end before b's rebuild does: the rest is sold once
	// bucket 2 sells again and nothing is in transit.
	w.recovered(rebuilt, time.Minute)
	testenv.WaitFor(t, 30*time.Second, "no transfer open", func() bool { return w.inTransit() == 0 })
	w.fire(buyersFrom(40_000, 2*stock, 0.3), []string{a.base, b.base}, 32).wait(t)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("lost accepted orders %v", lost)
	}
	if rep.Live != stock {
		t.Fatalf("%d units sold of %d; answers by home %s", rep.Live, stock, w.answers())
	}
	// a finds its rebuild taken over when its resumed steps fail: on a
	// connection to the restarted master that can take a read timeout or
	// two, so it may come after the sale settled (it did once, in a full
	// run that settled in 12s; in a loaded full run it had not within 30 s
	// of the settle). Its log is printed when the test fails.
	testenv.WaitFor(t, 90*time.Second, "instance a to find its rebuild taken over (shard rebuild outlived its lease)", func() bool {
		return strings.Contains(a.log.String(), "shard rebuild outlived its lease")
	})
	t.Logf("answers by home bucket %s; checked I1-I7: %s", w.answers(), rep)
}

// A bucket's master is killed for good in a sale confirmed by replicas
// (WAIT 1): its replica takes over and has no replica of its own. It
// confirms purchases and transfers alone (the replica-less policy of
// redisconn.Replicas), so its units keep moving to the buckets whose
// buyers come and the voucher sells out; without that policy every
// transfer out of it failed its WAIT (531-592 of 600 units sold in two
// minutes on 3e46bea, as the issue measured; 431 in one run of this test
// with the policy turned off by hand). No accepted order is lost; Redis and MySQL agree.
func TestClusterMasterLostForGood(t *testing.T) {
	const stock, killed = 600, 1
	w, a, b := replicatedSale(t, stock, nil)
	// A first wave, skewed to bucket 0, so units move before the kill.
	w.fire(buyersFrom(110_000, stock/3, 0.8), []string{a.base, b.base}, 16).wait(t)
	victim := w.master(killed)
	victim.Kill(t)
	w.rc.WaitFailover(t, victim, time.Minute)
	failedOver := time.Now()
	// Demand three times what is left, skewed away from the lost master's
	// bucket: its units must move to be sold.
	w.fire(buyersFrom(120_000, 3*stock, 0.6), []string{a.base, b.base}, 32).wait(t)
	// The burst can end before the failed-over bucket's rebuild does: the
	// rest is sold once it answers again and nothing is in transit.
	w.recovered(killed, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "no transfer open", func() bool { return w.inTransit() == 0 })
	w.fire(buyersFrom(140_000, stock, 0), []string{a.base, b.base}, 16).wait(t)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("%d orders confirmed by a replica were lost: %v", len(lost), lost)
	}
	if rep.Live != stock {
		t.Fatalf("%d units sold of %d after the master was lost; answers by home %s", rep.Live, stock, w.answers())
	}
	w.mu.Lock()
	last := w.lastSale.Sub(failedOver)
	w.mu.Unlock()
	if last > 30*time.Second {
		t.Errorf("the last unit sold %s after the failover, want within 30s", last.Round(time.Millisecond))
	}
	alone := w.counter(a, "seckill_redis_writes_without_replica_total") + w.counter(b, "seckill_redis_writes_without_replica_total")
	if alone == 0 {
		t.Error("no write was confirmed by the master alone: the policy did not run")
	}
	t.Logf("last unit sold %s after the failover; %.0f writes confirmed by the lone master; answers by home bucket %s; checked I1-I7: %s",
		last.Round(time.Millisecond), alone, w.answers(), rep)
}

// sellsWithin presses fresh buyers of bucket b (from first on) at the
// instances until one is accepted, and returns how long that took, or
// fails past within.
func (w *bucketSale) sellsWithin(b int, first int64, within time.Duration) time.Duration {
	w.t.Helper()
	began := time.Now()
	var bases []string
	for _, in := range w.insts {
		bases = append(bases, in.base)
	}
	users := homeOnly(b, first, 2000)
	i := 0
	testenv.WaitFor(w.t, within, fmt.Sprintf("a buyer of bucket %d accepted", b), func() bool {
		u := users[i%len(users)]
		i++
		return w.press(bases[i%len(bases)], u, token(w.t, u, auth.RoleUser)).status == http.StatusAccepted
	})
	return time.Since(began)
}

// The masters of two buckets are killed one after the other, each
// failing over to its replica (WAIT 1), the first one's promoted replica
// left without a replica of its own: after each failover every bucket
// sells again within 5 s (the issue measured 20 s with nothing sold on
// 3e46bea; this test there: bucket 0 sold nothing within 5 s), and no
// accepted order is lost.
func TestClusterTwoMastersLostInTurn(t *testing.T) {
	const stock = 3000
	w, a, b := replicatedSale(t, stock, nil)
	w.fire(buyersFrom(200_000, stock/5, 0.8), []string{a.base, b.base}, 16).wait(t)
	var report []string
	for i, killed := range []int{0, 1} {
		// Units move while the master dies.
		load := w.fire(buyersFrom(int64(300_000+100_000*i), stock/5, 0.8), []string{a.base, b.base}, 8)
		victim := w.master(killed)
		victim.Kill(t)
		w.rc.WaitFailover(t, victim, time.Minute)
		for bk := range buckets {
			d := w.sellsWithin(bk, int64(500_000+100_000*i+10_000*bk), 5*time.Second)
			report = append(report, fmt.Sprintf("after master of bucket %d: bucket %d sold again in %s", killed, bk, d.Round(time.Millisecond)))
		}
		load.wait(t)
	}
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("%d orders confirmed by a replica were lost: %v", len(lost), lost)
	}
	t.Logf("%s; answers by home bucket %s; checked I1-I7: %s", strings.Join(report, "; "), w.answers(), rep)
}

// counter reads a counter's value from an instance's /metrics (0 when
// absent).
func (w *bucketSale) counter(in *instance, name string) float64 {
	w.t.Helper()
	return readCounter(w.t, w.http, in.base, name)
}
