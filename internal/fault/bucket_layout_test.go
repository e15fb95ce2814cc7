package fault

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// Bucket 0's master is killed (no replica: its slots stay down until it
// comes back), and an instance started after the kill, which never sold
// the voucher, sells the buyers of buckets 1 and 2 within 5 s of being
// up: it learned the voucher's bucket count, and that it has no draw,
// from the database (issue 42, point 2). Before, it asked bucket 0 for
// both and answered 503 to every buyer of every bucket until bucket 0
// came back; with either lesson removed from cmd/api/run.go, this test
// fails so. Bucket 0's master then restarts from its AOF: nothing is
// lost and I1-I7 hold.
func TestClusterFreshInstanceSellsWithoutBucket0(t *testing.T) {
	const stock = 600
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1, AppendOnly: true}, nil)
	a := w.run("a", nil)
	w.create(a.base, stock)
	w.fire(buyersFrom(600_000, 60, 0), []string{a.base}, 8).wait(t)
	victim := w.master(0)
	victim.Kill(t)
	b := w.run("b", nil)
	up := time.Now()
	var report []string
	for bk := 1; bk < buckets; bk++ {
		users := homeOnly(bk, int64(610_000+10_000*bk), 200)
		i := 0
		testenv.WaitFor(t, 5*time.Second, fmt.Sprintf("the new instance accepting a buyer of bucket %d", bk), func() bool {
			u := users[i%len(users)]
			i++
			return w.press(b.base, u, token(t, u, auth.RoleUser)).status == http.StatusAccepted
		})
		report = append(report, fmt.Sprintf("bucket %d sold %s after the new instance was up", bk, time.Since(up).Round(time.Millisecond)))
	}
	// The drill is real: bucket 0's own buyers cannot buy meanwhile.
	probe := homeOnly(0, 690_000, 1)[0]
	if got := w.press(b.base, probe, token(t, probe, auth.RoleUser)); got.status == http.StatusAccepted {
		t.Fatalf("a buyer of bucket 0 was accepted with its master down: %+v", got)
	}
	victim.Restart(t)
	w.rc.WaitHealthy(t, time.Minute)
	w.recovered(0, time.Minute)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("%d accepted orders were lost: %v", len(lost), lost)
	}
	t.Logf("%v; answers by home bucket %s; checked I1-I7: %s", report, w.answers(), rep)
}

// replicasOf lists the nodes replicating master (INFO replication).
func (w *bucketSale) replicasOf(master *testenv.ClusterNode) []*testenv.ClusterNode {
	w.t.Helper()
	_, port, _ := strings.Cut(master.Addr, ":")
	var out []*testenv.ClusterNode
	for _, n := range w.rc.Nodes() {
		info, err := n.Client(w.t).Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r\n") {
			out = append(out, n)
		}
	}
	return out
}

// The review's drill (issue 42, point 4): masters with two replicas each,
// purchases and transfers confirmed by WAIT 1, the instances' warm round
// at its default 5 s. One of bucket 0's replicas is stopped and cut off
// while buyers of buckets 1 and 2, twice what those hold, press; then
// bucket 0's master and its other replica are killed and the stopped
// one, resumed, is promoted; bucket 0's buyers press at once, then
// everyone's until sold out. A transfer step waits for every replica its
// master has, so bucket 0 lent nothing its promoted replica lacks (its
// buyers of buckets 1 and 2 were answered busy meanwhile): nothing is sold
// twice, no accepted order is lost or dead lettered, every unit is sold,
// I1-I7 hold. With the wait for n replicas alone, bucket 0 lent its 300
// units on one replica's word, the promoted one sold them again, and 300
// accepted orders were dead lettered out of stock.
func TestClusterTwoReplicasDonorDrill(t *testing.T) {
	const stock = 900
	env := map[string]string{"SECKILL_REDIS_WAIT_REPLICAS": "1", "SECKILL_REDIS_WAIT_TIMEOUT": "300ms",
		"SECKILL_WARM_INTERVAL": "5s"}
	// Validity factor 0: the resumed replica may be promoted however long
	// it was stopped.
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: 2, NodeTimeout: 2 * time.Second,
		ExtraArgs: []string{"--cluster-replica-validity-factor", "0"}}, env)
	a, b := w.run("a", nil), w.run("b", nil)
	bases := []string{a.base, b.base}
	w.create(a.base, stock)
	w.rc.WaitHealthy(t, time.Minute)
	donor := w.master(0)
	reps := w.replicasOf(donor)
	if len(reps) != 2 {
		t.Fatalf("bucket 0's master %s has %d replicas, want 2", donor.Addr, len(reps))
	}
	stopped, other := reps[0], reps[1]
	// Stopped, and cut off: a paused process's socket still takes in what
	// the master sends, so the master also drops its replicas' links (the
	// other one connects again at once; the stopped one cannot).
	stopped.Pause(t)
	if err := donor.Client(t).Do(context.Background(), "client", "kill", "type", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	// Buyers of buckets 1 and 2 alone, twice what those buckets hold:
	// they empty them and borrow from bucket 0.
	var away []int64
	away = append(away, homeOnly(1, 800_000, 2*stock/3)...)
	away = append(away, homeOnly(2, 800_000, 2*stock/3)...)
	w.fire(away, bases, 16).wait(t)
	soldAway := w.accepted(1) + w.accepted(2)
	donor.Kill(t)
	other.Kill(t)
	stopped.Resume(t)
	w.rc.WaitFailover(t, donor, time.Minute)
	// At once: bucket 0's buyers; then, bucket 0 back, everyone's.
	w.fire(homeOnly(0, 820_000, stock/3), bases, 16).wait(t)
	w.recovered(0, time.Minute)
	testenv.WaitFor(t, 30*time.Second, "no transfer open", func() bool { return w.inTransit() == 0 })
	w.fire(buyersFrom(840_000, 2*stock, 0), bases, 16).wait(t)
	rep, lost := w.settle(2 * time.Minute)
	if len(lost) != 0 {
		t.Fatalf("%d accepted orders were lost: %v", len(lost), lost)
	}
	if rep.DeadLetters != 0 || rep.Live != stock {
		t.Fatalf("%d dead letters, %d live orders for a stock of %d; answers by home bucket %s", rep.DeadLetters, rep.Live, stock, w.answers())
	}
	t.Logf("buckets 1 and 2 (%d units at the start) sold %d while bucket 0's replica was stopped; answers by home bucket %s; checked I1-I7: %s", 2*stock/3, soldAway, w.answers(), rep)
}

// sellsOne presses fresh buyers of voucher v at base until one is
// accepted, and returns how long that took, or fails past within.
func (w *bucketSale) sellsOne(base string, v, first int64, within time.Duration) time.Duration {
	w.t.Helper()
	began := time.Now()
	u := first
	testenv.WaitFor(w.t, within, fmt.Sprintf("a buyer of voucher %d accepted", v), func() bool {
		u++
		a := w.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, v), token(w.t, u, auth.RoleUser), nil)
		return a.status == http.StatusAccepted
	})
	return time.Since(began)
}

// One dead master never closes another shard (issue 42, point 3): three
// masters, no replicas, no persistence. Bucket 2's master is killed (that
// bucket is gone until it returns); then bucket 1's master restarts empty,
// so its shard is rebuilt from the database. The hot voucher's bucket 1
// cannot be counted while bucket 2 does not answer: the rebuild leaves it
// out and the shard reopens, so a voucher of one bucket living there sells
// within 5 s of the restart, and bucket 0's buyers are never refused.
// Before, the rebuild failed on bucket 2 and the whole shard stayed closed,
// the voucher of one bucket too. Once bucket 2's master returns (empty),
// the left-out bucket is loaded from what the others hold and sells;
// nothing is sold twice, only buyers of buckets 1 and 2 (whose masters kept
// nothing) may have lost an order, I1-I7 hold for the rest.
func TestClusterShardReopensWithAnotherMasterDead(t *testing.T) {
	const stock = 300
	w := newBucketSale(t, testenv.ClusterOptions{Masters: 3, Replicas: -1, ExtraArgs: []string{"--save", ""}}, nil)
	a, b := w.run("a", nil), w.run("b", nil)
	w.create(a.base, stock)
	w.rc.WaitHealthy(t, time.Minute)
	bases := []string{a.base, b.base}
	// A voucher of one bucket in bucket 1's shard.
	var single int64
	for i := 0; single == 0; i++ {
		if i == 40 {
			t.Fatal("no voucher of one bucket landed in bucket 1's shard in 40 tries")
		}
		c := w.do("POST", a.base+"/api/v1/vouchers", token(t, 1, auth.RoleAdmin), map[string]any{
			"title": "single", "face_value": 100, "stock": 1000,
			"begin_at": time.Now().Add(-time.Minute).Format(time.RFC3339), "end_at": time.Now().Add(time.Hour).Format(time.RFC3339),
		})
		if c.status != http.StatusCreated {
			t.Fatalf("create a voucher of one bucket: %+v", c)
		}
		if w.keys.Shard(c.order) == w.shard(1) {
			single = c.order
		}
	}
	w.sellsOne(a.base, single, 950_000, 10*time.Second)
	w.fire(buyersFrom(960_000, 60, 0), bases, 8).wait(t)

	dead, emptied := w.master(2), w.master(1)
	dead.Kill(t)
	emptied.Kill(t)
	emptied.Restart(t)
	restarted := time.Now()
	reopened := w.sellsOne(b.base, single, 970_000, 5*time.Second)
	zero := w.sellsWithin(0, 980_000, 5*time.Second)
	t.Logf("bucket 1's master restarted empty with bucket 2's dead: the voucher of one bucket in its shard sold %s after, a buyer of bucket 0 %s after that",
		reopened.Round(time.Millisecond), zero.Round(time.Millisecond))

	// Bucket 2's master returns, empty: the left-out bucket 1 is loaded.
	dead.Restart(t)
	w.rc.WaitHealthy(t, time.Minute)
	back := time.Since(restarted)
	w.recovered(1, time.Minute)
	w.sellsWithin(1, 990_000, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "no transfer open", func() bool { return w.inTransit() == 0 })
	w.fire(buyersFrom(1_000_000, 2*stock, 0), bases, 16).wait(t)
	rep, lost := w.settle(2 * time.Minute)
	buyerOf := map[int64]int64{}
	w.sale.mu.Lock()
	maps.Copy(buyerOf, w.sale.accepted)
	w.sale.mu.Unlock()
	for _, id := range lost {
		if h := voucher.Home(buyerOf[id], buckets); h == 0 {
			t.Errorf("order %d of a buyer of bucket 0 was lost; only buckets 1 and 2 lost their data", id)
		}
	}
	if rep.DeadLetters != 0 || rep.Live+len(lost) > stock {
		t.Fatalf("%d dead letters, %d live orders and %d lost for a stock of %d", rep.DeadLetters, rep.Live, len(lost), stock)
	}
	t.Logf("bucket 2 back %s after the restart; lost %d orders; answers by home bucket %s; checked I1-I7: %s",
		back.Round(time.Millisecond), len(lost), w.answers(), rep)
}
