package fault

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/db"
	"seckill/internal/mq"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	"seckill/internal/voucher"
)

// The lifecycle scenarios sell a priced voucher: winners owe price cents
// within the pay window (seconds here), or their orders expire and the
// units go back on sale.
const (
	price         = 500
	expiryGroup   = "expirers" // the expiry streams' consumer group
	sweepInterval = time.Second
)

// lifecycleSettings are the pay settings of a scenario: the pay window,
// a sweeper every second, and the dev provider (paying succeeds at once).
func lifecycleSettings(window time.Duration) map[string]string {
	return map[string]string{
		"SECKILL_PAY_WINDOW": window.String(), "SECKILL_EXPIRY_SWEEP": sweepInterval.String(),
		"SECKILL_PAY_PROVIDER": "dev",
	}
}

// withLifecycle adds the pay settings to what every instance of c gets.
func (c *cluster) withLifecycle(window time.Duration) {
	for k, v := range lifecycleSettings(window) {
		c.env[k] = v
	}
}

// newEmbedded is a scenario in the embedded mode: no Redis or database
// server; the one instance runs an in-process Redis on a port the test
// knows and an SQLite file in its data dir. The Redis client and the
// database are opened by startEmbedded, once the instance runs.
func newEmbedded(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{t: t, prefix: "seckill", keys: voucher.NewKeys("seckill", 1)}
	dir := t.TempDir()
	c.env = settings("", "")
	c.env["SECKILL_DATA_DIR"] = dir
	c.env["SECKILL_EMBEDDED_REDIS_ADDR"] = "127.0.0.1:" + testenv.FreePort(t)
	c.dsn = filepath.Join(dir, "seckill.db")
	c.http = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	return c
}

// startEmbedded starts the embedded instance of c and opens its Redis and
// SQLite file for the checks.
func (c *cluster) startEmbedded(name string) *instance {
	c.t.Helper()
	in := c.start(name, nil)
	c.rdb = redis.NewClient(&redis.Options{Addr: c.env["SECKILL_EMBEDDED_REDIS_ADDR"], MaxRetries: 0})
	c.t.Cleanup(func() { c.rdb.Close() })
	g, err := db.OpenSQLite(c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { db.Close(g) })
	c.db = g
	return in
}

// createPriced creates a voucher on sale now whose orders owe price.
func (c *cluster) createPriced(base string, stock int) int64 {
	c.t.Helper()
	a := c.do("POST", base+"/api/v1/vouchers", token(c.t, 1, auth.RoleAdmin), map[string]any{
		"title": "priced", "face_value": 1000, "price": price, "stock": stock,
		"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
	})
	if a.status != http.StatusCreated {
		c.t.Fatalf("create priced voucher: %+v", a)
	}
	return a.order
}

// stampede releases buyers first .. first+n-1 at once on the voucher, one
// press each, through bases in turn, records their answers in s and
// returns the winners: buyer -> order id.
func (c *cluster) stampede(s *sale, bases []string, voucherID, first int64, n int) map[int64]int64 {
	c.t.Helper()
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = token(c.t, first+int64(i), auth.RoleUser)
	}
	start := make(chan struct{})
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		won = map[int64]int64{}
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			u := first + int64(i)
			a := c.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", bases[i%len(bases)], voucherID), tokens[i], nil)
			s.record(u, a)
			if a.status == http.StatusAccepted {
				mu.Lock()
				won[u] = a.order
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	return won
}

// split divides the winners, by buyer id, into the first half and the
// rest.
func split(won map[int64]int64) (first, rest map[int64]int64) {
	buyers := make([]int64, 0, len(won))
	for u := range won {
		buyers = append(buyers, u)
	}
	slices.Sort(buyers)
	first, rest = map[int64]int64{}, map[int64]int64{}
	for i, u := range buyers {
		if i < len(buyers)/2 {
			first[u] = won[u]
		} else {
			rest[u] = won[u]
		}
	}
	return first, rest
}

// pay has each buyer pay their order through bases in turn; with the dev
// provider each is paid at once.
func (c *cluster) pay(bases []string, buyers map[int64]int64) {
	c.t.Helper()
	i := 0
	for u, id := range buyers {
		a := c.do("POST", fmt.Sprintf("%s/api/v1/orders/%d/pay", bases[i%len(bases)], id), token(c.t, u, auth.RoleUser), nil)
		if a.status != http.StatusOK {
			c.t.Fatalf("buyer %d pays order %d: %+v, want 200", u, id, a)
		}
		i++
	}
}

// states counts the voucher's orders in the database by state, and the
// expired ones under "expired".
func (c *cluster) states(voucherID int64) map[string]int {
	c.t.Helper()
	var rows []struct {
		Status       string
		CancelReason string
		N            int
	}
	if err := c.openDB().Raw("SELECT status, COALESCE(cancel_reason, '') AS cancel_reason, COUNT(*) AS n FROM orders WHERE voucher_id = ? GROUP BY status, cancel_reason", voucherID).Scan(&rows).Error; err != nil {
		c.t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.Status] += r.N
		if r.CancelReason == "expired" {
			out["expired"] += r.N
		}
	}
	return out
}

// waitStates waits until the voucher's orders are counted by state as
// want says (states absent from want are not looked at).
func (c *cluster) waitStates(voucherID int64, want map[string]int, within time.Duration) {
	c.t.Helper()
	var got map[string]int
	deadline := time.Now().Add(within)
	for {
		got = c.states(voucherID)
		ok := true
		for st, n := range want {
			ok = ok && got[st] == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("orders by state %v, want %v within %s", got, want, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitOnSale waits until every base shows n units of the voucher on sale,
// counted live in Redis, with the shard's state loaded (its ready marker
// set, no rebuild running).
func (c *cluster) waitOnSale(bases []string, voucherID int64, n int, within time.Duration) {
	c.t.Helper()
	var last string
	deadline := time.Now().Add(within)
	for !c.onSale(bases, voucherID, n, &last) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d units of voucher %d not on sale within %s; last seen: %s", n, voucherID, within, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// onSale reports whether every base shows n units on sale, live, with
// the shard ready; last says what was seen.
func (c *cluster) onSale(bases []string, voucherID int64, n int, last *string) bool {
	ctx := context.Background()
	shard := c.keys.Shard(voucherID)
	ready, err1 := c.rdb.Exists(ctx, c.keys.Ready(shard)).Result()
	rebuilding, err2 := c.rdb.Exists(ctx, c.keys.Rebuilding(shard)).Result()
	if err := cmp.Or(err1, err2); err != nil || ready != 1 || rebuilding != 0 {
		*last = fmt.Sprintf("shard ready=%d rebuilding=%d (%v)", ready, rebuilding, err)
		return false
	}
	for _, base := range bases {
		resp, err := c.http.Get(fmt.Sprintf("%s/api/v1/vouchers/%d", base, voucherID))
		if err != nil {
			*last = err.Error()
			return false
		}
		var v struct {
			Stock     int64 `json:"stock"`
			StockLive bool  `json:"stock_live"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		*last = fmt.Sprintf("%s: %+v (%v)", base, v, err)
		if err != nil || !v.StockLive || v.Stock != int64(n) {
			return false
		}
	}
	return true
}

// expiryKeys are the shard's expiry stream and its delay queue of pay
// deadlines.
func (c *cluster) expiryKeys(voucherID int64) (stream, due string) {
	tag := c.keys.Tag(c.keys.Shard(voucherID))
	return tag + ":expiries", tag + ":expiries:due"
}

// expiriesLeft says what is left of the shard's expiries: a reason when
// something is (entries pending in the expirers' group or left in the
// stream, deadlines waiting in the delay queue), "" when they drained.
func (c *cluster) expiriesLeft(voucherID int64) string {
	ctx := context.Background()
	stream, due := c.expiryKeys(voucherID)
	var left []string
	p, err := c.rdb.XPending(ctx, stream, expiryGroup).Result()
	switch {
	case mq.IsNoGroup(err):
		left = append(left, "no group "+expiryGroup+" on "+stream)
	case err != nil:
		left = append(left, "read expiry pending: "+err.Error())
	case p.Count != 0:
		left = append(left, fmt.Sprintf("%d expiries pending in %s", p.Count, expiryGroup))
	}
	if n, err := c.rdb.XLen(ctx, stream).Result(); err != nil || n != 0 {
		left = append(left, fmt.Sprintf("expiry stream length %d (%v)", n, err))
	}
	if n, err := c.rdb.ZCard(ctx, due).Result(); err != nil || n != 0 {
		left = append(left, fmt.Sprintf("%d deadlines in the expiry delay queue (%v)", n, err))
	}
	return strings.Join(left, "; ")
}

// settle waits until every invariant holds (the order pipeline drained,
// the lifecycle's invariants included) and the expiries drained too, and
// returns the report; the scenario fails with the last report otherwise.
func (c *cluster) settle(s *sale, voucherID int64, within time.Duration) verify.Report {
	c.t.Helper()
	g := c.openDB()
	var (
		rep  verify.Report
		err  error
		left string
	)
	deadline := time.Now().Add(within)
	for {
		rep, err = verify.Check(context.Background(), g, c.rdb, c.keys, s.input(voucherID))
		left = c.expiriesLeft(voucherID)
		if err == nil && rep.OK() && left == "" {
			return rep
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the sale did not settle within %s (check error %v; expiries: %s):\n%s", within, err, cmp.Or(left, "drained"), rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expiryHolders counts, by instance, the expiries pending with its
// expirer (consumer names carry the process id).
func (c *cluster) expiryHolders(voucherID int64, ins ...*instance) map[*instance]int64 {
	stream, _ := c.expiryKeys(voucherID)
	cs, err := c.rdb.XInfoConsumers(context.Background(), stream, expiryGroup).Result()
	out := map[*instance]int64{}
	if err != nil {
		return out
	}
	for _, x := range cs {
		for _, in := range ins {
			if strings.Contains(x.Name, fmt.Sprintf("-%d-", in.cmd.Process.Pid)) && x.Pending > 0 {
				out[in] += x.Pending
			}
		}
	}
	return out
}
