package redisconn

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
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
// "No replica" is what the cluster agrees on, not the master's own view:
// the master's CLUSTER REPLICAS lists none, and a majority of the
// masters (it among them) see it as a master that serves slots, is not
// failing, and has no node replicating it (CLUSTER NODES of each other
// master, a vote). A node with a stale view of itself (an old master
// back from a restart, serving its former slots until it hears it was
// replaced) is a replica or slotless to the others: it never confirms
// alone. A replica that is down or disconnected but known still counts
// (it could be promoted), and then WAIT decides. On one server (no
// cluster) a replica may be promoted by something the server does not
// know of (Sentinel), so WAIT always decides there.
//
// A master found alone is asked CLUSTER REPLICAS of its node id again on
// each write (one round trip, as WAIT would be), without WAIT (which would
// wait its whole timeout for replicas that do not exist), and the vote is
// held again once a second; once it lists a replica, no longer knows that
// id (another node at its address), or loses the vote, WAIT is asked
// again. A master not seen alone for a second is forgotten.
type Replicas struct {
	peers Peers
	mu    sync.Mutex
	alone map[string]lone // master address -> the node found alone there
	count atomic.Int64
	// votes shares the vote under way per master address and node: the
	// writes that find the vote stale at once wait for one vote instead of
	// each asking every master. asking counts the writes that joined a
	// vote and wait for it (tests).
	votes  singleflight.Group
	asking atomic.Int64
}

// lone is a master found with no replica: its node id, when a write was
// last confirmed by it alone, and when the vote agreed.
type lone struct {
	id        string
	at, voted time.Time
}

// aloneFor is how long a master found with no replica is remembered, and
// how long a vote holds.
const aloneFor = time.Second

// voteWait bounds a vote: masters that have not answered by then are left
// out of it (a vote lost, as when they do not answer at all).
const voteWait = 2 * time.Second

// Peers reads the cluster as the masters other than the one at addr see
// it (CLUSTER NODES of each; one that does not answer is left out), and
// counts the masters, that one included.
type Peers func(ctx context.Context, addr string) (views []string, masters int)

// ClusterPeers asks the masters of rdb's slot map; nil (no vote, so no
// master is ever taken for alone) when rdb is not a cluster client.
func ClusterPeers(rdb redis.UniversalClient) Peers {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	return func(ctx context.Context, addr string) ([]string, int) {
		var (
			mu     sync.Mutex
			views  []string
			others int
		)
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if c.Options().Addr == addr {
				return nil
			}
			v, err := c.ClusterNodes(ctx).Result()
			mu.Lock()
			defer mu.Unlock()
			others++
			if err == nil {
				views = append(views, v)
			}
			return nil
		})
		return views, others + 1
	}
}

// NewReplicas returns a Replicas with no master known alone, whose votes
// ask peers.
func NewReplicas(peers Peers) *Replicas {
	return &Replicas{peers: peers, alone: map[string]lone{}}
}

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
	if l, ok := r.knownAlone(addr); ok {
		rs, err := conn.Do(ctx, "cluster", "replicas", l.id).Slice()
		voted := l.voted
		if err == nil && len(rs) == 0 && time.Since(voted) >= aloneFor && r.agreed(ctx, addr, l.id) {
			voted = time.Now()
		}
		if err == nil && len(rs) == 0 && time.Since(voted) < aloneFor {
			return r.confirmAlone(addr, l.id, 0, voted), nil
		}
		r.forget(addr)
	}
	n, err := conn.Wait(ctx, want, timeout).Result()
	if err != nil || n >= int64(want) || r == nil {
		return Confirmation{Acked: n}, err
	}
	id, replicas, err := clusterReplicas(ctx, conn)
	if err != nil || id == "" || replicas > 0 || !r.agreed(ctx, addr, id) {
		return Confirmation{Acked: n}, nil // short, as WAIT said
	}
	return r.confirmAlone(addr, id, n, time.Now()), nil
}

// agreed holds the vote: whether a majority of the masters, the one at
// addr (node id) among them, see that node as a master with slots, not
// failing, that no node replicates. Concurrent callers for the same node
// share one vote; one whose context ends first takes no for an answer.
func (r *Replicas) agreed(ctx context.Context, addr, id string) bool {
	if r.peers == nil {
		return false
	}
	// The vote runs in a context of its own, bounded by voteWait: a write
	// whose context ends leaves it to the others and takes no for an
	// answer.
	ch := r.votes.DoChan(addr+" "+id, func() (any, error) {
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), voteWait)
		defer cancel()
		views, masters := r.peers(vctx, addr)
		return Agreed(id, views, masters), nil
	})
	r.asking.Add(1)
	defer r.asking.Add(-1)
	select {
	case res := <-ch:
		return res.Val.(bool)
	case <-ctx.Done():
		return false
	}
}

// Agreed counts the votes that node id has no replica: its own (it asked
// CLUSTER REPLICAS of itself) and each view (a CLUSTER NODES answer of
// another master) in which it is a master serving slots, not failing. It
// reports whether they are a majority of masters and no view names a
// replica of it (one that any master knows of could be promoted).
func Agreed(id string, views []string, masters int) bool {
	votes := 1
	for _, v := range views {
		alone, replicated := seesAlone(v, id)
		if replicated {
			return false
		}
		if alone {
			votes++
		}
	}
	return votes > masters/2
}

// seesAlone reads one CLUSTER NODES answer: "<id> <addr> <flags>
// <master id> <ping> <pong> <epoch> <link> [slot ...]" per node.
func seesAlone(view, id string) (alone, replicated bool) {
	for line := range strings.Lines(view) {
		f := strings.Fields(line)
		switch {
		case len(f) < 8:
		case f[3] == id:
			return false, true // a replica of it, connected or not
		case f[0] == id:
			flags := "," + f[2] + ","
			alone = strings.Contains(flags, ",master,") && !strings.Contains(flags, "fail") &&
				!strings.Contains(flags, "noaddr") && len(f) > 8
		}
	}
	return alone, false
}

// AloneWrites counts the writes confirmed by a master alone (0 for a nil
// Replicas).
func (r *Replicas) AloneWrites() int64 {
	if r == nil {
		return 0
	}
	return r.count.Load()
}

func (r *Replicas) confirmAlone(addr, id string, acked int64, voted time.Time) Confirmation {
	r.mu.Lock()
	r.alone[addr] = lone{id: id, at: time.Now(), voted: voted}
	r.mu.Unlock()
	r.count.Add(1)
	return Confirmation{Acked: acked, Alone: true}
}

// knownAlone is the master at addr when it was found alone within
// aloneFor (never for a nil Replicas).
func (r *Replicas) knownAlone(addr string) (lone, bool) {
	if r == nil {
		return lone{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.alone[addr]
	if ok && time.Since(l.at) >= aloneFor {
		delete(r.alone, addr)
		return lone{}, false
	}
	return l, ok
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
