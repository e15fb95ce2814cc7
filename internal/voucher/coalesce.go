package voucher

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Coalescing sends the purchase scripts of concurrent buyers to Redis
// together, one pipeline per flush, so Redis and the instance make one read
// and one write for many purchases instead of one each. Nobody waits for
// company: a purchase that finds fewer than maxFlights flushes in flight is
// sent at once, alone, on its own goroutine; purchases arriving while every
// flight is busy queue, and the first flight to come back sends up to
// maxBatch of them in its next flush. The batch size follows the load: one
// under a trickle, many under a stampede, with no timer anywhere.
//
// Each purchase keeps its own answer and error: a pipeline carries one
// command per purchase and each command its own reply. A purchase whose
// context ends while it is queued, or before its flush is written, returns
// the context's error and is not sent; once sent, it waits for its reply,
// as a single command does. A flush that fails (connection lost, timeout)
// fails the purchases it carried and only those. On a Redis Cluster the
// client splits the pipeline by node and follows MOVED and ASK replies
// itself.
type coalescer struct {
	rdb        pipeliner
	script     *redis.Script
	maxBatch   int
	maxFlights int

	mu      sync.Mutex
	queue   []*purchaseCall // waiting for a flight; only while every flight is busy
	flights int

	flushes   atomic.Int64
	purchases atomic.Int64
}

// pipeliner is a client that pipelines and loads scripts: *redis.Client,
// *redis.ClusterClient and *redis.Ring are.
type pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

// CoalesceStats counts the pipelines coalescing sent and the purchases they
// carried; Purchases/Flushes is the mean batch size.
type CoalesceStats struct {
	Flushes, Purchases int64
}

// purchaseCall is one purchase on its way through the coalescer. Calls are
// pooled: a stampede reuses them instead of allocating one per purchase.
type purchaseCall struct {
	ctx   context.Context
	args  [13]any // evalsha, digest, numkeys, 5 keys, voucher, user, order[, bucket, nb]
	nargs int     // how many of args the command has
	cmd   *redis.Cmd
	err   error // set instead of cmd when the call was not sent
	// wake gets true when this call leads the next flight (batch holds the
	// calls it flies, this one first), false when its reply is in. Every
	// call gets exactly one false, and a leader a true before it.
	wake  chan bool
	batch []*purchaseCall
	one   [1]*purchaseCall
}

var callPool = sync.Pool{New: func() any { return &purchaseCall{wake: make(chan bool, 1)} }}

func (cl *purchaseCall) release() {
	cl.ctx, cl.cmd, cl.err, cl.batch, cl.one[0] = nil, nil, nil, nil, nil
	clear(cl.args[3:])
	callPool.Put(cl)
}

// do sends cl and returns the script's reply.
func (co *coalescer) do(ctx context.Context, cl *purchaseCall) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cl.ctx = ctx
	co.mu.Lock()
	if co.flights < co.maxFlights {
		co.flights++
		co.mu.Unlock()
		cl.one[0] = cl
		co.fly(cl.one[:])
		<-cl.wake
		return cl.reply()
	}
	co.queue = append(co.queue, cl)
	co.mu.Unlock()
	select {
	case lead := <-cl.wake:
		co.follow(cl, lead)
	case <-ctx.Done():
		if co.withdraw(cl) {
			return nil, ctx.Err()
		}
		co.follow(cl, <-cl.wake) // taken by a flight already
	}
	return cl.reply()
}

// follow waits for cl's reply, flying the next flight first if cl leads it.
func (co *coalescer) follow(cl *purchaseCall, lead bool) {
	if lead {
		co.fly(cl.batch)
		<-cl.wake
	}
}

// withdraw takes cl out of the queue if no flight has taken it yet.
func (co *coalescer) withdraw(cl *purchaseCall) bool {
	co.mu.Lock()
	defer co.mu.Unlock()
	i := slices.Index(co.queue, cl)
	if i < 0 {
		return false
	}
	co.queue = slices.Delete(co.queue, i, i+1)
	return true
}

func (cl *purchaseCall) reply() ([]any, error) {
	if cl.err != nil {
		return nil, cl.err
	}
	return cl.cmd.Slice()
}

// fly sends batch, then hands the flight to the first of the purchases
// queued meanwhile, with up to maxBatch of them, or ends it.
func (co *coalescer) fly(batch []*purchaseCall) {
	co.flush(batch)
	co.mu.Lock()
	if len(co.queue) == 0 {
		co.flights--
		co.mu.Unlock()
		return
	}
	n := min(len(co.queue), co.maxBatch)
	next := slices.Clone(co.queue[:n])
	rest := copy(co.queue, co.queue[n:])
	clear(co.queue[rest:])
	co.queue = co.queue[:rest]
	co.mu.Unlock()
	next[0].batch = next
	next[0].wake <- true
}

// flush sends the calls of batch whose context is still live in one
// pipeline and wakes every call of batch. Calls whose server lacks the
// script (restarted, failed over, SCRIPT FLUSH) are sent once more after
// the script is loaded (on every master of a cluster).
func (co *coalescer) flush(batch []*purchaseCall) {
	// The flush outlives any one buyer's request: a buyer who leaves after
	// it is written does not cut the others' replies.
	ctx := context.WithoutCancel(batch[0].ctx)
	if sent := co.send(ctx, batch, func(*purchaseCall) bool { return true }); sent > 0 {
		if stale := countNoScript(batch); stale > 0 {
			if err := co.script.Load(ctx, co.rdb).Err(); err != nil {
				for _, cl := range batch {
					if cl.err == nil && isNoScript(cl.cmd.Err()) {
						cl.err = err
					}
				}
			} else {
				co.send(ctx, batch, func(cl *purchaseCall) bool { return cl.err == nil && isNoScript(cl.cmd.Err()) })
			}
		}
	}
	for _, cl := range batch {
		cl.wake <- false // cl belongs to its buyer again
	}
}

// send writes a pipeline of the calls of batch that pick selects and whose
// context is live, and reads their replies; a call whose context has ended
// gets its error instead and is not sent. It returns how many it sent.
func (co *coalescer) send(ctx context.Context, batch []*purchaseCall, pick func(*purchaseCall) bool) int {
	pipe := co.rdb.Pipeline()
	n := 0
	for _, cl := range batch {
		if !pick(cl) {
			continue
		}
		if err := cl.ctx.Err(); err != nil {
			cl.err = err
			continue
		}
		cl.cmd = redis.NewCmd(ctx, cl.args[:cl.nargs]...)
		cl.cmd.SetFirstKeyPos(3)
		_ = pipe.Process(ctx, cl.cmd)
		n++
	}
	if n == 0 {
		return 0
	}
	_, _ = pipe.Exec(ctx) // every command holds its own reply or error
	co.flushes.Add(1)
	co.purchases.Add(int64(n))
	return n
}

func countNoScript(batch []*purchaseCall) int {
	n := 0
	for _, cl := range batch {
		if cl.err == nil && isNoScript(cl.cmd.Err()) {
			n++
		}
	}
	return n
}

func isNoScript(err error) bool { return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") }
