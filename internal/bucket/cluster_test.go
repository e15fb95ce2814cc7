package bucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// TestCluster: on a real 3-master cluster with a replica each, the
// voucher's 3 buckets sit on 3 masters; a Move, a Borrow and a recovered
// crash cross masters, and a Quiesce fences and reads them, every step confirmed by a replica (WAIT 1).
func TestCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1})
	cl.WaitHealthy(t, 30*time.Second)
	rdb := cl.Client(t)
	e := loadEnv(t, rdb, voucher.NewClusterKeys(testenv.Prefix(t), 3), 10, 0, 0)
	ctx := context.Background()

	masters := map[string]int{}
	for b := range e.nb {
		masters[cl.MasterOf(t, e.state(b)).Addr]++
	}
	if len(masters) != 3 {
		t.Fatalf("buckets on masters %v, want 3 distinct", masters)
	}

	// An apply window long enough for a take, its WAIT and the apply on
	// a loaded machine (50ms was not, once).
	cfg := Config{WaitReplicas: 1, WaitTimeout: 5 * time.Second, StaleAfter: time.Millisecond, ApplyWindow: time.Second}
	m := e.mover(cfg)
	if moved, err := m.Move(ctx, e.v, 0, 1, 4, e.nb); err != nil || moved != 4 {
		t.Fatalf("Move = %d, %v; want 4", moved, err)
	}
	if err := m.Borrow(ctx, e.v, 2, e.nb); err != nil {
		t.Fatal(err)
	}
	if got := e.stocks(); !slices.Equal(got, []int64{3, 4, 3}) {
		t.Errorf("stocks %v, want [3 4 3]", got)
	}
	e.settled()

	crash := cfg
	crash.AfterStep = stopAfter("take")
	if _, err := e.mover(crash).Move(ctx, e.v, 1, 2, 2, e.nb); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	e.recoverAll(NewRecoverer(m))
	if got := e.stocks(); !slices.Equal(got, []int64{3, 4, 3}) {
		t.Errorf("stocks after recovery %v, want [3 4 3]", got)
	}
	e.settled()

	q, err := m.Quiesce(ctx, e.v, e.nb, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]int64{1: 4, 2: 3}; !maps.Equal(q.Alloc, want) {
		t.Errorf("Quiet %v, want %v", q.Alloc, want)
	}
	q.Release(ctx)
	if e.fenceOf(0) != "" || e.fenceOf(1) != "" || e.fenceOf(2) != "" {
		t.Error("fences left after Release")
	}
}

// TestClusterMasterFailsMidMove: a master fails over in the middle of a
// move, every step confirmed by a replica (WAIT 1): killed right after
// the take or the apply, the donor's or the receiver's. The promoted
// replica has the step (the take's journal entry, the apply's mark), the
// recovery loop finishes or returns the move from there, and no unit is
// lost or made: a move killed after its take returns its units, one
// killed after its apply stays applied.
func TestClusterMasterFailsMidMove(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second})
	cl.WaitHealthy(t, time.Minute)
	rdb := cl.Client(t)
	ctx := context.Background()
	for _, c := range []struct {
		step   string
		victim int // bucket whose master is killed: 0 donor, 1 receiver
		want   []int64
	}{
		{"take", 1, []int64{10, 0, 0}},
		{"take", 0, []int64{10, 0, 0}},
		{"apply", 1, []int64{6, 4, 0}},
		{"apply", 0, []int64{6, 4, 0}},
	} {
		name := fmt.Sprintf("%s_kill_%s", c.step, map[int]string{0: "donor", 1: "receiver"}[c.victim])
		t.Run(name, func(t *testing.T) {
			e := loadEnv(t, rdb, voucher.NewClusterKeys(testenv.Prefix(t), 3), 10, 0, 0)
			cfg := Config{WaitReplicas: 1, WaitTimeout: 5 * time.Second, StaleAfter: time.Millisecond, ApplyWindow: 30 * time.Second}
			victim := cl.MasterOf(t, e.state(c.victim))
			// The buckets' states reached the replicas (as the service's
			// load, confirmed before the sale, would have).
			for b := range e.nb {
				replicated(t, cl.MasterOf(t, e.state(b)))
			}
			crash := cfg
			crash.AfterStep = func(s string) bool {
				if s != c.step {
					return false
				}
				victim.Kill(t)
				return true
			}
			if _, err := e.mover(crash).Move(ctx, e.v, 0, 1, 4, e.nb); !errors.Is(err, ErrStopped) {
				t.Fatalf("move: %v, want stopped after %s", err, c.step)
			}
			cl.WaitFailover(t, victim, time.Minute)
			victim.Restart(t)
			cl.WaitHealthy(t, time.Minute)
			r := NewRecoverer(e.mover(cfg))
			testenv.WaitFor(t, 30*time.Second, "the move recovered on the new masters", func() bool {
				_ = r.Once(ctx) // fails while the client learns the new master
				return e.journaled() == 0
			})
			e.settled()
			if got := e.stocks(); !slices.Equal(got, c.want) {
				t.Errorf("stocks %v, want %v", got, c.want)
			}
		})
	}
}

// TestClusterDonorFailoverWithoutWait: with no replica acknowledgement
// asked for (SECKILL_REDIS_WAIT_REPLICAS 0), a move still waits for the
// donor's replicas before its units go anywhere: the donor's replica
// stopped, the take is not confirmed and the move is returned at once;
// the donor then dies and its stale replica takes over, and no unit is
// in two buckets. (Without that WAIT the receiver applied the take its
// donor's failover lost: 14 units for a stock of 10.)
func TestClusterDonorFailoverWithoutWait(t *testing.T) {
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: 2 * time.Second})
	cl.WaitHealthy(t, time.Minute)
	rdb := cl.Client(t)
	ctx := context.Background()
	e := loadEnv(t, rdb, voucher.NewClusterKeys(testenv.Prefix(t), 3), 10, 0, 0)
	for b := range e.nb {
		replicated(t, cl.MasterOf(t, e.state(b)))
	}
	donor := cl.MasterOf(t, e.state(0))
	replica := cl.ReplicaOf(t, donor)
	replica.Pause(t)
	// What the donor sent before is in the replica's socket and is read on
	// SIGCONT; what it writes from now on reaches no replica.
	if err := donor.Client(t).ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatalf("drop the replica's link: %v", err)
	}
	cfg := Config{WaitTimeout: 300 * time.Millisecond, StaleAfter: time.Millisecond, ApplyWindow: 30 * time.Second}
	moved, err := e.mover(cfg).Move(ctx, e.v, 0, 1, 4, e.nb)
	if moved != 0 || !errors.Is(err, ErrNotReplicated) {
		t.Errorf("move out of a donor whose replica is stopped: %d moved, %v; want none, not replicated", moved, err)
	}
	donor.Kill(t)
	replica.Resume(t)
	cl.WaitFailover(t, donor, time.Minute)
	r := NewRecoverer(e.mover(cfg))
	testenv.WaitFor(t, 30*time.Second, "the journals empty on the new masters", func() bool {
		_ = r.Once(ctx) // fails while the client learns the new master
		return e.journaled() == 0
	})
	e.settled()
	if got := e.stocks(); !slices.Equal(got, []int64{10, 0, 0}) {
		t.Errorf("stocks %v after the donor's failover, want [10 0 0]", got)
	}
}

// replicated waits until every replica of master has all it wrote so far.
func replicated(t *testing.T, master *testenv.ClusterNode) {
	t.Helper()
	ctx := context.Background()
	testenv.WaitFor(t, 10*time.Second, "replicas of "+master.Addr+" in step", func() bool {
		info, err := master.Client(t).Info(ctx, "replication").Result()
		if err != nil {
			return false
		}
		var offset int64 = -1
		replicas := 0
		for line := range strings.Lines(info) {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
				offset, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		for line := range strings.Lines(info) {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "slave") || !strings.Contains(line, "offset=") {
				continue
			}
			replicas++
			_, rest, _ := strings.Cut(line, "offset=")
			n, _ := strconv.ParseInt(strings.Split(rest, ",")[0], 10, 64)
			if n < offset {
				return false
			}
		}
		return replicas > 0 && offset >= 0
	})
}

// TestClusterApplyNotConfirmedStops: an apply the receiver's replica does
// not confirm (the replica stopped, WAIT 1) stops the move there: Move
// fails with ErrNotReplicated and the move stays journaled, not closed as
// applied (a failover of the receiver could lose units its donor no
// longer counts); once the replica is back the recovery loop closes it
// as applied.
func TestClusterApplyNotConfirmedStops(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1})
	cl.WaitHealthy(t, time.Minute)
	rdb := cl.Client(t)
	ctx := context.Background()
	e := loadEnv(t, rdb, voucher.NewClusterKeys(testenv.Prefix(t), 3), 10, 0, 0)
	for b := range e.nb {
		replicated(t, cl.MasterOf(t, e.state(b)))
	}
	receiver := cl.MasterOf(t, e.state(1))
	replica := cl.ReplicaOf(t, receiver)
	replica.Pause(t)
	resumed := false
	defer func() {
		if !resumed {
			replica.Resume(t)
		}
	}()
	if err := receiver.Client(t).ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatalf("drop the replica's link: %v", err)
	}
	cfg := Config{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond, StaleAfter: time.Millisecond, ApplyWindow: 30 * time.Second}
	moved, err := e.mover(cfg).Move(ctx, e.v, 0, 1, 4, e.nb)
	if moved != 0 || !errors.Is(err, ErrNotReplicated) {
		t.Errorf("move into a receiver whose replica is stopped: %d moved, %v; want none, not replicated", moved, err)
	}
	if n := e.journaled(); n != 1 {
		t.Errorf("%d moves journaled, want the unconfirmed apply's move left open", n)
	}
	replica.Resume(t)
	resumed = true
	r := NewRecoverer(e.mover(cfg))
	testenv.WaitFor(t, 30*time.Second, "the move closed once the replica is back", func() bool {
		_ = r.Once(ctx) // fails until the replica confirms
		return e.journaled() == 0
	})
	e.settled()
	if got := e.stocks(); !slices.Equal(got, []int64{6, 4, 0}) {
		t.Errorf("stocks %v, want [6 4 0]", got)
	}
}
