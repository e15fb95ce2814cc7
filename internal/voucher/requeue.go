package voucher

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Requeued is what lua/requeue.lua did with an order (its header lists
// the answers).
type Requeued uint8

const (
	// RequeueQueued: back on its shard's stream, for the worker to write.
	RequeueQueued Requeued = iota
	// RequeuePending: on its way to the database already; nothing written.
	RequeuePending
	// RequeueNotHeld: Redis no longer holds it (its buyer entry names
	// another order, or none); nothing written.
	RequeueNotHeld
	// RequeueNotReady: its shard is being rebuilt; nothing written.
	RequeueNotReady
	// RequeueBadKeys: a key of its shard holds another type than the
	// script reads; nothing written.
	RequeueBadKeys
)

var requeuedNames = [...]string{"queued", "pending", "not_held", "not_ready", "bad_keys"}

func (r Requeued) String() string { return requeuedNames[r] }

// Requeue queues again, each as its purchase did, orders the database lost
// while Redis still holds them (a failover: package failover's heal), one
// script call each in one pipeline: the worker then writes them through
// its own path and guards. Each message is marked Healed. It returns what
// became of each, in order; a call that failed is an error for the whole
// (what the others did is then unknown, and each is safe to send again).
func (s *State) Requeue(ctx context.Context, ms []Message) ([]Requeued, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(ms))
	for i, m := range ms {
		m.Healed = true
		shard := s.keys.BucketShard(m.VoucherID, m.Bucket, m.Buckets)
		keys := []string{s.keys.Ready(shard), s.keys.BuyersAt(shard, m.VoucherID), s.keys.Stream(shard), s.keys.Pending(shard)}
		args := []any{m.UserID, m.OrderID, m.VoucherID}
		for _, f := range m.Fields() {
			args = append(args, f)
		}
		cmds[i] = s.requeue.Eval(ctx, pipe, keys, args...)
	}
	_, _ = pipe.Exec(ctx) // each command's answer is read below
	out := make([]Requeued, len(ms))
	for i, c := range cmds {
		n, err := c.Int()
		if err != nil {
			return nil, fmt.Errorf("requeue order %d: %w", ms[i].OrderID, err)
		}
		if n < 0 || n >= len(requeuedNames) {
			return nil, fmt.Errorf("requeue order %d: answer %s", ms[i].OrderID, strconv.Itoa(n))
		}
		out[i] = Requeued(n)
	}
	return out, nil
}
