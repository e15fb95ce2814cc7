package order

import (
	"context"
	"strings"
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
// lock calls share pipelines: whatever arrives while the node's pipelines
// are on the wire goes out together in the next one. A lone call goes out
// at once, so nothing waits for company.
type pipePool struct {
	c redis.UniversalClient

	mu      sync.Mutex
	queue   []*pipeCall
	senders int // goroutines sending pipelines now, at most maxSenders
}

const (
	// maxSenders bounds the pipelines on the wire to one node at a time;
	// they are the connections the locks use.
	maxSenders = 4
	// maxPipe bounds one pipeline, so one slow reply holds up few locks.
	maxPipe = 512
)

// pipeCall is one command waiting for its pipeline. script is set for an
// EVALSHA, to send the script's text when the node does not know it.
type pipeCall struct {
	cmd    redis.Cmder
	script *rsredis.Script
	keys   []string
	args   []any
	done   chan struct{}
}

func newPipePool(c redis.UniversalClient) *pipePool { return &pipePool{c: c} }

// Get returns a connection bound to ctx: a call returns when its reply
// came or ctx ended.
func (p *pipePool) Get(ctx context.Context) (rsredis.Conn, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	return &pipeConn{p: p, ctx: ctx}, nil
}

// do queues call and waits for its reply. A sender is started when fewer
// than maxSenders run; a running one picks the call up otherwise.
func (p *pipePool) do(ctx context.Context, call *pipeCall) error {
	call.done = make(chan struct{})
	p.mu.Lock()
	p.queue = append(p.queue, call)
	start := p.senders < maxSenders
	if start {
		p.senders++
	}
	p.mu.Unlock()
	if start {
		go p.send()
	}
	select {
	case <-call.done:
		return nil
	case <-ctx.Done():
		// The command may still run; a lock it takes expires with its
		// TTL, as with any reply lost on the way.
		return ctx.Err()
	}
}

// send sends the queued calls in pipelines until the queue is empty.
// Calls whose callers gave up are still sent: their replies are simply not
// read. The client's own timeouts bound a pipeline to a node that hangs.
func (p *pipePool) send() {
	ctx := context.Background()
	for {
		p.mu.Lock()
		n := min(len(p.queue), maxPipe)
		if n == 0 {
			p.senders--
			p.mu.Unlock()
			return
		}
		batch := make([]*pipeCall, n)
		copy(batch, p.queue)
		p.queue = append(p.queue[:0], p.queue[n:]...)
		p.mu.Unlock()

		p.exec(ctx, batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// exec sends one pipeline and, for scripts the node did not know (it was
// restarted or flushed), a second one with their text.
func (p *pipePool) exec(ctx context.Context, batch []*pipeCall) {
	pipe := p.c.Pipeline()
	for _, c := range batch {
		_ = pipe.Process(ctx, c.cmd)
	}
	// Each command carries its own error; Exec's is the first of them.
	_, _ = pipe.Exec(ctx)

	var retry []*pipeCall
	for _, c := range batch {
		if c.script != nil && c.cmd.Err() != nil && strings.HasPrefix(c.cmd.Err().Error(), "NOSCRIPT") {
			retry = append(retry, c)
		}
	}
	if len(retry) == 0 {
		return
	}
	pipe = p.c.Pipeline()
	for _, c := range retry {
		c.cmd = pipe.Eval(ctx, c.script.Src, c.keys, c.args...)
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
	if err := c.p.do(c.ctx, &pipeCall{cmd: cmd}); err != nil {
		return false, err
	}
	ok, err := cmd.Result()
	return ok, noNil(err)
}

func (c *pipeConn) Eval(script *rsredis.Script, keysAndArgs ...any) (any, error) {
	keys := make([]string, script.KeyCount)
	for i := range keys {
		keys[i] = keysAndArgs[i].(string)
	}
	args := keysAndArgs[script.KeyCount:]
	cmdArgs := make([]any, 0, 3+len(keysAndArgs))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	call := &pipeCall{cmd: redis.NewCmd(c.ctx, cmdArgs...), script: script, keys: keys, args: args}
	if err := c.p.do(c.ctx, call); err != nil {
		return nil, err
	}
	v, err := call.cmd.(*redis.Cmd).Result()
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
