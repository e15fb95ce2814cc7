package order

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/redis/go-redis/v9"
)

// pipePool is the redsync pool of one lock node. It keeps redsync's lock
// algorithm (values, quorum, drift, its scripts) and changes only how the
// commands travel: a batch takes and releases hundreds of locks at once,
// one command per lock, and sent one by one each costs a round trip, a
// pool connection and two system calls. Here the commands of concurrent
// lock calls share pipelines: whatever arrives while a pipeline is on the
// wire goes out together in the next one. A lone call goes out at once, so
// nothing waits for company.
//
// Two rules keep the commands of one key in the order they were given, as
// on a single connection:
//   - a key always travels in the same lane, and a lane sends one pipeline
//     at a time, in arrival order;
//   - a caller that gives up (its context ended) before its command was
//     sent takes the command back; once sent, it waits for the reply.
//
// Without them a release that a caller gave up on could reach Redis after
// a later take of the same lock and delete it.
type pipePool struct {
	c     redis.UniversalClient
	seed  maphash.Seed
	lanes [pipeLanes]pipeLane
}

const (
	// pipeLanes bounds the pipelines on the wire to one node at a time;
	// they are the connections the locks use.
	pipeLanes = 4
	// maxPipe bounds one pipeline, so one slow reply holds up few locks.
	maxPipe = 512
)

// pipeLane is a queue of calls and at most one goroutine sending them.
type pipeLane struct {
	mu      sync.Mutex
	queue   []*pipeCall
	sending bool
}

// pipeCall is one command waiting for its pipeline.
type pipeCall struct {
	cmd  redis.Cmder
	done chan struct{}
	sent bool // taken into a pipeline; guarded by the lane's mu
}

func newPipePool(c redis.UniversalClient) *pipePool { return &pipePool{c: c, seed: maphash.MakeSeed()} }

// Get returns a connection bound to ctx.
func (p *pipePool) Get(ctx context.Context) (rsredis.Conn, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	return &pipeConn{p: p, ctx: ctx}, nil
}

// do queues call in key's lane and waits for its reply. It returns ctx's
// error only when the command was never sent.
func (p *pipePool) do(ctx context.Context, key string, call *pipeCall) error {
	l := &p.lanes[maphash.String(p.seed, key)%pipeLanes]
	call.done = make(chan struct{})
	l.mu.Lock()
	// Checked under the lane's lock: a caller that moved on (and may have
	// queued a later command of this key since) never queues this one.
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.queue = append(l.queue, call)
	start := !l.sending
	l.sending = true
	l.mu.Unlock()
	if start {
		go p.send(l)
	}
	select {
	case <-call.done:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if !call.sent {
		l.queue = deleteCall(l.queue, call)
		l.mu.Unlock()
		return ctx.Err()
	}
	l.mu.Unlock()
	// On the wire: its reply decides, as with a plain client. The
	// client's read timeout bounds the wait.
	<-call.done
	return nil
}

// deleteCall removes call from q, keeping the order of the rest.
func deleteCall(q []*pipeCall, call *pipeCall) []*pipeCall {
	for i, c := range q {
		if c == call {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			return q[:len(q)-1]
		}
	}
	return q
}

// send sends the lane's queued calls, a pipeline at a time, until the
// queue is empty. The client's own timeouts bound a pipeline to a node
// that hangs.
func (p *pipePool) send(l *pipeLane) {
	ctx := context.Background()
	for {
		l.mu.Lock()
		n := min(len(l.queue), maxPipe)
		if n == 0 {
			l.sending = false
			l.mu.Unlock()
			return
		}
		batch := make([]*pipeCall, n)
		copy(batch, l.queue)
		for _, c := range batch {
			c.sent = true
		}
		rest := copy(l.queue, l.queue[n:])
		clear(l.queue[rest:])
		l.queue = l.queue[:rest]
		l.mu.Unlock()

		p.exec(ctx, batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// exec sends one pipeline. Each command carries its own error; Exec's is
// the first of them.
func (p *pipePool) exec(ctx context.Context, batch []*pipeCall) {
	pipe := p.c.Pipeline()
	for _, c := range batch {
		_ = pipe.Process(ctx, c.cmd)
	}
	_, _ = pipe.Exec(ctx)
}

// pipeConn is what redsync calls a connection: the commands of the lock
// path (SET NX, the release and extend scripts) go through the pipelines,
// the rest straight to the client.
type pipeConn struct {
	p   *pipePool
	ctx context.Context
}

func (c *pipeConn) SetNX(name, value string, expiry time.Duration) (bool, error) {
	cmd := redis.NewBoolCmd(c.ctx, "set", name, value, "px", expiry.Milliseconds(), "nx")
	if err := c.p.do(c.ctx, name, &pipeCall{cmd: cmd}); err != nil {
		return false, err
	}
	ok, err := cmd.Result()
	return ok, noNil(err)
}

// Eval sends the script's text (EVAL), not its hash: a node that was
// restarted or flushed would refuse an EVALSHA, and sending it again after
// the rest of its pipeline had run would put it after later commands of
// its key. Redis caches the script by its text; the price is its bytes.
func (c *pipeConn) Eval(script *rsredis.Script, keysAndArgs ...any) (any, error) {
	cmdArgs := make([]any, 0, 3+len(keysAndArgs))
	cmdArgs = append(cmdArgs, "eval", script.Src, script.KeyCount)
	cmdArgs = append(cmdArgs, keysAndArgs...)
	lane := ""
	if script.KeyCount > 0 {
		lane, _ = keysAndArgs[0].(string) // redsync's scripts take the lock's key first
	}
	cmd := redis.NewCmd(c.ctx, cmdArgs...)
	if err := c.p.do(c.ctx, lane, &pipeCall{cmd: cmd}); err != nil {
		return nil, err
	}
	v, err := cmd.Result()
	return v, noNil(err)
}

func (c *pipeConn) Get(name string) (string, error) {
	v, err := c.p.c.Get(c.ctx, name).Result()
	return v, noNil(err)
}

func (c *pipeConn) Set(name, value string) (bool, error) {
	v, err := c.p.c.Set(c.ctx, name, value, 0).Result()
	return v == "OK", err
}

func (c *pipeConn) PTTL(name string) (time.Duration, error) {
	return c.p.c.PTTL(c.ctx, name).Result()
}

func (c *pipeConn) ScriptLoad(script *rsredis.Script) error {
	h, err := c.p.c.ScriptLoad(c.ctx, script.Src).Result()
	if err == nil {
		script.Hash = h
	}
	return err
}

func (c *pipeConn) Close() error { return nil }

// noNil turns Redis's nil reply (SET NX refused, GET of a missing key) into
// no error, as redsync expects.
func noNil(err error) error {
	if err == redis.Nil {
		return nil
	}
	return err
}
