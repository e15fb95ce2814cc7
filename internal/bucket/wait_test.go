package bucket

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"seckill/internal/lease"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
)

// withReplicas starts a master with n replicas of its own, every one in
// step, and the test's voucher of three buckets on it (10, 0, 5).
func withReplicas(t *testing.T, n int) (*env, *testenv.RedisServer, []*testenv.RedisServer) {
	t.Helper()
	ctx := context.Background()
	master := testenv.StartRedis(t, testenv.RedisOptions{})
	port := master.Addr[strings.LastIndex(master.Addr, ":")+1:]
	var replicas []*testenv.RedisServer
	for range n {
		r := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--replicaof", "127.0.0.1", port}})
		testenv.WaitFor(t, 10*time.Second, "a replica in step", func() bool {
			info, err := r.Client(t).Info(ctx, "replication").Result()
			return err == nil && strings.Contains(info, "master_link_status:up")
		})
		replicas = append(replicas, r)
	}
	testenv.WaitFor(t, 10*time.Second, "the master listing every replica", func() bool {
		role, err := master.Client(t).Do(ctx, "role").Slice()
		if err != nil || len(role) < 3 {
			return false
		}
		rs, _ := role[2].([]any)
		return len(rs) == n
	})
	return loadEnv(t, master.Client(t), voucher.NewKeys(testenv.Prefix(t), 3), 10, 0, 5), master, replicas
}

// TestMoveWaitsForEveryReplica: with SECKILL_REDIS_WAIT_REPLICAS=1 on a
// master with two replicas, one paused, a take is not confirmed by the
// other alone: the cluster could promote the paused one, which never saw
// it. The move is refused and its units stay in the donor (issue 42,
// point 4; with the wait for the configured count alone it was applied).
func TestMoveWaitsForEveryReplica(t *testing.T) {
	t.Parallel()
	e, _, replicas := withReplicas(t, 2)
	ctx := context.Background()
	m := e.mover(Config{WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond})
	if got, err := m.Move(ctx, e.v, 0, 1, 2, e.nb); err != nil || got != 2 {
		t.Fatalf("move with both replicas up: %d, %v", got, err)
	}
	replicas[1].Pause(t)
	got, err := m.Move(ctx, e.v, 0, 1, 3, e.nb)
	replicas[1].Resume(t)
	if !errors.Is(err, ErrNotReplicated) || got != 0 {
		t.Fatalf("move with one replica of two paused: %d units, %v; want refused, not replicated", got, err)
	}
	if s := e.bucket(1); s.stock != 2 || s.alloc != 2 {
		t.Errorf("receiver %+v, want only the first move's 2 units", s)
	}
	e.settled()
}

// TestReplayedStepConfirmsItsMark: an apply whose WAIT fell short (its
// replica paused), asked again by another instance (its own connections,
// which wrote nothing), is not confirmed while the replica still lacks
// the mark; nor is a resolve that finds it. Once the replica is back,
// both are. The replay writes nothing: Redis takes the offset WAIT waits
// for at a connection's last command, a read too, and the runner sends
// WAIT on the connection that ran the script (issue 42, point 4: sent on
// another one, the replay was confirmed at once).
func TestReplayedStepConfirmsItsMark(t *testing.T) {
	t.Parallel()
	e, master, replicas := withReplicas(t, 1)
	ctx := context.Background()
	cfg := Config{WaitReplicas: 1, WaitTimeout: 200 * time.Millisecond}
	m := e.mover(cfg)
	mv, err := m.take(ctx, lease.NewToken(), e.v, 0, 1, 4, e.nb)
	if err != nil {
		t.Fatal(err)
	}
	replicas[0].Pause(t)
	if _, err := m.applyOrResolve(ctx, mv); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("apply with the replica paused: %v; want not replicated", err)
	}
	// Another instance: its own client, connections that wrote nothing.
	other := NewMover(master.Client(t), e.keys, cfg, m.log)
	if out, err := other.applyOrResolve(ctx, mv); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("apply replayed with the replica paused: %q, %v; want not replicated", out, err)
	}
	other = NewMover(master.Client(t), e.keys, cfg, m.log)
	if out, err := other.resolve(ctx, mv); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("resolve with the replica paused: %q, %v; want not replicated", out, err)
	}
	replicas[0].Resume(t)
	other = NewMover(master.Client(t), e.keys, cfg, m.log)
	if out, err := other.applyOrResolve(ctx, mv); err != nil || out != outcomeApplied {
		t.Fatalf("apply replayed with the replica back: %q, %v", out, err)
	}
	if s := e.bucket(1); s.stock != 4 || s.alloc != 4 {
		t.Errorf("receiver %+v, want the 4 units once", s)
	}
	if ttl, err := master.Client(t).PTTL(ctx, markKey(e.keys, e.shard(1), mv.id)).Result(); err != nil || ttl <= 0 {
		t.Errorf("the mark's time to live after the replays: %v, %v; want it kept", ttl, err)
	}
	if err := m.close(ctx, mv, outcomeApplied, &m.stats); err != nil {
		t.Fatal(err)
	}
	e.settled()
}
