package fault

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// The sale on a Redis Cluster of three masters with a replica each, one
// order shard per master, two instances. Each burst: 800 buyers press
// once per voucher per round, for a stock of 300 a voucher, so the sale is
// still on when the fault is injected (after 100 purchases a voucher).
//
// These scenarios do not run in parallel with the others: a failover is
// timed by the cluster's node timeout, and a machine starved by a dozen
// other scenarios could fail a master over by itself.
const (
	clusterStock = 300
	clusterUsers = 800
	clusterAt    = shards * 100 // purchases answered before the fault
	clusterAfter = 300          // purchases answered after it healed, before the burst ends
	// clusterBehind purchases are answered while the killed master's
	// replica is paused, before the kill.
	clusterBehind = 90
)

// A master is killed with -9 in the middle of a burst, without acks from
// replicas: its replica takes over, the purchases of its shard fail (503)
// meanwhile, the instances rebuild that shard alone from MySQL and go on
// selling. Orders the master accepted but had not yet sent to its replica
// may be lost; nothing is oversold or sold twice, and every order that
// remains ends once.
func TestClusterMasterKilledMidBurst(t *testing.T) {
	lost, accepted := masterKilledMidBurst(t, nil, false)
	t.Logf("lost %d of %d accepted orders on the killed shard", lost, accepted)
}

// The same, with every accepted purchase confirmed by a replica before
// its 202: a failover loses none of them. The killed master comes back as
// a replica (without one, no purchase of its shard can be confirmed).
func TestClusterMasterKilledWithReplicaAck(t *testing.T) {
	lost, accepted := masterKilledMidBurst(t, map[string]string{
		"SECKILL_REDIS_WAIT_REPLICAS": "1", "SECKILL_REDIS_WAIT_TIMEOUT": "300ms",
	}, true)
	t.Logf("lost %d of %d accepted orders on the killed shard", lost, accepted)
	if lost != 0 {
		t.Fatalf("%d orders confirmed by a replica were lost in a failover; want none", lost)
	}
}

// masterKilledMidBurst runs the failover scenario with extra settings,
// restarting the killed master once its replica took over when restart is
// set, and returns how many accepted orders of the killed shard were lost,
// of how many.
func masterKilledMidBurst(t *testing.T, extra map[string]string, restart bool) (lost, accepted int) {
	const killed = 1
	w := newClusterSale(t, clusterStock, extra)
	victim := w.master(killed)
	for s := range shards {
		if s != killed && w.master(s) == victim {
			t.Fatalf("shards %d and %d share master %s; want one shard per master", s, killed, victim.Addr)
		}
	}
	// Every replica is in sync before the fault.
	w.rc.WaitHealthy(t, time.Minute)

	replica := w.replicaOf(victim)

	r := w.burst(clusterUsers, shards*clusterUsers)
	r.reach(t, clusterAt)
	// The replica falls behind, and MariaDB stalls so the workers write
	// nothing: the orders the master takes meanwhile live only on it,
	// unless purchases wait for the replica. Then the master dies, and the
	// replica takes over without them.
	replica.Pause(t)
	// What the master sent before is in the replica's socket and will be
	// read on SIGCONT; what it takes after this reaches no replica.
	if err := victim.Client(t).ClientKillByFilter(context.Background(), "TYPE", "replica").Err(); err != nil {
		t.Fatalf("drop the replica's link: %v", err)
	}
	w.maria.Pause(t)
	r.reach(t, r.answered.Load()+clusterBehind)
	victim.Kill(t)
	replica.Resume(t)
	w.maria.Resume(t)
	began := time.Now()
	w.rc.WaitFailover(t, victim, time.Minute)
	failover := time.Since(began)
	before := w.accepted(killed)
	if restart {
		victim.Restart(t)
		w.rc.WaitHealthy(t, time.Minute)
	}
	r.reach(t, r.answered.Load()+clusterAfter)
	r.finish(t)
	back := w.recovered(killed, 90*time.Second)
	// A second round sells what is left.
	w.burst(clusterUsers, shards*clusterUsers).finish(t)
	end := w.settle(2 * time.Minute)

	if w.accepted(killed) == before {
		t.Errorf("no purchase on shard %d was accepted after its failover", killed)
	}
	for s := range shards {
		if s != killed && len(end[s].lost) != 0 {
			t.Errorf("shard %d, on a master that ran on, lost accepted orders %v", s, end[s].lost)
		}
		// The masters left serve their slots while one is down
		// (cluster-require-full-coverage no): their shards sell on.
		if n := w.unanswered(s); s != killed && n != 0 {
			t.Errorf("shard %d, on a master that ran on, answered %d purchases 503 (%s)", s, n, w.codes(s))
		}
	}
	rebuilt := w.rebuilds("master_changed")
	for s := range shards {
		switch {
		case s == killed && rebuilt[s] == 0:
			t.Errorf("shard %d was not rebuilt after its master failed over (rebuilds by shard %v)", s, rebuilt)
		case s != killed && rebuilt[s] != 0:
			t.Errorf("shard %d was rebuilt %d times, though its master ran on (rebuilds by shard %v)", s, rebuilt[s], rebuilt)
		}
	}
	lost, accepted = len(end[killed].lost), w.accepted(killed)
	for s := range shards {
		t.Logf("shard %d (voucher %d): answers %s; lost %v\nchecked I1, I2, I4-I7 (I3 but for the lost): %s",
			s, w.vouchers[s], w.codes(s), end[s].lost, end[s].rep)
	}
	t.Logf("injected: SIGSTOP of the replica of shard %d's master after %d purchases, its link dropped, SIGSTOP of mariadbd, SIGKILL of the master %d purchases later, SIGCONT of both; failover in %s; restarted: %t; a purchase on the shard answered (2xx/4xx) again %s after the burst; master_changed rebuilds by shard %v",
		killed, clusterAt, clusterBehind, failover.Round(time.Millisecond), restart, back.Round(time.Millisecond), rebuilt)
	return lost, accepted
}

// The slot of one shard's hash tag moves to another master in the middle
// of a burst, a key at a time while purchases go on: purchases of that
// shard may fail (503) while its keys are split, but nothing is oversold,
// sold twice or lost, the workers drain the shard's stream on its new
// master, and the instances rebuild that shard alone.
func TestClusterSlotMovedMidSale(t *testing.T) {
	const moved = 2
	w := newClusterSale(t, clusterStock, nil)
	from := w.master(moved)
	to := w.master(0)
	if to == from {
		t.Fatalf("shards 0 and %d share master %s; want one shard per master", moved, from.Addr)
	}
	slot := w.rc.KeySlot(t, w.keys.Stream(moved))
	w.rc.WaitHealthy(t, time.Minute)

	r := w.burst(clusterUsers, shards*clusterUsers)
	r.reach(t, clusterAt)
	m := w.rc.BeginMigrate(t, slot, to)
	keys := 0
	for {
		n := m.MoveKeys(t, 1)
		if n == 0 {
			break
		}
		keys += n
		// Purchases go on while the shard's keys are split.
		r.reach(t, r.answered.Load()+30)
	}
	m.Finish(t)
	before := w.accepted(moved)
	r.reach(t, r.answered.Load()+clusterAfter)
	r.finish(t)
	back := w.recovered(moved, 90*time.Second)
	w.burst(clusterUsers, shards*clusterUsers).finish(t)
	end := w.settle(2 * time.Minute)

	if w.accepted(moved) == before {
		t.Errorf("no purchase on shard %d was accepted after its slot moved", moved)
	}
	for s := range shards {
		if len(end[s].lost) != 0 {
			t.Errorf("shard %d lost accepted orders %v", s, end[s].lost)
		}
		t.Logf("shard %d (voucher %d): answers %s\nchecked I1-I7: %s", s, w.vouchers[s], w.codes(s), end[s].rep)
	}
	rebuilt := w.rebuilds("master_changed")
	for s := range shards {
		switch {
		case s == moved && rebuilt[s] == 0:
			t.Errorf("shard %d was not rebuilt after its slot moved (rebuilds by shard %v)", s, rebuilt)
		case s != moved && rebuilt[s] != 0:
			t.Errorf("shard %d was rebuilt %d times, though its slot stayed (rebuilds by shard %v)", s, rebuilt[s], rebuilt)
		}
	}
	t.Logf("injected: slot %d of shard %d moved from %s to %s (the master of shard 0), %s, one key at a time with purchases in between, after %d purchases; a purchase on the shard answered (2xx/4xx) again %s after the burst",
		slot, moved, from.Addr, to.Addr, fmt.Sprintf("%d keys", keys), clusterAt, back.Round(time.Millisecond))
}
