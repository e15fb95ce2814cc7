package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// Locks is the per-buyer lock the worker holds while it writes a buyer's
// order: the one-order-per-user lock of the classic design. It sits in front
// of the database's unique key, which stays the real guarantee (a lock can
// expire under a pause). With several independent Redis nodes it is a
// Redlock: a lock is held when a majority granted it.
//
// A held lock is a redsync Mutex (v4) whose value is the order's
// ("order:<id>", redsync.WithValue): redsync releases it (UnlockContext)
// and the watchdog extends it (ExtendContext), and a redsync Mutex of the
// same name excludes it and is excluded by it. Only the take is not
// redsync's own: a batch takes all its locks in one script call per node
// (lua/lock_take.lua), each lock set as redsync's Lock sets one (SET NX PX
// with the Mutex's value), held when a majority granted it within the
// expiry less the time taken and redsync's drift allowance, where redsync
// sends one SET NX per lock and node. On a Redis Cluster (the sale's
// Redis, when SECKILL_LOCK_NODES is empty) the keys lie in many slots:
// there the script runs once per key, the calls of a batch in one pipeline.
// redsync's commands (release, extend, give-back) go through pipePool, so
// the hundreds of a batch share pipelines.
type Locks struct {
	nodes  []redis.UniversalClient
	rs     *redsync.Redsync   // over every node: the held locks
	one    []*redsync.Redsync // one per node: grants given back on the node that made them
	ttl    time.Duration
	quorum int
	log    *slog.Logger
	take   *redis.Script
	// late counts the goroutines still waiting for nodes a take did not
	// wait for (giveBackLate), or giving back on a node that failed.
	late sync.WaitGroup
}

// NewLocks returns the locks on the given nodes (one, or several
// independent ones). ttl bounds how long a crashed holder blocks a buyer;
// the watchdog extends it while a write runs.
func NewLocks(nodes []redis.UniversalClient, ttl time.Duration, log *slog.Logger) *Locks {
	pools := make([]rsredis.Pool, len(nodes))
	one := make([]*redsync.Redsync, len(nodes))
	for i, n := range nodes {
		pools[i] = newPipePool(n)
		one[i] = redsync.New(pools[i])
	}
	return &Locks{
		nodes: nodes, rs: redsync.New(pools...), one: one,
		ttl: cmp.Or(ttl, 10*time.Second), quorum: len(nodes)/2 + 1, log: log,
		take: lua.LockTake(),
	}
}

// mutex is the redsync Mutex of the lock key with value: its Unlock and
// Extend act on the lock lock_take.lua set for that value (a Lock of it
// would set the same value). Fail-fast: it answers once a majority decided,
// as the take does.
func (l *Locks) mutex(rs *redsync.Redsync, key, value string) *redsync.Mutex {
	return rs.NewMutex(key, redsync.WithExpiry(l.ttl), redsync.WithTries(1), redsync.WithFailFast(true),
		redsync.WithValue(value), redsync.WithGenValueFunc(func() (string, error) { return value, nil }))
}

// driftFactor is redsync's allowance for clock drift: a lock taken counts
// as held for its expiry less the time the taking took and less this share
// of the expiry.
const driftFactor = 0.01

// maxLockKeys bounds the keys of one script call, so one call holds a node
// up briefly however large the batch.
const maxLockKeys = 512

// nodeAnswer is one node's answer for every key of a call: granted[i]
// when it holds key i with its value now; err when it could not be asked.
type nodeAnswer struct {
	granted []bool
	err     error
}

// tryAll tries each lock once, without waiting, all at once. The value of
// lock i is values[i]: the order it is taken for, so a lock left behind by
// an earlier try of the same order (a batch that failed before its
// release) is taken over instead of waited out. held[i] is the lock's
// Mutex when a majority of the nodes granted it in time, nil when not
// while some node answered that another order holds it (a conflict): the
// nodes that granted it give it back, as redsync does. An error means a
// node failed and no conclusion can be drawn for some lock; whatever was
// taken is given back.
func (l *Locks) tryAll(ctx context.Context, keys, values []string) ([]*redsync.Mutex, error) {
	held := make([]*redsync.Mutex, len(keys))
	start := time.Now()
	answers, late := l.onNodes(ctx, keys, values)
	defer l.giveBackLate(late, keys, values, held)
	inTime := time.Since(start) < l.ttl-time.Duration(float64(l.ttl)*driftFactor)
	back := make([][]int, len(l.nodes)) // per node, the grants given back
	var failed error
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
			held[i] = l.mutex(l.rs, keys[i], values[i])
			continue
		case refused == 0 && granted < l.quorum:
			// Only failed nodes stand between this lock and a majority.
			clear(held)
			l.giveBackAll(context.WithoutCancel(ctx), answers, keys, values)
			return nil, fmt.Errorf("take buyer locks: %w", failed)
		}
		for n, a := range answers {
			if a.err == nil && a.granted[i] {
				back[n] = append(back[n], i)
			}
		}
	}
	var wg sync.WaitGroup
	for n, idx := range back {
		if len(idx) > 0 {
			wg.Go(func() { l.giveBack(context.WithoutCancel(ctx), n, keys, values, idx) })
		}
	}
	wg.Wait()
	return held, nil
}

// giveBackAll gives back, after a failed try, every grant of the nodes
// that answered; a node that failed may have granted some before it
// failed: it is asked to give back every key in the background (a dead
// node refuses at once, a hung one ends by the client's timeouts). Nodes
// not waited for are giveBackLate's.
func (l *Locks) giveBackAll(ctx context.Context, answers []nodeAnswer, keys, values []string) {
	all := make([]int, len(keys))
	for i := range all {
		all[i] = i
	}
	var wg sync.WaitGroup
	for n, a := range answers {
		switch {
		case errors.Is(a.err, errNoAnswer):
		case a.err != nil:
			l.late.Go(func() { l.giveBack(ctx, n, keys, values, all) })
		default:
			var idx []int
			for i, g := range a.granted {
				if g {
					idx = append(idx, i)
				}
			}
			if len(idx) > 0 {
				wg.Go(func() { l.giveBack(ctx, n, keys, values, idx) })
			}
		}
	}
	wg.Wait()
}

// giveBack releases locks idx (of keys) on node n alone, each by redsync's
// Unlock of a Mutex on that node with the lock's value: deleted only where
// the key still holds it. A grant not given back expires.
func (l *Locks) giveBack(ctx context.Context, n int, keys, values []string, idx []int) {
	var wg sync.WaitGroup
	for _, i := range idx {
		wg.Go(func() {
			m := l.mutex(l.one[n], keys[i], values[i])
			if _, err := m.UnlockContext(ctx); err != nil && !errors.Is(err, redsync.ErrLockAlreadyExpired) {
				l.log.Debug("buyer lock grant not given back; it expires", "lock", keys[i], "err", err)
			}
		})
	}
	wg.Wait()
}

// giveBackLate waits, in the background, for the nodes a take did not wait
// for, and gives back on each the locks it granted that the batch does not
// hold: without it a late grant would stay until it expires, and a few
// such on different nodes could keep a key from any majority. (A late
// grant of a lock the batch holds is released with the batch's; should
// that release reach the node first, the lock stays there until it
// expires, with the order's own value: its retry takes it over.) held is
// read once tryAll has returned.
func (l *Locks) giveBackLate(late lateAnswers, keys, values []string, held []*redsync.Mutex) {
	if late.n == 0 {
		return
	}
	l.late.Go(func() {
		for range late.n {
			r := <-late.ch
			if r.a.err != nil {
				continue
			}
			var idx []int
			for i, g := range r.a.granted {
				if g && held[i] == nil {
					idx = append(idx, i)
				}
			}
			if len(idx) > 0 {
				l.giveBack(context.Background(), r.node, keys, values, idx)
			}
		}
	})
}

// onNodes runs lock_take.lua on every node at once over keys, and returns each
// node's answer once they decide every key (decided), as redsync's fail-fast
// returns: a dead or slow node then holds up no batch while a majority
// answers. A node that has not answered by then reads errNoAnswer; its call
// goes on, ends by the client's timeouts, and its answer comes on late.
func (l *Locks) onNodes(ctx context.Context, keys, values []string) ([]nodeAnswer, lateAnswers) {
	answers := make([]nodeAnswer, len(l.nodes))
	if len(l.nodes) == 1 {
		answers[0] = l.onNode(ctx, l.nodes[0], keys, values)
		return answers, lateAnswers{}
	}
	ch := make(chan nodeResult, len(l.nodes))
	for i, n := range l.nodes {
		go func() { ch <- nodeResult{i, l.onNode(ctx, n, keys, values)} }()
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

// onNode runs lock_take.lua on one node over keys: one call for them all
// (at most maxLockKeys a call), or on a Redis Cluster one call per key; the
// calls in one pipeline. The script goes by its hash (EVALSHA); calls the node
// refused for not knowing it (a restarted or flushed node) are sent again
// with its text: they ran nothing.
func (l *Locks) onNode(ctx context.Context, node redis.UniversalClient, keys, values []string) nodeAnswer {
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
		args = append(args, l.ttl.Milliseconds())
		for _, v := range values[lo:hi] {
			args = append(args, v)
		}
		calls = append(calls, call{keys: keys[lo:hi], args: args})
	}
	pipe := node.Pipeline()
	for i := range calls {
		calls[i].cmd = l.take.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx) // each call's answer is read below
	var again redis.Pipeliner
	for i := range calls {
		if redis.HasErrorPrefix(calls[i].cmd.Err(), "NOSCRIPT") {
			if again == nil {
				again = node.Pipeline()
			}
			calls[i].cmd = l.take.Eval(ctx, again, calls[i].keys, calls[i].args...)
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

// lockAnswers decodes the answer of lock_take.lua, the one place that
// does: one 1 or 0 per key.
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

// watch extends the held locks every ttl/3 until stop is called, each by
// redsync's Extend.
func (l *Locks) watch(ctx context.Context, held []*redsync.Mutex) (stop func()) {
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

// extendAll renews every held lock once, all at once, as they were taken:
// one by one, a batch of hundreds would wait a round trip each and the
// last could expire before its turn (together their commands share
// pipelines). A lock a majority did not renew is logged, and the write
// goes on: the database's keys keep it correct without the lock.
func (l *Locks) extendAll(ctx context.Context, held []*redsync.Mutex) {
	var lost atomic.Int64
	var first atomic.Pointer[lostLock]
	var wg sync.WaitGroup
	for _, m := range held {
		if m == nil {
			continue
		}
		wg.Go(func() {
			if ok, err := m.ExtendContext(ctx); !ok {
				lost.Add(1)
				first.CompareAndSwap(nil, &lostLock{m.Name(), err})
			}
		})
	}
	wg.Wait()
	if f := first.Load(); f != nil && ctx.Err() == nil {
		l.log.Warn("buyer locks could not be extended", "locks", lost.Load(), "first", f.name, "err", f.err)
	}
}

// lostLock is the first lock an extension did not renew, for the log.
type lostLock struct {
	name string
	err  error
}

// release unlocks what is held, each lock by redsync's Unlock, all at once
// (their commands share pipelines). A lock that expired and was taken by
// someone else is left alone: redsync deletes only its own value. A lock
// not released expires.
func (l *Locks) release(ctx context.Context, held []*redsync.Mutex) {
	var wg sync.WaitGroup
	for _, m := range held {
		if m == nil {
			continue
		}
		wg.Go(func() {
			if _, err := m.UnlockContext(ctx); err != nil && !errors.Is(err, redsync.ErrLockAlreadyExpired) {
				l.log.Debug("buyer lock not released; it expires", "lock", m.Name(), "err", err)
			}
		})
	}
	wg.Wait()
}
