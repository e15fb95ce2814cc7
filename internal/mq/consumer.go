// Package mq runs consumer groups on Redis Streams and delay queues that
// feed them: it reads batches, hands them to a Handler, and carries out
// what the handler decided for each message. It knows nothing about what
// the messages mean.
package mq

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// AttemptField is the stream field that counts a message's trips through
// the delay queue.
const AttemptField = "_attempt"

// Message is one stream entry delivered to this consumer.
type Message struct {
	Stream string
	ID     string
	Values map[string]any
	// Deliveries is how often the group delivered the entry, this time
	// included: more than 1 means a consumer took it before and did not
	// finish (it crashed, or its batch failed).
	Deliveries int64
	// Attempt counts the entry's trips through the delay queue: 0 the
	// first time.
	Attempt int
}

// Outcome is what becomes of one message.
type Outcome int

const (
	// Ack: the message's work is durably done; acknowledge and delete it.
	Ack Outcome = iota
	// Retry: try again later; the message goes to the delay queue with its
	// attempt count raised, and is acknowledged, in one step.
	Retry
	// LeavePending: do nothing; the entry stays pending until reclaimed.
	LeavePending
)

// Handler processes a batch and says what becomes of each message, in
// order. An error means nothing in the batch is known to be done: the
// consumer backs off and hands the same batch over again, less the entries
// no longer pending with it (acknowledged, or claimed by another
// consumer). Handlers must be idempotent: a message can arrive again after
// a crash.
type Handler interface {
	Handle(ctx context.Context, batch []Message) ([]Outcome, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, batch []Message) ([]Outcome, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, batch []Message) ([]Outcome, error) {
	return f(ctx, batch)
}

// ConsumerConfig tunes a consumer. Zero values take the defaults.
type ConsumerConfig struct {
	Stream   string
	Group    string
	Consumer string        // unique per process; see ConsumerName
	Batch    int           // entries per read, default 100
	Block    time.Duration // how long one read waits for entries, default 1s
	// Grace bounds how long the batch in flight may run on after ctx is done
	// before it is cancelled, default 10s.
	Grace time.Duration
	// MaxBackoff caps the wait between attempts while the handler or Redis
	// fails, default 5s.
	MaxBackoff time.Duration
	// ReclaimIdle: entries pending longer than this, with any consumer of
	// the group, are claimed by this one (their consumer is taken for
	// dead). Default 30s. Entries of the batch in flight are kept fresh,
	// so a slow batch is not taken for dead.
	ReclaimIdle time.Duration
	// ReclaimEvery is how often to look for such entries, default
	// ReclaimIdle/2.
	ReclaimEvery time.Duration
	// Delay receives Retry outcomes; without it Retry leaves the entry
	// pending.
	Delay *DelayQueue
	// RetryBackoff is the delay before attempt n+1 (n >= 0); default 200ms
	// doubling per attempt up to 30s, with full jitter.
	RetryBackoff func(attempt int) time.Duration
	// AfterRead, when set, runs after a batch was read and before it is
	// handled: the hook fault tests use to stop a worker holding a batch.
	AfterRead func(n int)
	// Observer, when set, hears what the consumer does (metrics).
	Observer Observer
}

// Observer hears what a consumer does, for metrics. It is called from the
// consumer loop, so it must be cheap and safe for concurrent use.
type Observer interface {
	// Outcomes: what became of a batch's messages once carried out.
	Outcomes(acked, retried, pending int)
	// Reclaimed: n entries of a stalled consumer were claimed.
	Reclaimed(n int)
	// RedisError: a call failed (op: read, reclaim, ack, delay).
	RedisError(op string)
}

type nopObserver struct{}

func (nopObserver) Outcomes(int, int, int) {}
func (nopObserver) Reclaimed(int)          {}
func (nopObserver) RedisError(string)      {}

// Consumer reads one stream as one member of a consumer group.
type Consumer struct {
	rdb     redis.UniversalClient
	cfg     ConsumerConfig
	handler Handler
	ack     *redis.Script
	retry   *redis.Script
	log     *slog.Logger

	// reported remembers ids left pending that were logged, so a message
	// seen again is not logged twice.
	reported map[string]struct{}
	// claimFrom is where the next XAUTOCLAIM scan starts.
	claimFrom string
	// Run's loop state: cursor is where the next read starts (an id while
	// this consumer's own pending entries are read again, ">" for new
	// ones); reclaimAt is when the next reclaim scan is due; backoff
	// spaces the attempts while reads or batches fail.
	cursor    string
	reclaimAt time.Time
	backoff   backoff
}

// NewConsumer returns a Consumer; it does not own rdb.
func NewConsumer(rdb redis.UniversalClient, cfg ConsumerConfig, h Handler, log *slog.Logger) *Consumer {
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.Block = cmp.Or(cfg.Block, time.Second)
	cfg.Grace = cmp.Or(cfg.Grace, 10*time.Second)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 5*time.Second)
	cfg.ReclaimIdle = cmp.Or(cfg.ReclaimIdle, 30*time.Second)
	cfg.ReclaimEvery = cmp.Or(cfg.ReclaimEvery, cfg.ReclaimIdle/2)
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Consumer{
		rdb: rdb, cfg: cfg, handler: h, ack: lua.Ack(), retry: lua.Retry(),
		log:       log.With("stream", cfg.Stream, "consumer", cfg.Consumer),
		reported:  map[string]struct{}{},
		claimFrom: "0-0",
	}
}

// DefaultRetryBackoff waits a random time up to 200ms*2^attempt, capped at
// 30s: exponential backoff with full jitter, so retries of one burst spread.
func DefaultRetryBackoff(attempt int) time.Duration {
	ceiling := min(200*time.Millisecond<<min(attempt, 20), 30*time.Second)
	return time.Duration(rand.Int64N(int64(ceiling))) + time.Millisecond
}

// EnsureGroup creates the group at the start of the stream (id 0, so no
// entry already in the stream is skipped), creating the stream if needed.
func EnsureGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !isBusyGroup(err) {
		return fmt.Errorf("create group %s on %s: %w", group, stream, err)
	}
	return nil
}

// Run consumes until ctx is done. The read in progress is finished (it
// blocks at most Block) and its batch is handled and acknowledged, bounded by
// Grace; then Run returns. What is left pending is reclaimed by others.
func (c *Consumer) Run(ctx context.Context) error {
	if err := EnsureGroup(ctx, c.rdb, c.cfg.Stream, c.cfg.Group); err != nil && ctx.Err() == nil {
		c.log.Warn("consumer group not created yet; retrying", "err", err)
	}
	work, stop := c.withGrace(ctx)
	defer stop()
	// Start with this consumer's own pending entries (a consumer name can
	// come back), then read new ones.
	c.cursor, c.reclaimAt = "0", time.Now()
	c.backoff = backoff{max: c.cfg.MaxBackoff, log: c.log}
	for ctx.Err() == nil {
		batch, err := c.next(ctx, work)
		if err != nil {
			if !c.backOff(ctx, work, err) {
				break
			}
			continue
		}
		if !c.finish(ctx, work, batch) {
			break // left pending: others reclaim it
		}
		c.backoff.reset()
	}
	return nil
}

// withGrace returns the context batches run in: it outlives ctx by at most
// Grace, so a batch read before the stop is still handled and
// acknowledged.
func (c *Consumer) withGrace(ctx context.Context) (work context.Context, stop func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopAfter := context.AfterFunc(ctx, func() {
		t := time.NewTimer(c.cfg.Grace)
		defer t.Stop()
		select {
		case <-work.Done():
		case <-t.C:
			cancel()
		}
	})
	return work, func() { stopAfter(); cancel() }
}

// next reads the next batch: the entries of stalled consumers when a
// reclaim scan is due, otherwise this consumer's own pending entries (the
// cursor walks them once) and, when those are done, new ones.
func (c *Consumer) next(ctx, work context.Context) ([]Message, error) {
	if time.Now().After(c.reclaimAt) {
		batch, err := c.reclaim(work)
		c.reclaimAt = time.Now().Add(c.cfg.ReclaimEvery)
		c.countRedisError(ctx, "reclaim", err)
		return batch, err
	}
	batch, err := c.read(work, c.cursor)
	c.countRedisError(ctx, "read", err)
	if err == nil {
		c.advanceCursor(batch)
	}
	return batch, err
}

// advanceCursor moves the cursor past the own pending entries just read;
// an empty read means they are done, and new entries come next.
func (c *Consumer) advanceCursor(batch []Message) {
	switch {
	case c.cursor == ">":
	case len(batch) == 0:
		c.cursor = ">"
	default:
		c.cursor = batch[len(batch)-1].ID
	}
}

// countRedisError tells the observer about a failed call, unless it
// failed because the consumer is stopping.
func (c *Consumer) countRedisError(ctx context.Context, op string, err error) {
	if err != nil && ctx.Err() == nil {
		c.cfg.Observer.RedisError(op)
	}
}

// finish hands the batch to the handler until it is done, each time less
// the entries no longer pending with this consumer (carried out before a
// failure, or taken over by another consumer): reading it again would
// count as another delivery. The batch is kept fresh the whole time,
// backoffs included: while MySQL is down every consumer fails alike, and
// entries passed around meanwhile would count deliveries towards a dead
// letter. finish reports false when it gave up because ctx is done; what
// is left stays pending for others to reclaim.
func (c *Consumer) finish(ctx, work context.Context, batch []Message) bool {
	if len(batch) == 0 {
		return true
	}
	if c.cfg.AfterRead != nil {
		c.cfg.AfterRead(len(batch))
	}
	stopKeepalive := c.keepalive(work, batch)
	defer func() { stopKeepalive() }()
	for len(batch) > 0 {
		err := c.process(work, batch)
		if err == nil {
			return true
		}
		if !c.backOff(ctx, work, err) {
			return false
		}
		if owned := c.stillOwned(work, batch); len(owned) < len(batch) {
			stopKeepalive()
			batch, stopKeepalive = owned, c.keepalive(work, owned)
		}
	}
	return true
}

// backOff answers a failed read or batch before the next attempt: a
// missing group (Redis lost its data) is created again from id 0, then the
// consumer waits. It reports false when ctx is done, before or during the
// wait: stop.
func (c *Consumer) backOff(ctx, work context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if IsNoGroup(err) {
		if err := EnsureGroup(work, c.rdb, c.cfg.Stream, c.cfg.Group); err == nil {
			c.log.Warn("consumer group was missing and is created again from id 0")
		}
	}
	return c.backoff.wait(ctx, err)
}

// backoff spaces the attempts of a failing consumer: 50ms, doubling up to
// max; a success starts again from the bottom. It logs where a run of
// failures begins and where it ends.
type backoff struct {
	max     time.Duration
	log     *slog.Logger
	last    time.Duration // the previous wait; 0 after a success
	failing bool
}

// wait waits out the next backoff after err, logging err when it begins a
// run of failures; it reports false when ctx was done first.
func (b *backoff) wait(ctx context.Context, err error) bool {
	if !b.failing {
		b.log.Warn("consumer failing; backing off and retrying", "err", err)
		b.failing = true
	}
	b.last = min(max(2*b.last, 50*time.Millisecond), b.max)
	return sleep(ctx, b.last)
}

// reset ends a run of failures: the next one waits the shortest time again.
func (b *backoff) reset() {
	if b.failing {
		b.log.Info("consumer recovered")
		b.failing = false
	}
	b.last = 0
}

// read reads one batch from cursor ("0"-style for own pending, ">" for new).
func (c *Consumer) read(ctx context.Context, cursor string) ([]Message, error) {
	block := c.cfg.Block
	if cursor != ">" {
		block = -1 // no BLOCK: pending entries are there or not
	}
	streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Streams: []string{c.cfg.Stream, cursor}, Count: int64(c.cfg.Batch), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.cfg.Stream, err)
	}
	var batch []Message
	for _, s := range streams {
		for _, e := range s.Messages {
			batch = append(batch, c.message(e, 1))
		}
	}
	if cursor != ">" && len(batch) > 0 {
		if err := c.countDeliveries(ctx, batch); err != nil {
			return nil, err
		}
	}
	return batch, nil
}

// reclaim claims entries idle longer than ReclaimIdle from any consumer of
// the group, with their delivery counts.
func (c *Consumer) reclaim(ctx context.Context) ([]Message, error) {
	msgs, next, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		MinIdle: c.cfg.ReclaimIdle, Start: c.claimFrom, Count: int64(c.cfg.Batch),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("reclaim on %s: %w", c.cfg.Stream, err)
	}
	c.claimFrom = next
	batch := make([]Message, 0, len(msgs))
	for _, e := range msgs {
		batch = append(batch, c.message(e, 0))
	}
	if len(batch) == 0 {
		return nil, nil
	}
	if err := c.countDeliveries(ctx, batch); err != nil {
		return nil, err
	}
	c.cfg.Observer.Reclaimed(len(batch))
	c.log.Warn("reclaimed entries of a stalled consumer", "count", len(batch))
	return batch, nil
}

func (c *Consumer) message(e redis.XMessage, deliveries int64) Message {
	m := Message{Stream: c.cfg.Stream, ID: e.ID, Values: e.Values, Deliveries: deliveries}
	if s, ok := e.Values[AttemptField].(string); ok {
		m.Attempt, _ = strconv.Atoi(s)
	}
	return m
}

// countDeliveries fills in the delivery counts of entries pending with
// this consumer.
func (c *Consumer) countDeliveries(ctx context.Context, batch []Message) error {
	pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Start: batch[0].ID, End: batch[len(batch)-1].ID, Count: int64(len(batch)),
	}).Result()
	if err != nil {
		return fmt.Errorf("read delivery counts: %w", err)
	}
	counts := make(map[string]int64, len(pend))
	for _, p := range pend {
		counts[p.ID] = p.RetryCount
	}
	for i := range batch {
		batch[i].Deliveries = max(counts[batch[i].ID], 1)
	}
	return nil
}

// process hands the batch to the handler and carries out the outcomes.
func (c *Consumer) process(ctx context.Context, batch []Message) error {
	outcomes, err := c.handler.Handle(ctx, batch)
	if err != nil {
		return fmt.Errorf("handle batch of %d: %w", len(batch), err)
	}
	if len(outcomes) != len(batch) {
		return fmt.Errorf("handler gave %d outcomes for %d messages", len(outcomes), len(batch))
	}
	var done []any
	var retries []Message
	for i, o := range outcomes {
		m := batch[i]
		switch {
		case o == Ack:
			done = append(done, m.ID)
			delete(c.reported, m.ID)
		case o == Retry && c.cfg.Delay != nil:
			retries = append(retries, m)
		default:
			if _, seen := c.reported[m.ID]; !seen {
				if len(c.reported) >= maxReported {
					clear(c.reported)
				}
				c.reported[m.ID] = struct{}{}
				c.log.Warn("message left pending", "id", m.ID)
			}
		}
	}
	moved := 0
	if len(retries) > 0 {
		moved, err = c.delay(ctx, retries)
		if err != nil {
			c.cfg.Observer.RedisError("delay")
			return err
		}
	}
	if len(done) > 0 {
		args := append([]any{c.cfg.Group}, done...)
		if err := c.ack.Run(ctx, c.rdb, []string{c.cfg.Stream}, args...).Err(); err != nil {
			c.cfg.Observer.RedisError("ack")
			return fmt.Errorf("ack %d entries: %w", len(done), err)
		}
	}
	c.cfg.Observer.Outcomes(len(done), moved, len(batch)-len(done)-len(retries))
	if moved < len(retries) {
		// Not this consumer's any more: the batch fails, and is handed
		// over again without them (and without what was carried out).
		// Redis did not fail (another consumer owns them now), so no
		// Redis error is counted: that count pages an operator.
		return fmt.Errorf("delay %d entries: %d %w", len(retries), len(retries)-moved, errNotPending)
	}
	return nil
}

// errNotPending means a Retry outcome found its entry no longer pending
// with this consumer: acknowledged, or claimed by another consumer after
// this one was taken for dead. Nothing was written for it; whoever has it
// now decides it. Were it this consumer's own earlier write, the message
// would be in neither the pending list nor the delay queue: lost.
var errNotPending = errors.New("entries were no longer pending with this consumer")

// delay moves messages to the delay queue, each with its attempt count
// raised, scheduled after its backoff, and reports how many it moved.
func (c *Consumer) delay(ctx context.Context, msgs []Message) (int, error) {
	pipe := c.rdb.Pipeline()
	now := time.Now()
	cmds := make([]*redis.Cmd, len(msgs))
	var soonest time.Time
	// This instance's poller sleeps while idle: it is told when the first
	// of these is due, whatever became of the calls.
	defer func() { c.cfg.Delay.Nudge(soonest) }()
	for i, m := range msgs {
		fields := make(map[string]string, len(m.Values)+1)
		for k, v := range m.Values {
			fields[k] = fmt.Sprint(v)
		}
		fields[AttemptField] = strconv.Itoa(m.Attempt + 1)
		due := now.Add(c.cfg.RetryBackoff(m.Attempt))
		if i == 0 || due.Before(soonest) {
			soonest = due
		}
		cmds[i] = c.retry.Eval(ctx, pipe, []string{c.cfg.Stream, c.cfg.Delay.Key()},
			c.cfg.Group, m.ID, due.UnixMilli(), Payload(fields), c.cfg.Consumer)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("delay %d entries: %w", len(msgs), err)
	}
	moved := 0
	for i, cmd := range cmds {
		n, err := cmd.Int()
		if err != nil {
			return 0, fmt.Errorf("delay entry %s: %w", msgs[i].ID, err)
		}
		if n == 1 {
			moved++
		} else {
			c.log.Warn("entry to delay no longer pending with this consumer; left to whoever has it", "id", msgs[i].ID)
		}
	}
	return moved, nil
}

// stillOwned returns the messages of batch still pending with this
// consumer, the ones to hand over again after a failure. When that cannot
// be read, the batch is kept as it is: handing it over fails the same way
// and backs off.
func (c *Consumer) stillOwned(ctx context.Context, batch []Message) []Message {
	pend, err := c.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{
		Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Start: batch[0].ID, End: batch[len(batch)-1].ID, Count: int64(len(batch)),
	}).Result()
	if err != nil {
		return batch
	}
	owned := make(map[string]bool, len(pend))
	for _, p := range pend {
		owned[p.ID] = true
	}
	kept := batch[:0:0]
	for _, m := range batch {
		if owned[m.ID] {
			kept = append(kept, m)
		}
	}
	return kept
}

// keepalive claims the batch's entries to this consumer again every
// ReclaimIdle/3 while the handler runs, resetting their idle time, so no
// other consumer reclaims live work. JUSTID claims do not count as
// deliveries.
func (c *Consumer) keepalive(ctx context.Context, batch []Message) (stop func()) {
	if len(batch) == 0 {
		return func() {}
	}
	ids := make([]string, len(batch))
	for i, m := range batch {
		ids[i] = m.ID
	}
	kctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(c.cfg.ReclaimIdle / 3)
		defer t.Stop()
		for {
			select {
			case <-kctx.Done():
				return
			case <-t.C:
				err := c.rdb.XClaimJustID(kctx, &redis.XClaimArgs{
					Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Consumer, Messages: ids,
				}).Err()
				if err != nil && kctx.Err() == nil {
					c.log.Warn("keeping batch entries fresh failed", "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// maxReported bounds the memory of logged pending ids.
const maxReported = 10_000

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ConsumerName returns a consumer name unique to this process: host, pid and
// a random suffix, so two instances, or one restarted, never share one.
func ConsumerName() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = crand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "host"), os.Getpid(), hex.EncodeToString(b[:]))
}
