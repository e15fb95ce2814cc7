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
// A master found alone is asked CLUSTER REPLICAS again on each write,
// without WAIT (which would wait its whole timeout for replicas that do
// not exist); once it lists a replica, WAIT is asked again. A master not
// seen alone for a second is forgotten.
type Replicas struct {
	mu    sync.Mutex
	alone map[string]time.Time // master address -> when last found alone
	now   func() time.Time
	count atomic.Int64
}

// aloneFor is how long a master found with no replica is remembered.
const aloneFor = time.Second

// NewReplicas returns a Replicas with no master known alone.
func NewReplicas() *Replicas { return &Replicas{alone: map[string]time.Time{}, now: time.Now} }

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
	if r != nil && r.knownAlone(addr) {
		if none, err := noReplica(ctx, conn); err == nil && none {
			return r.confirmAlone(addr, 0), nil
		}
		r.forget(addr)
	}
	n, err := conn.Wait(ctx, want, timeout).Result()
	if err != nil || n >= int64(want) || r == nil {
		return Confirmation{Acked: n}, err
	}
	if none, err := noReplica(ctx, conn); err != nil || !none {
		return Confirmation{Acked: n}, nil // short, as WAIT said
	}
	return r.confirmAlone(addr, n), nil
}

// AloneWrites counts the writes confirmed by a master alone (0 for a nil
// Replicas).
func (r *Replicas) AloneWrites() int64 {
	if r == nil {
		return 0
	}
	return r.count.Load()
}

func (r *Replicas) confirmAlone(addr string, acked int64) Confirmation {
	r.mu.Lock()
	r.alone[addr] = r.now()
	r.mu.Unlock()
	r.count.Add(1)
	return Confirmation{Acked: acked, Alone: true}
}

func (r *Replicas) knownAlone(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.alone[addr]
	if ok && r.now().Sub(at) >= aloneFor {
		delete(r.alone, addr)
		return false
	}
	return ok
}

func (r *Replicas) forget(addr string) {
	r.mu.Lock()
	delete(r.alone, addr)
	r.mu.Unlock()
}

// noReplica reports whether conn's server is a cluster master of which
// the cluster knows no replica; false on a server that is not in a
// cluster.
func noReplica(ctx context.Context, conn *redis.Conn) (bool, error) {
	id, err := conn.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		if refused(err) {
			return false, nil // cluster support disabled: WAIT decides
		}
		return false, err
	}
	rs, err := conn.Do(ctx, "cluster", "replicas", id).Slice()
	if err != nil {
		return false, err
	}
	return len(rs) == 0, nil
}

// KnownReplicas counts the replicas of conn's server that could take its
// place: on a cluster every replica the cluster lists for it (CLUSTER
// REPLICAS: a disconnected one too, it could still be promoted), else the
// replicas connected to it (ROLE). A server that answers neither (an
// embedded one) has none.
func KnownReplicas(ctx context.Context, conn *redis.Conn) (int, error) {
	id, err := conn.Do(ctx, "cluster", "myid").Text()
	if err == nil {
		rs, err := conn.Do(ctx, "cluster", "replicas", id).Slice()
		return len(rs), err
	}
	if !refused(err) {
		return 0, err
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

// refused reports whether err is the server's refusal of a command (an
// error reply: cluster support disabled, a command it does not know), not
// a failure to reach it. (redis.HasErrorPrefix cannot tell: it drops a
// leading "ERR " before comparing.)
func refused(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}
