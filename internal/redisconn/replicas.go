package redisconn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicas confirms writes with WAIT, and applies the policy for a master
// of a Redis Cluster that has no replica at all (a replica promoted after
// its master died, before another is attached): a write such a master
// holds cannot be lost to a failover, since nothing can take its place,
// so the write counts as confirmed by the master alone (Alone). Only that
// master's own loss can lose it, as with no WAIT; the service counts such
// writes (AloneWrites) for a metric and an alert, and an operator attaches
// a replica.
//
// "No replica" is what the cluster says: CLUSTER REPLICAS of the master
// lists none. A replica that is down or disconnected but known still
// counts (it could be promoted), and then WAIT decides. On one server (no
// cluster) a replica may be promoted by something the server does not
// know of (Sentinel), so WAIT always decides there.
//
// A master found alone is asked CLUSTER REPLICAS of its node id again on
// each write (one round trip, as WAIT would be), without WAIT (which would
// wait its whole timeout for replicas that do not exist); once it lists a
// replica, or no longer knows that id (another node at its address), WAIT
// is asked again. A master not seen alone for a second is forgotten.
type Replicas struct {
	mu    sync.Mutex
	alone map[string]lone // master address -> the node found alone there
	count atomic.Int64
}

// lone is a master found with no replica: its node id, and when.
type lone struct {
	id string
	at time.Time
}

// aloneFor is how long a master found with no replica is remembered.
const aloneFor = time.Second

// NewReplicas returns a Replicas with no master known alone.
func NewReplicas() *Replicas { return &Replicas{alone: map[string]lone{}} }

// Confirmation is how a write stands after Confirm.
type Confirmation struct {
	Acked int64 // replicas that acknowledged it (WAIT's answer)
	Alone bool  // the master has no replica: confirmed by the master alone
}

// OK reports whether the write is confirmed for want replicas.
func (c Confirmation) OK(want int) bool { return c.Alone || c.Acked >= int64(want) }

// Confirm confirms the writes made on conn, a connection to master addr:
// by want replicas' acknowledgement (WAIT, bounded by timeout), or by the
// master alone when the cluster lists no replica of it. A nil Replicas
// only sends WAIT.
func (r *Replicas) Confirm(ctx context.Context, conn *redis.Conn, addr string, want int, timeout time.Duration) (Confirmation, error) {
	if id, ok := r.knownAlone(addr); ok {
		if rs, err := conn.Do(ctx, "cluster", "replicas", id).Slice(); err == nil && len(rs) == 0 {
			return r.confirmAlone(addr, id, 0), nil
		}
		r.forget(addr)
	}
	n, err := conn.Wait(ctx, want, timeout).Result()
	if err != nil || n >= int64(want) || r == nil {
		return Confirmation{Acked: n}, err
	}
	id, replicas, err := clusterReplicas(ctx, conn)
	if err != nil || id == "" || replicas > 0 {
		return Confirmation{Acked: n}, nil // short, as WAIT said
	}
	return r.confirmAlone(addr, id, n), nil
}

// AloneWrites counts the writes confirmed by a master alone (0 for a nil
// Replicas).
func (r *Replicas) AloneWrites() int64 {
	if r == nil {
		return 0
	}
	return r.count.Load()
}

func (r *Replicas) confirmAlone(addr, id string, acked int64) Confirmation {
	r.mu.Lock()
	r.alone[addr] = lone{id: id, at: time.Now()}
	r.mu.Unlock()
	r.count.Add(1)
	return Confirmation{Acked: acked, Alone: true}
}

// knownAlone is the node id of the master at addr when it was found alone
// within aloneFor (never for a nil Replicas).
func (r *Replicas) knownAlone(addr string) (string, bool) {
	if r == nil {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.alone[addr]
	if ok && time.Since(l.at) >= aloneFor {
		delete(r.alone, addr)
		return "", false
	}
	return l.id, ok
}

func (r *Replicas) forget(addr string) {
	r.mu.Lock()
	delete(r.alone, addr)
	r.mu.Unlock()
}

// clusterReplicas is conn's server's cluster node id and how many
// replicas the cluster lists for it (CLUSTER REPLICAS: a disconnected one
// too, it could still be promoted); id is "" on a server not in a cluster.
func clusterReplicas(ctx context.Context, conn *redis.Conn) (id string, replicas int, err error) {
	id, err = conn.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		if refused(err) {
			return "", 0, nil // cluster support disabled
		}
		return "", 0, err
	}
	rs, err := conn.Do(ctx, "cluster", "replicas", id).Slice()
	return id, len(rs), err
}

// KnownReplicas counts the replicas of conn's server that could take its
// place: on a cluster every replica the cluster lists for it, else the
// replicas connected to it (ROLE). A server that answers neither (an
// embedded one) has none.
func KnownReplicas(ctx context.Context, conn *redis.Conn) (int, error) {
	id, n, err := clusterReplicas(ctx, conn)
	if err != nil || id != "" {
		return n, err
	}
	role, err := conn.Do(ctx, "role").Slice()
	switch {
	case refused(err):
		return 0, nil
	case err != nil:
		return 0, err
	case len(role) < 3:
		return 0, nil
	}
	rs, _ := role[2].([]any)
	return len(rs), nil
}

// ReplicaCounts remembers KnownReplicas per master address for a second:
// the steps of a move of units, milliseconds apart, ask their masters once
// instead of twice a step. A replica attached within that second is
// waited for from the next count on; one that leaves still counts
// (waited for in vain, the step is refused: the safe side).
type ReplicaCounts struct {
	mu   sync.Mutex
	seen map[string]counted
	now  func() time.Time
}

type counted struct {
	n  int
	at time.Time
}

// countFor is how long a count is remembered.
const countFor = time.Second

// NewReplicaCounts returns a ReplicaCounts that remembers nothing yet.
func NewReplicaCounts() *ReplicaCounts {
	return &ReplicaCounts{seen: map[string]counted{}, now: time.Now}
}

// Count is KnownReplicas of conn's server, the master at addr, as counted
// within the last second, else counted now.
func (rc *ReplicaCounts) Count(ctx context.Context, conn *redis.Conn, addr string) (int, error) {
	rc.mu.Lock()
	c, ok := rc.seen[addr]
	rc.mu.Unlock()
	if ok && rc.now().Sub(c.at) < countFor {
		return c.n, nil
	}
	n, err := KnownReplicas(ctx, conn)
	if err != nil {
		return 0, err
	}
	rc.mu.Lock()
	rc.seen[addr] = counted{n: n, at: rc.now()}
	rc.mu.Unlock()
	return n, nil
}

// refused reports whether err is the server's refusal of a command (an
// error reply: cluster support disabled, a command it does not know), not
// a failure to reach it. (redis.HasErrorPrefix cannot tell: it drops a
// leading "ERR " before comparing.)
func refused(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}
