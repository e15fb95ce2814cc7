package redisconn

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replicas confirms writes with WAIT, and applies the policy for a master
// that has no replica at all (a replica promoted after its master died,
// before another is attached): a write such a master holds cannot be lost
// to a failover, since nothing can take its place, so WAIT is not asked
// of it and the write counts as confirmed by the master alone (Alone).
// Only that master's own loss can lose it, as with no WAIT; the service
// counts such writes (Alone) for a metric and an alert, and an operator
// attaches a replica.
//
// "No replica" is what the server says: on a Redis Cluster, CLUSTER
// REPLICAS of the master lists none (a replica that is down but known
// still counts); elsewhere INFO replication says connected_slaves:0. A
// master found alone is not asked WAIT again for a second.
type Replicas struct {
	mu    sync.Mutex
	alone map[string]time.Time // master address -> when found alone
	now   func() time.Time
	count atomic.Int64
}

// aloneFor is how long a master found with no replica is taken as alone.
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

// Confirm asks WAIT want on conn, the connection that made the writes,
// to master addr, bounded by timeout; when fewer replicas answer, it asks
// the master whether it has any. A nil Replicas only sends WAIT.
func (r *Replicas) Confirm(ctx context.Context, conn *redis.Conn, addr string, want int, timeout time.Duration) (Confirmation, error) {
	if r != nil && r.knownAlone(addr) {
		r.count.Add(1)
		return Confirmation{Alone: true}, nil
	}
	n, err := conn.Wait(ctx, want, timeout).Result()
	if err != nil || n >= int64(want) || r == nil {
		return Confirmation{Acked: n}, err
	}
	none, err := noReplica(ctx, conn)
	if err != nil || !none {
		return Confirmation{Acked: n}, nil // short, as WAIT said
	}
	r.mu.Lock()
	r.alone[addr] = r.now()
	r.mu.Unlock()
	r.count.Add(1)
	return Confirmation{Acked: n, Alone: true}, nil
}

// AloneWrites counts the writes confirmed by a master alone.
func (r *Replicas) AloneWrites() int64 { return r.count.Load() }

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

// noReplica asks conn's server whether any replica could take its place.
func noReplica(ctx context.Context, conn *redis.Conn) (bool, error) {
	id, err := conn.Do(ctx, "cluster", "myid").Text()
	if err == nil {
		rs, err := conn.Do(ctx, "cluster", "replicas", id).Slice()
		if err != nil {
			return false, err
		}
		return len(rs) == 0, nil
	}
	info, err := conn.Info(ctx, "replication").Result()
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "connected_slaves:"); ok {
			n, err := strconv.Atoi(v)
			return err == nil && n == 0, err
		}
	}
	return false, nil
}
