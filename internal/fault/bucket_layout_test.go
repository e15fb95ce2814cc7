package fault

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"seckill/internal/auth"
	"seckill/internal/testenv"
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
