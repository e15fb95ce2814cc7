package bucket

import (
	"context"
	"errors"
	"maps"
	"slices"
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

	cfg := Config{WaitReplicas: 1, WaitTimeout: 5 * time.Second, StaleAfter: time.Millisecond, ApplyWindow: 50 * time.Millisecond}
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
	if e.fenceOf(1) != 0 || e.fenceOf(2) != 0 {
		t.Error("fences left after Release")
	}
}
