package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// Locks is the per-buyer lock the worker holds while it writes a buyer's
// order: the one-order-per-user lock of the classic design. It sits in front
// of the database's unique key, which stays the real guarantee (a lock can
// expire under a pause). With several independent Redis nodes it is a
// Redlock: a lock is held when a majority granted it.
//
// Each lock is what redsync's Mutex holds (its algorithm, v4): a string
// key with the value of the order it is taken for ("order:<id>", as with
// redsync.WithValue), an expiry in milliseconds, set only where the key is
// absent; a majority of the nodes within the expiry less the time taken and
// redsync's drift allowance; released and extended only where the key still
// holds the value. So a redsync Mutex of the same name excludes these locks
// and is excluded by them, and redsync's Unlock and Extend of a Mutex with
// the lock's value work on them. What differs is how they travel: a batch
// takes, extends and releases all its locks in one script call per node
// (lua/lock_take.lua, lock_extend.lua, lock_release.lua), where redsync
// sends one command per lock and node. On a Redis Cluster (the sale's
// Redis, when SECKILL_LOCK_NODES is empty) the keys lie in many slots: there
// the script runs once per key, the calls of a batch in one pipeline.
type Locks struct {
	nodes  []redis.UniversalClient
	ttl    time.Duration
	quorum int
	log    *slog.Logger
	take   *redis.Script
	extend *redis.Script
	free   *redis.Script
	// late counts the goroutines still waiting for nodes a take did not
	// wait for (giveBackLate).
	late sync.WaitGroup
}

// NewLocks returns the locks on the given nodes (one, or several
// independent ones). ttl bounds how long a crashed holder blocks a buyer;
// the watchdog extends it while a write runs.
func NewLocks(nodes []redis.UniversalClient, ttl time.Duration, log *slog.Logger) *Locks {
	return &Locks{
		nodes: nodes, ttl: cmp.Or(ttl, 10*time.Second), quorum: len(nodes)/2 + 1, log: log,
		take: lua.LockTake(), extend: lua.LockExtend(), free: lua.LockRelease(),
	}
}

// driftFactor is redsync's allowance for clock drift: a lock taken counts
// as held for its expiry less the time the taking took and less this share
// of the expiry.
const driftFactor = 0.01

// maxLockKeys bounds the keys of one script call, so one call holds a node
// up briefly however large the batch.
const maxLockKeys = 512

// lockSet is a batch's locks: key i with value i, held[i] when the batch
// holds it.
type lockSet struct {
	keys   []string
	values []string
	held   []bool
}

// nodeAnswer is one node's answer for every key of a call: granted[i]
// when it holds key i with its value now; err when it could not be asked.
type nodeAnswer struct {
	granted []bool
	err     error
}

// tryAll tries each lock once, without waiting, all at once. The value of
// lock i is values[i]: the order it is taken for, so a lock left behind by
// an earlier try of the same order (a batch that failed before its
// release) is taken over instead of waited out. A lock is held when a
// majority of the nodes granted it in time; one that is not, where some
// node answered that another order holds it, is a conflict (held[i]
// false), and the nodes that granted it release it, as redsync does. An
// error means a node failed and no conclusion can be drawn for some lock;
// whatever was taken is released.
func (l *Locks) tryAll(ctx context.Context, keys, values []string) (*lockSet, error) {
	set := &lockSet{keys: keys, values: values, held: make([]bool, len(keys))}
	start := time.Now()
	answers, late := l.onNodes(ctx, l.take, true, keys, values)
	defer l.giveBackLate(late, set)
	inTime := time.Since(start) < l.ttl-time.Duration(float64(l.ttl)*driftFactor)
	var failed error
	back := &lockSet{}
	for i := range keys {
		granted, refused := 0, 0
		for _, a := range answers {
			switch {
			case a.err != nil:
				failed = cmp.Or(failed, a.err)
			case a.granted[i]:
				granted++
			default:
				refused++
			}
		}
		switch {
		case granted >= l.quorum && inTime:
			set.held[i] = true
			continue
		case refused == 0 && granted < l.quorum:
			// Only failed nodes stand between this lock and a majority.
			l.release(context.WithoutCancel(ctx), allOf(keys, values))
			return nil, fmt.Errorf("take buyer locks: %w", failed)
		}
		if granted > 0 {
			back.add(keys[i], values[i])
		}
	}
	if len(back.keys) > 0 {
		l.release(context.WithoutCancel(ctx), back)
	}
	return set, nil
}

// allOf is a lockSet holding every key, for a release of whatever a failed
// try may have taken.
func allOf(keys, values []string) *lockSet {
	s := &lockSet{keys: keys, values: values, held: make([]bool, len(keys))}
	for i := range s.held {
		s.held[i] = true
	}
	return s
}

// add appends a held lock to the set.
func (s *lockSet) add(key, value string) {
	s.keys = append(s.keys, key)
	s.values = append(s.values, value)
	s.held = append(s.held, true)
}

// heldOnly is the set's held locks alone, in their order.
func (s *lockSet) heldOnly() *lockSet {
	out := &lockSet{}
	for i, h := range s.held {
		if h {
			out.add(s.keys[i], s.values[i])
		}
	}
	return out
}

// onNodes runs script on every node at once over keys, and returns each
// node's answer once they decide every key (decided), as redsync's fail-fast
// returns: a dead or slow node then holds up no batch while a majority
// answers. A node that has not answered by then reads errNoAnswer; its call
// goes on, ends by the client's timeouts, and its answer comes on late.
// withTTL: the script takes the expiry before the values.
func (l *Locks) onNodes(ctx context.Context, script *redis.Script, withTTL bool, keys, values []string) ([]nodeAnswer, lateAnswers) {
	answers := make([]nodeAnswer, len(l.nodes))
	if len(l.nodes) == 1 {
		answers[0] = l.onNode(ctx, l.nodes[0], script, withTTL, keys, values)
		return answers, lateAnswers{}
	}
	ch := make(chan nodeResult, len(l.nodes))
	for i, n := range l.nodes {
		go func() { ch <- nodeResult{i, l.onNode(ctx, n, script, withTTL, keys, values)} }()
	}
	for i := range answers {
		answers[i].err = errNoAnswer
	}
	got := 0
	for got < len(l.nodes) {
		r := <-ch
		got++
		answers[r.node] = r.a
		if l.decided(answers, len(keys)) {
			break
		}
	}
	return answers, lateAnswers{ch: ch, n: len(l.nodes) - got}
}

// nodeResult is one node's answer.
type nodeResult struct {
	node int
	a    nodeAnswer
}

// lateAnswers are the answers onNodes did not wait for: n of them will
// come on ch, which is buffered for them (left unread, they cost nothing).
type lateAnswers struct {
	ch chan nodeResult
	n  int
}

// giveBackLate waits, in the background, for the nodes a take did not wait
// for, and releases on each the locks it granted that the batch does not
// hold: without it a late grant would stay until it expires, and a few
// such on different nodes could keep a key from any majority. (A late
// grant of a lock the batch holds is released with the batch's; should
// that release reach the node first, the lock stays there until it
// expires, with the order's own value: its retry takes it over.)
func (l *Locks) giveBackLate(late lateAnswers, set *lockSet) {
	if late.n == 0 {
		return
	}
	l.late.Add(1)
	go func() {
		defer l.late.Done()
		for range late.n {
			r := <-late.ch
			if r.a.err != nil {
				continue
			}
			back := &lockSet{}
			for i, g := range r.a.granted {
				if g && !set.held[i] {
					back.add(set.keys[i], set.values[i])
				}
			}
			if len(back.keys) > 0 {
				l.onNode(context.Background(), l.nodes[r.node], l.free, false, back.keys, back.values)
			}
		}
	}()
}

// errNoAnswer stands for the answer of a node not waited for.
var errNoAnswer = errors.New("lock node not waited for: the others decided")

// decided reports whether the answers so far settle every key: a majority
// granted it, or so many refused that no majority can.
func (l *Locks) decided(answers []nodeAnswer, keys int) bool {
	for i := range keys {
		granted, refused := 0, 0
		for _, a := range answers {
			switch {
			case a.err != nil:
			case a.granted[i]:
				granted++
			default:
				refused++
			}
		}
		if granted < l.quorum && refused < len(l.nodes)-l.quorum+1 {
			return false
		}
	}
	return true
}

// onNode runs script on one node over keys: one call for them all (at most
// maxLockKeys a call), or on a Redis Cluster one call per key; the calls
// in one pipeline. The script goes by its hash (EVALSHA); calls the node
// refused for not knowing it (a restarted or flushed node) are sent again
// with its text: they ran nothing.
func (l *Locks) onNode(ctx context.Context, node redis.UniversalClient, script *redis.Script, withTTL bool, keys, values []string) nodeAnswer {
	per := maxLockKeys
	if _, ok := node.(*redis.ClusterClient); ok {
		per = 1
	}
	type call struct {
		keys []string
		args []any
		cmd  *redis.Cmd
	}
	calls := make([]call, 0, (len(keys)+per-1)/per)
	for lo := 0; lo < len(keys); lo += per {
		hi := min(lo+per, len(keys))
		args := make([]any, 0, hi-lo+1)
		if withTTL {
			args = append(args, l.ttl.Milliseconds())
		}
		for _, v := range values[lo:hi] {
			args = append(args, v)
		}
		calls = append(calls, call{keys: keys[lo:hi], args: args})
	}
	pipe := node.Pipeline()
	for i := range calls {
		calls[i].cmd = script.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx) // each call's answer is read below
	var again redis.Pipeliner
	for i := range calls {
		if redis.HasErrorPrefix(calls[i].cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = node.Pipeline()
			}
			calls[i].cmd = script.Eval(ctx, again, calls[i].keys, calls[i].args...)
		}
	}
	if again != nil {
		_, _ = again.Exec(ctx)
	}
	granted := make([]bool, 0, len(keys))
	for _, c := range calls {
		g, err := lockAnswers(c.cmd, len(c.keys))
		if err != nil {
			return nodeAnswer{err: err}
		}
		granted = append(granted, g...)
	}
	return nodeAnswer{granted: granted}
}

// lockAnswers decodes the answer of lock_take.lua, lock_extend.lua or
// lock_release.lua, the one place that does: one 1 or 0 per key.
func lockAnswers(c *redis.Cmd, n int) ([]bool, error) {
	res, err := c.Int64Slice()
	if err != nil {
		return nil, err
	}
	if len(res) != n {
		return nil, fmt.Errorf("lock script answered %d entries for %d keys", len(res), n)
	}
	out := make([]bool, n)
	for i, r := range res {
		out[i] = r == 1
	}
	return out, nil
}

// watch extends the held locks every ttl/3 until stop is called, all of
// them in one call per node, as they were taken.
func (l *Locks) watch(ctx context.Context, set *lockSet) (stop func()) {
	held := set.heldOnly()
	if len(held.keys) == 0 {
		return func() {}
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(l.ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			l.extendAll(wctx, held)
		}
	}()
	return func() { cancel(); <-done }
}

// extendAll renews every lock of held once; a lock a majority did not
// renew is logged, and the write goes on: the database's keys keep it
// correct without the lock.
func (l *Locks) extendAll(ctx context.Context, held *lockSet) {
	answers, _ := l.onNodes(ctx, l.extend, true, held.keys, held.values) // late answers change nothing
	lost, first := 0, ""
	var failed error
	for i, k := range held.keys {
		n := 0
		for _, a := range answers {
			if a.err != nil {
				failed = cmp.Or(failed, a.err)
				continue
			}
			if a.granted[i] {
				n++
			}
		}
		if n < l.quorum {
			lost++
			first = cmp.Or(first, k)
		}
	}
	if lost > 0 && ctx.Err() == nil {
		l.log.Warn("buyer locks could not be extended", "locks", lost, "first", first, "err", failed)
	}
}

// release unlocks what is held. A lock that expired and was taken by
// someone else is left alone: only keys still holding their value are
// deleted. A lock not released expires.
func (l *Locks) release(ctx context.Context, set *lockSet) {
	held := set.heldOnly()
	if len(held.keys) == 0 {
		return
	}
	answers, _ := l.onNodes(ctx, l.free, false, held.keys, held.values) // late answers change nothing
	for _, a := range answers {
		if a.err != nil {
			l.log.Debug("buyer locks not released; they expire", "locks", len(held.keys), "err", a.err)
		}
	}
}
