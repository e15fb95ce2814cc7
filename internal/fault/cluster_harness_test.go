package fault

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

// shards is the number of order shards of a sale on a Redis Cluster: one
// per master.
const shards = 3

// clusterSale is a scenario on a Redis Cluster of three masters with a
// replica each: the harness's MariaDB, settings and HTTP client, the
// cluster, two service instances, and one voucher on each shard with
// what its buyers were told.
type clusterSale struct {
	*cluster
	rc       *testenv.Cluster
	crdb     *redis.ClusterClient
	insts    []*instance
	bases    []string
	vouchers [shards]int64 // vouchers[shard]
	sales    [shards]*sale // sales[shard]
}

// newClusterSale starts the cluster (a short node timeout: a failover
// takes seconds), MariaDB and two instances with extra settings, and
// creates a voucher of stock units on each shard.
func newClusterSale(t *testing.T, stock int, extra map[string]string) *clusterSale {
	t.Helper()
	rc := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second})
	c := &cluster{t: t, prefix: "seckill"}
	c.maria = testenv.StartMariaDB(t)
	c.dsn = c.maria.CreateDatabase(t)
	c.keys = voucher.KeysFor(c.prefix, shards, true)
	c.env = settings(rc.URL(), c.dsn)
	c.env["SECKILL_SHARDS"] = strconv.Itoa(shards)
	for k, v := range extra {
		c.env[k] = v
	}
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	w := &clusterSale{cluster: c, rc: rc, crdb: rc.Client(t)}
	for _, name := range []string{"a", "b"} {
		in := c.start(name, nil)
		w.insts = append(w.insts, in)
		w.bases = append(w.bases, in.base)
	}
	// Ids come in order, so a few vouchers cover every shard.
	for have := 0; have < shards; {
		id := c.createVoucher(w.bases[0], stock)
		if s := c.keys.Shard(id); w.vouchers[s] == 0 {
			w.vouchers[s], w.sales[s] = id, newSale()
			have++
		}
	}
	return w
}

// master returns the node serving shard's keys now.
func (w *clusterSale) master(shard int) *testenv.ClusterNode {
	w.t.Helper()
	return w.rc.MasterOf(w.t, w.keys.Stream(shard))
}

// purchase buys shard's voucher for user at base and records the answer.
func (w *clusterSale) purchase(base string, shard int, user int64, tok string) answer {
	a := w.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, w.vouchers[shard]), tok, nil)
	w.sales[shard].record(user, a)
	return a
}

// run is a burst under way.
type run struct {
	answered atomic.Int64 // purchases answered so far
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// halt lets the burst end once n purchases were sent.
func (r *run) halt() { r.stopOnce.Do(func() { close(r.stop) }) }

// burst starts sending at least n purchases, 32 at a time, at the
// instances in turn: purchase i buys the voucher of shard i%3 for user
// 1000+(i/3)%users, so every buyer presses once per voucher per round. It
// goes on past n until finish is called: a fault and its healing happen
// while purchases go on.
func (w *clusterSale) burst(users, n int) *run {
	w.t.Helper()
	tokens := make([]string, users)
	for i := range tokens {
		tokens[i] = token(w.t, int64(1000+i), auth.RoleUser)
	}
	r := &run{stop: make(chan struct{}), done: make(chan struct{})}
	// A scenario that fails half-way lets its burst end at n.
	w.t.Cleanup(r.halt)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				u := (i / shards) % users
				w.purchase(w.bases[i%len(w.bases)], i%shards, int64(1000+u), tokens[u])
				r.answered.Add(1)
			}
		}()
	}
	go func() {
		defer close(r.done)
		for i := 0; ; i++ {
			if i >= n {
				select {
				case <-r.stop:
					close(jobs)
					wg.Wait()
					return
				default:
				}
			}
			jobs <- i
		}
	}()
	return r
}

// reach waits until at least k purchases of the burst were answered.
func (r *run) reach(t *testing.T, k int64) {
	t.Helper()
	testenv.WaitFor(t, 60*time.Second, fmt.Sprintf("%d purchases answered", k), func() bool { return r.answered.Load() >= k })
}

// finish ends the burst once n purchases were sent, and waits for the
// answers of those sent.
func (r *run) finish(t *testing.T) {
	t.Helper()
	r.halt()
	select {
	case <-r.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the burst did not end within 2m")
	}
}

// recovered waits until a purchase of shard's voucher gets a definite
// answer again (accepted, already purchased or sold out: the purchase
// script ran), at each instance in turn, and returns how long that took.
func (w *clusterSale) recovered(shard int, within time.Duration) time.Duration {
	w.t.Helper()
	began := time.Now()
	const probe = 900_000
	tok := token(w.t, probe, auth.RoleUser)
	tries := 0
	seen := map[string]int{} // the probe's answers, for a failure
	w.t.Cleanup(func() {
		if w.t.Failed() {
			w.t.Logf("probe purchases of shard %d: %v", shard, seen)
		}
	})
	testenv.WaitFor(w.t, within, fmt.Sprintf("a definite answer to a purchase on shard %d", shard), func() bool {
		tries++
		a := w.purchase(w.bases[tries%len(w.bases)], shard, probe, tok)
		seen[fmt.Sprintf("%d %s %v", a.status, a.code, a.err)]++
		return a.err == nil && a.status < 500
	})
	return time.Since(began)
}

// settled is one voucher's end state.
type settled struct {
	rep  verify.Report
	lost []int64 // accepted order ids that ended as neither order nor dead letter
}

// settle waits until the pipeline of every voucher drained and every
// invariant holds, I3 aside for accepted orders that ended as neither an
// order nor a dead letter: those are lost, and returned for the caller to
// judge. An order is only known lost once its shard drained (I6: nothing
// left in the stream, the group's pending list, the delay queue, the
// pending-order index), so lost ones are counted again after the check
// and must not have changed.
func (w *clusterSale) settle(within time.Duration) [shards]settled {
	w.t.Helper()
	g := w.openDB()
	ctx := context.Background()
	var out [shards]settled
	var last string
	deadline := time.Now().Add(within)
	for {
		ok := true
		for s := range shards {
			lost, err := w.lost(ctx, s)
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			in := w.sales[s].input(w.vouchers[s])
			for _, id := range lost {
				delete(in.Accepted, id)
			}
			rep, err := verify.Check(ctx, g, w.crdb, w.keys, in)
			if err != nil || !rep.OK() {
				ok, last = false, fmt.Sprintf("shard %d voucher %d (check error %v): %s", s, w.vouchers[s], err, rep)
				break
			}
			if again, err := w.lost(ctx, s); err != nil || !slices.Equal(again, lost) {
				ok, last = false, fmt.Sprintf("shard %d: lost orders changed while checking", s)
				break
			}
			out[s] = settled{rep: rep, lost: lost}
		}
		if ok {
			return out
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("pipeline did not settle within %s:\n%s", within, last)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// lost lists, sorted, the accepted orders of shard's voucher that are
// neither an order nor a dead letter now.
func (w *clusterSale) lost(ctx context.Context, shard int) ([]int64, error) {
	vid := w.vouchers[shard]
	var ended []int64
	err := w.openDB().WithContext(ctx).Raw("SELECT id FROM orders WHERE voucher_id = ? UNION SELECT order_id FROM dead_letters WHERE voucher_id = ?", vid, vid).Scan(&ended).Error
	if err != nil {
		return nil, fmt.Errorf("read ended orders: %w", err)
	}
	done := make(map[int64]bool, len(ended))
	for _, id := range ended {
		done[id] = true
	}
	s := w.sales[shard]
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

// rebuildLine is one shard's rebuild counter in /metrics, labels in any
// order.
var rebuildLine = regexp.MustCompile(`^seckill_shard_rebuilds_total\{([^}]*)\} (\d+)`)

// rebuilds sums, over the instances, the shard rebuilds for reason by
// shard, from their /metrics.
func (w *clusterSale) rebuilds(reason string) [shards]int {
	w.t.Helper()
	var out [shards]int
	for _, in := range w.insts {
		resp, err := w.http.Get(in.base + "/metrics")
		if err != nil {
			w.t.Fatalf("metrics of %s: %v", in.name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			w.t.Fatalf("metrics of %s: status %d, %v", in.name, resp.StatusCode, err)
		}
		for line := range strings.Lines(string(body)) {
			m := rebuildLine.FindStringSubmatch(line)
			if m == nil || !strings.Contains(m[1], `reason="`+reason+`"`) {
				continue
			}
			for s := range shards {
				if strings.Contains(m[1], fmt.Sprintf(`shard="%d"`, s)) {
					n, _ := strconv.Atoi(m[2])
					out[s] += n
				}
			}
		}
	}
	return out
}

// codes is the answers of shard's voucher, by code.
func (w *clusterSale) codes(shard int) string {
	s := w.sales[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.codes)
}

// unanswered counts the purchases of shard's voucher answered 503 (not
// ready, unavailable, not replicated): neither sold nor refused.
func (w *clusterSale) unanswered(shard int) int {
	s := w.sales[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.codes["not_ready"] + s.codes["unavailable"] + s.codes["not_replicated"]
}

// accepted counts the accepted orders of shard's voucher.
func (w *clusterSale) accepted(shard int) int {
	s := w.sales[shard]
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.accepted)
}

// replicaOf returns the node replicating master.
func (w *clusterSale) replicaOf(master *testenv.ClusterNode) *testenv.ClusterNode {
	w.t.Helper()
	return w.rc.ReplicaOf(w.t, master)
}
