package voucher

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/testenv"
)

// confirmWithin is the wait of a purchase the replica should confirm: long,
// so a busy machine does not fail the test (a paused replica is given
// 200ms).
const confirmWithin = 5 * time.Second

// replicated is a master with one replica, both owned by the test.
type replicated struct {
	master, replica *testenv.RedisServer
	rdb             *redis.Client // of the master
	keys            Keys
	state           *State
}

// startReplicated starts a master and a replica of it, and waits until the
// replica has synced.
func startReplicated(t testing.TB) replicated {
	t.Helper()
	// The master sends its first sync at once, not after the default 5s.
	master := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--repl-diskless-sync-delay", "0"}})
	_, port, _ := strings.Cut(master.Addr, ":")
	replica := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--replicaof", "127.0.0.1", port}})
	rc := replica.Client(t)
	testenv.WaitFor(t, 10*time.Second, "the replica in sync with its master", func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	rdb := master.Client(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	return replicated{master: master, replica: replica, rdb: rdb, keys: keys, state: NewState(rdb, keys)}
}

// onSale loads a voucher with stock units on sale now and marks its shard
// ready.
func (e replicated) onSale(t testing.TB, id int64, stock int) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	v := Voucher{ID: id, Stock: stock, TotalStock: stock, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
	if _, err := e.state.Load(ctx, v, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.state.MarkReady(ctx, e.keys.Shard(id)); err != nil {
		t.Fatal(err)
	}
}

// pause stops the replica (SIGSTOP) until the test ends: it stays
// connected, and confirms nothing.
func (e replicated) pause(t testing.TB) {
	t.Helper()
	e.replica.Pause(t)
	t.Cleanup(func() { e.replica.Resume(t) })
}

// onReplica reads, from the replica, the order id it holds for the buyer.
func (e replicated) onReplica(t testing.TB, voucherID, userID int64) string {
	t.Helper()
	c := e.replica.Client(t)
	got, err := c.HGet(context.Background(), e.keys.Buyers(voucherID), strconv.FormatInt(userID, 10)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	return got
}

// waitCalls is how many WAIT commands the server has run.
func waitCalls(t testing.TB, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_wait:calls="); ok {
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			if err != nil {
				t.Fatalf("commandstats line %q: %v", line, err)
			}
			return n
		}
	}
	return 0
}

// TestWaitReplicasAccepted: a purchase that waits for one replica is on the
// replica when Reserve returns, read at once; a retry with the same order
// id replays it, confirmed as well.
func TestWaitReplicasAccepted(t *testing.T) {
	t.Parallel()
	e := startReplicated(t)
	e.onSale(t, 1, 5)
	ctx := context.Background()
	res := NewReserver(e.rdb, e.keys, WaitReplicas(1, confirmWithin))
	for i := range int64(3) {
		r, err := res.Reserve(ctx, 1, 10+i, 100+i)
		if err != nil || r.OrderID != 100+i || r.Replayed {
			t.Fatalf("purchase %d: %+v, %v", i, r, err)
		}
		if got := e.onReplica(t, 1, 10+i); got != strconv.FormatInt(100+i, 10) {
			t.Fatalf("purchase %d: the replica holds order %q for the buyer when Reserve returns, want %d", i, got, 100+i)
		}
	}
	r, err := res.Reserve(ctx, 1, 10, 100)
	if err != nil || !r.Replayed || r.OrderID != 100 {
		t.Fatalf("replayed purchase: %+v, %v", r, err)
	}
}

// TestWaitReplicasPausedReplica: with the replica paused, an accepted
// purchase is not reported accepted: Reserve returns ErrNotReplicated once
// the wait is over, and the purchase route answers 503 not_replicated.
func TestWaitReplicasPausedReplica(t *testing.T) {
	t.Parallel()
	e := startReplicated(t)
	e.onSale(t, 1, 5)
	e.pause(t)
	ctx := context.Background()
	res := NewReserver(e.rdb, e.keys, WaitReplicas(1, 200*time.Millisecond))

	_, err := res.Reserve(ctx, 1, 10, 100)
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("err = %v, want ErrNotReplicated", err)
	}
	// The master did take it: the buyer holds the order there.
	if got, _ := e.rdb.HGet(ctx, e.keys.Buyers(1), "10").Result(); got != "100" {
		t.Fatalf("the master holds order %q for the buyer, want 100", got)
	}

	code, body := purchaseOver(t, res, 1, 11)
	if code != http.StatusServiceUnavailable || body.Code != "not_replicated" {
		t.Fatalf("purchase route: %d %+v, want 503 not_replicated", code, body)
	}
	// The answer names the order the master holds for the buyer, so that
	// the buyer can look it up.
	held, _ := e.rdb.HGet(ctx, e.keys.Buyers(1), "11").Result()
	if held == "" || body.OrderID != held {
		t.Fatalf("not_replicated names order %q; the master holds %q for the buyer", body.OrderID, held)
	}
}

// TestWaitReplicasRefusalDoesNotWait: a refused purchase (sold out) wrote
// nothing, so it is answered as sold out at once, with the replica paused
// and a wait of 30s: no WAIT follows it. (A WAIT pipelined behind it would
// wait for the connection's earlier writes, and the GETACK of its previous
// WAIT, which the paused replica never confirms.)
func TestWaitReplicasRefusalDoesNotWait(t *testing.T) {
	t.Parallel()
	e := startReplicated(t)
	e.onSale(t, 1, 1)
	ctx := context.Background()
	if _, err := NewReserver(e.rdb, e.keys, WaitReplicas(1, confirmWithin)).Reserve(ctx, 1, 10, 100); err != nil {
		t.Fatal(err)
	}
	e.pause(t)
	const wait = 30 * time.Second
	res := NewReserver(e.rdb, e.keys, WaitReplicas(1, wait))
	began := time.Now()
	if _, err := res.Reserve(ctx, 1, 11, 101); !errors.Is(err, ErrSoldOut) {
		t.Fatalf("err = %v, want ErrSoldOut", err)
	}
	if took := time.Since(began); took >= wait {
		t.Fatalf("the refusal took %s: it waited for the replica", took)
	}
	code, body := purchaseOver(t, res, 1, 12)
	if code != http.StatusConflict || body.Code != "sold_out" {
		t.Fatalf("purchase route: %d %+v, want 409 sold_out", code, body)
	}
}

// TestWaitReplicasNoScript: a master that lost its script cache (restart,
// failover, SCRIPT FLUSH) still runs the purchase and confirms it.
func TestWaitReplicasNoScript(t *testing.T) {
	t.Parallel()
	e := startReplicated(t)
	e.onSale(t, 1, 5)
	ctx := context.Background()
	res := NewReserver(e.rdb, e.keys, WaitReplicas(1, confirmWithin))
	for i := range int64(2) {
		if err := e.rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := res.Reserve(ctx, 1, 10+i, 100+i); err != nil {
			t.Fatalf("purchase %d after SCRIPT FLUSH: %v", i, err)
		}
		if got := e.onReplica(t, 1, 10+i); got != strconv.FormatInt(100+i, 10) {
			t.Fatalf("purchase %d: the replica holds order %q for the buyer, want %d", i, got, 100+i)
		}
	}
}

// TestWaitReplicasOff: WaitReplicas(0, ...) and no option send no WAIT;
// WaitReplicas(1, ...) on a master without replica sends one and reports
// the purchase not replicated.
func TestWaitReplicasOff(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	e := replicated{rdb: rdb, keys: keys, state: NewState(rdb, keys)}
	e.onSale(t, 1, 5)
	ctx := context.Background()
	for i, res := range []*Reserver{NewReserver(rdb, keys), NewReserver(rdb, keys, WaitReplicas(0, time.Second))} {
		if _, err := res.Reserve(ctx, 1, int64(10+i), int64(100+i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := waitCalls(t, rdb); n != 0 {
		t.Fatalf("WAIT ran %d times with the wait off", n)
	}
	_, err := NewReserver(rdb, keys, WaitReplicas(1, 20*time.Millisecond)).Reserve(ctx, 1, 12, 102)
	if !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("no replica: err = %v, want ErrNotReplicated", err)
	}
	if n := waitCalls(t, rdb); n != 1 {
		t.Fatalf("WAIT ran %d times with the wait on, want 1", n)
	}
}

// TestWaitReplicasRefusesMisuse: a wait that cannot work panics when the
// Reserver is built, not on the first purchase.
func TestWaitReplicasRefusesMisuse(t *testing.T) {
	t.Parallel()
	keys := NewKeys("misuse", 1)
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = client.Close() })
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	for name, build := range map[string]func(){
		"negative":   func() { NewReserver(client, keys, WaitReplicas(-1, time.Millisecond)) },
		"no timeout": func() { NewReserver(client, keys, WaitReplicas(1, 0)) },
		"under 1ms":  func() { NewReserver(client, keys, WaitReplicas(1, time.Microsecond)) },
		"ring":       func() { NewReserver(ring, keys, WaitReplicas(1, time.Millisecond)) },
	} {
		if !panics(build) {
			t.Errorf("%s: no panic", name)
		}
	}
	if panics(func() { NewReserver(client, keys, WaitReplicas(1, 100*time.Millisecond)) }) {
		t.Error("a valid wait panics")
	}
}

func panics(f func()) (did bool) {
	defer func() { did = recover() != nil }()
	f()
	return false
}

// purchaseOver sends one purchase of the voucher by the user through the
// purchase route (token check and handler) and returns the status and the
// error body, if any.
func purchaseOver(t testing.TB, res *Reserver, voucherID, userID int64) (int, errorBody) {
	t.Helper()
	signer, err := auth.NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := signer.Mint(auth.Identity{UserID: userID, Role: auth.RoleUser}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	h := NewHTTP(NewStore(nil), nil, res, &counter{next: 1 << 40}, log)
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.POST("/api/v1/vouchers/:id/orders", signer.Middleware(), h.Purchase)
	req := httptest.NewRequest(http.MethodPost, "/api/v1/vouchers/"+strconv.FormatInt(voucherID, 10)+"/orders", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	var body errorBody
	if w.Code >= 400 {
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%d %s: %v", w.Code, w.Body, err)
		}
	}
	return w.Code, body
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	OrderID string `json:"order_id"`
}

// counter hands out order ids in sequence.
type counter struct{ next int64 }

func (c *counter) Next() (int64, error) { return atomic.AddInt64(&c.next, 1), nil }

// TestWaitReplicasCluster: on a Redis Cluster of three masters with a
// replica each, purchases of vouchers on several masters wait for their
// own master's replica, and are on it when Reserve returns. After a slot
// moves, the client's stale slot map sends the next purchase to the old
// master, which answers MOVED: the purchase follows it and is confirmed by
// the new master's replica. A slot half moved answers ASK: the purchase
// follows that too, and its replica has it once it may be read there.
func TestWaitReplicasCluster(t *testing.T) {
	t.Parallel()
	c := testenv.StartCluster(t, testenv.ClusterOptions{})
	rdb := c.Client(t)
	keys := NewClusterKeys(testenv.Prefix(t), 3)
	state := NewState(rdb, keys)
	ctx := context.Background()
	now := time.Now()
	vouchers := []int64{3, 4, 5} // one per shard
	masters := map[string]bool{}
	for _, id := range vouchers {
		v := Voucher{ID: id, Stock: 10, TotalStock: 10, BeginAt: now.Add(-time.Hour), EndAt: now.Add(time.Hour)}
		if _, err := state.Load(ctx, v, nil); err != nil {
			t.Fatal(err)
		}
		if err := state.MarkReady(ctx, keys.Shard(id)); err != nil {
			t.Fatal(err)
		}
		masters[c.MasterOf(t, keys.State(id)).Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("the vouchers live on %d master(s), want several", len(masters))
	}
	res := NewReserver(rdb, keys, WaitReplicas(1, confirmWithin))
	replicated := func(id, user int64, master *testenv.ClusterNode) {
		t.Helper()
		if got, want := onClusterReplica(t, c, master, keys.Buyers(id), user), strconv.FormatInt(id*1000+user, 10); got != want {
			t.Fatalf("voucher %d: the replica of %s holds order %q for user %d, want %s", id, master.Addr, got, user, want)
		}
	}
	// buy makes the user buy the voucher and checks that the replica of
	// master (the slot's master when nil) holds the order.
	buy := func(id, user int64, master *testenv.ClusterNode) {
		t.Helper()
		if _, err := res.Reserve(ctx, id, user, id*1000+user); err != nil {
			t.Fatalf("voucher %d, user %d: %v", id, user, err)
		}
		if master == nil {
			master = c.MasterOf(t, keys.State(id))
		}
		replicated(id, user, master)
	}
	for _, id := range vouchers {
		buy(id, 1, nil)
	}

	id := vouchers[0]
	slot := c.KeySlot(t, keys.State(id))
	from := c.MasterOf(t, keys.State(id))
	to := otherMaster(t, c, from)
	c.MigrateSlot(t, slot, to)
	buy(id, 2, to) // MOVED from the old master
	if now := c.MasterOf(t, keys.State(id)); now != to {
		t.Fatalf("slot %d on %s after the move, want %s", slot, now.Addr, to.Addr)
	}

	m := c.BeginMigrate(t, slot, from)
	for m.MoveKeys(t, 100) > 0 {
	}
	// ASK: every key of the voucher is on the importing node, whose
	// replica serves no read of the slot until the move is over.
	if _, err := res.Reserve(ctx, id, 3, id*1000+3); err != nil {
		t.Fatalf("during the move: %v", err)
	}
	m.Finish(t)
	replicated(id, 3, from)
	buy(id, 4, from)
}

// otherMaster returns a master other than not.
func otherMaster(t testing.TB, c *testenv.Cluster, not *testenv.ClusterNode) *testenv.ClusterNode {
	t.Helper()
	for _, m := range c.Masters(t) {
		if m != not {
			return m
		}
	}
	t.Fatal("no other master")
	return nil
}

// onClusterReplica reads, from the replica of master, the order id the
// buyers hash holds for the user.
func onClusterReplica(t testing.TB, c *testenv.Cluster, master *testenv.ClusterNode, buyers string, user int64) string {
	t.Helper()
	ctx := context.Background()
	_, port, _ := strings.Cut(master.Addr, ":")
	for _, n := range c.Nodes() {
		info, err := n.Client(t).Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_port:"+port+"\r\n") {
			continue
		}
		conn := n.Client(t).Conn()
		defer conn.Close()
		if err := conn.ReadOnly(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := conn.HGet(ctx, buyers, strconv.FormatInt(user, 10)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("read the replica %s: %v", n.Addr, err)
		}
		return got
	}
	t.Fatalf("no replica of %s", master.Addr)
	return ""
}
