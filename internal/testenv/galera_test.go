package testenv_test

import (
	"slices"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestGaleraSurvivesAKilledNode: a write on one node is read on another;
// with one node killed -9, the other two form a cluster of two and take
// writes; the killed node, restarted, rejoins with what it missed; a
// paused node is dropped and rejoins once resumed.
func TestGaleraSurvivesAKilledNode(t *testing.T) {
	t.Parallel()
	began := time.Now()
	g := testenv.StartGalera(t, 3)
	t.Logf("3 nodes synced in %s", time.Since(began).Round(time.Millisecond))
	n0, n1, n2 := g.Nodes[0], g.Nodes[1], g.Nodes[2]

	n0.Exec(t, "CREATE DATABASE shop")
	n0.Exec(t, "CREATE TABLE shop.t (id INT PRIMARY KEY)")
	n0.Exec(t, "INSERT INTO shop.t VALUES (1)")
	// Another node applies a write after the writer's commit returns, not
	// before: poll for it.
	on2 := openDB(t, dsn("root", n2.Addr, "shop"))
	testenv.WaitFor(t, 10*time.Second, "row 1 on node 2", func() bool { return hasIDs(on2, 1) })

	n0.Kill(t)
	began = time.Now()
	g.WaitSize(t, 2, 20*time.Second)
	t.Logf("killed node dropped in %s", time.Since(began).Round(time.Millisecond))
	insert(t, openDB(t, dsn("root", n1.Addr, "shop")), 2)
	testenv.WaitFor(t, 10*time.Second, "row 2 on node 2", func() bool { return hasIDs(on2, 1, 2) })

	began = time.Now()
	n0.Restart(t)
	g.WaitSize(t, 3, time.Minute)
	t.Logf("restarted node synced in %s", time.Since(began).Round(time.Millisecond))
	if got := ids(t, openDB(t, dsn("root", n0.Addr, "shop"))); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("restarted node 0: ids %v, want [1 2]", got)
	}

	began = time.Now()
	n2.Pause(t)
	g.WaitSize(t, 2, 20*time.Second)
	t.Logf("paused node dropped in %s", time.Since(began).Round(time.Millisecond))
	insert(t, openDB(t, dsn("root", n0.Addr, "shop")), 3)
	n2.Resume(t)
	g.WaitSize(t, 3, time.Minute)
	testenv.WaitFor(t, 10*time.Second, "row 3 on the resumed node 2", func() bool { return hasIDs(on2, 1, 2, 3) })
}
