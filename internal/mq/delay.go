package mq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// DelayQueue holds payloads until they are due, then a Poller appends them
// to a stream. It is a sorted set scored by due time (unix ms). Its key and
// its stream's key must share a hash tag: one script touches both.
type DelayQueue struct {
	rdb     redis.UniversalClient
	key     string
	stream  string
	forward *redis.Script

	// nudged wakes this instance's Poller when a member was scheduled
	// here (see Nudge); soonest is the earliest due time nudged since the
	// Poller last looked (unix ms, 0 for none).
	nudged  chan struct{}
	mu      sync.Mutex
	soonest int64
}

// NewDelayQueue returns the delay queue in key that feeds stream.
func NewDelayQueue(rdb redis.UniversalClient, key, stream string) *DelayQueue {
	return &DelayQueue{rdb: rdb, key: key, stream: stream, forward: lua.Forward(), nudged: make(chan struct{}, 1)}
}

// Key is the sorted set's key.
func (q *DelayQueue) Key() string { return q.key }

// Stream is the stream due payloads go to.
func (q *DelayQueue) Stream() string { return q.stream }

// Payload encodes stream fields as a delay-queue member: a JSON array of
// alternating names and values. Fields are sorted by name so that equal
// fields make an equal member.
func Payload(fields map[string]string) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	arr := make([]string, 0, 2*len(names))
	for _, k := range names {
		arr = append(arr, k, fields[k])
	}
	b, _ := json.Marshal(arr)
	return string(b)
}

// ParsePayload decodes a delay-queue member made by Payload.
func ParsePayload(member string) (map[string]any, error) {
	var arr []string
	if err := json.Unmarshal([]byte(member), &arr); err != nil || len(arr)%2 != 0 {
		return nil, fmt.Errorf("delay queue member is not a field list")
	}
	out := make(map[string]any, len(arr)/2)
	for i := 0; i < len(arr); i += 2 {
		out[arr[i]] = arr[i+1]
	}
	return out, nil
}

// Schedule adds a payload (see Payload) due at the given time. Scheduling an
// equal payload again moves its due time.
func (q *DelayQueue) Schedule(ctx context.Context, payload string, due time.Time) error {
	if err := q.rdb.ZAdd(ctx, q.key, redis.Z{Score: float64(due.UnixMilli()), Member: payload}).Err(); err != nil {
		return fmt.Errorf("schedule on %s: %w", q.key, err)
	}
	q.Nudge(due)
	return nil
}

// Nudge tells the Poller of this instance that a member due at due was
// scheduled: an idle Poller sleeps up to PollerConfig.Idle, and polls by
// due (no sooner than PollerConfig.Every after its last poll) instead.
// Whatever schedules on the queue outside Schedule calls it after the
// write. Members scheduled by other instances are found on the next poll.
func (q *DelayQueue) Nudge(due time.Time) {
	ms := due.UnixMilli()
	q.mu.Lock()
	if q.soonest == 0 || ms < q.soonest {
		q.soonest = ms
	}
	q.mu.Unlock()
	select {
	case q.nudged <- struct{}{}:
	default:
	}
}

// takeNudge returns and forgets the earliest due time nudged.
func (q *DelayQueue) takeNudge() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ms := q.soonest
	q.soonest = 0
	return time.UnixMilli(ms), ms != 0
}

// Forward moves up to limit members due at now onto the stream, atomically.
func (q *DelayQueue) Forward(ctx context.Context, now time.Time, limit int) (int, error) {
	n, _, err := q.forwardNext(ctx, now, limit)
	return n, err
}

// forwardNext is Forward that also reports, when nothing was due, the due
// time of the first member (zero when the queue is empty or members moved).
func (q *DelayQueue) forwardNext(ctx context.Context, now time.Time, limit int) (int, time.Time, error) {
	reply, err := q.forward.Run(ctx, q.rdb, []string{q.key, q.stream}, now.UnixMilli(), limit).Slice()
	if err == nil && len(reply) != 2 {
		err = fmt.Errorf("reply %v", reply)
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("forward %s: %w", q.key, err)
	}
	n, ok := reply[0].(int64)
	next, _ := reply[1].(string)
	if !ok {
		return 0, time.Time{}, fmt.Errorf("forward %s: reply %v", q.key, reply)
	}
	if next == "" {
		return int(n), time.Time{}, nil
	}
	ms, err := strconv.ParseFloat(next, 64)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("forward %s: next due %q: %w", q.key, next, err)
	}
	return int(n), time.UnixMilli(int64(ms)), nil
}

// Stats is what operators watch: how many members wait, and how long the
// oldest is overdue (0 when none is due).
type Stats struct {
	Size          int64
	OldestOverdue time.Duration
}

// Stats reads the queue's size and the age of its most overdue member.
func (q *DelayQueue) Stats(ctx context.Context, now time.Time) (Stats, error) {
	pipe := q.rdb.Pipeline()
	size := pipe.ZCard(ctx, q.key)
	first := pipe.ZRangeWithScores(ctx, q.key, 0, 0)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, fmt.Errorf("delay queue stats: %w", err)
	}
	s := Stats{Size: size.Val()}
	if zs := first.Val(); len(zs) == 1 {
		if late := now.Sub(time.UnixMilli(int64(zs[0].Score))); late > 0 {
			s.OldestOverdue = late
		}
	}
	return s, nil
}

// PollerConfig tunes a Poller.
type PollerConfig struct {
	// Every is how often to look for due members while some are due or
	// soon will be, and the least time between two looks; default 100ms.
	Every time.Duration
	// Idle is the longest a Poller sleeps when nothing is due sooner (an
	// empty queue, or the first member due later): a member scheduled on
	// another instance, which cannot nudge this one, waits up to Idle
	// more. 0 or at most Every: look every Every, idle or not.
	Idle  time.Duration
	Batch int              // most members moved per call, default 500
	Now   func() time.Time // the clock, default time.Now
}

// Poller moves due members of one delay queue back onto its stream. Every
// instance runs one per queue; the script makes that safe. It looks every
// Every while members are due; otherwise it sleeps until the first member
// is due, or Idle, whichever comes first, and is woken sooner by a
// member scheduled on this instance (DelayQueue.Nudge).
type Poller struct {
	q   *DelayQueue
	cfg PollerConfig
	log *slog.Logger
}

// NewPoller returns a Poller for q.
func NewPoller(q *DelayQueue, cfg PollerConfig, log *slog.Logger) *Poller {
	cfg.Every = cmp.Or(cfg.Every, 100*time.Millisecond)
	cfg.Idle = max(cfg.Idle, cfg.Every)
	cfg.Batch = cmp.Or(cfg.Batch, 500)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Poller{q: q, cfg: cfg, log: log.With("delay_queue", q.key)}
}

// Run polls until ctx is done: each look drains what is due and sets the
// timer for the next one; a nudge brings the next look forward.
func (p *Poller) Run(ctx context.Context) error {
	s := pollState{timer: time.NewTimer(p.cfg.Every), wake: time.Now().Add(p.cfg.Every), log: p.log}
	defer s.timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.q.nudged:
			p.nudge(&s)
		case <-s.timer.C:
			p.look(ctx, &s)
		}
	}
}

// pollState is a running Poller's loop state.
type pollState struct {
	timer   *time.Timer
	wake    time.Time // when the timer fires
	last    time.Time // the last look
	log     *slog.Logger
	failing bool // the last call to Redis failed (logged once per run of failures)
}

// failed notes a failed look, logging where a run of failures begins.
func (s *pollState) failed(ctx context.Context, err error) {
	if !s.failing && ctx.Err() == nil {
		s.log.Warn("delay queue poller failing; retrying", "err", err)
		s.failing = true
	}
}

// succeeded notes a call that worked, logging where a run of failures ends.
func (s *pollState) succeeded() {
	if s.failing {
		s.log.Info("delay queue poller recovered")
		s.failing = false
	}
}

// nudge brings the next look forward to the earliest due time nudged, but
// no sooner than Every after the last look.
func (p *Poller) nudge(s *pollState) {
	due, ok := p.q.takeNudge()
	if !ok {
		return
	}
	// Due in the poller's own time: the two clocks differ only under
	// tests' clocks.
	at := time.Now().Add(due.Sub(p.cfg.Now()))
	at = later(at, s.last.Add(p.cfg.Every))
	if at.Before(s.wake) {
		s.wake = at
		s.timer.Reset(time.Until(at))
	}
}

// look drains what is due and sets the timer for the next look.
func (p *Poller) look(ctx context.Context, s *pollState) {
	s.last = time.Now()
	wait := p.waitAfter(p.drain(ctx, s))
	s.wake = time.Now().Add(wait)
	s.timer.Reset(wait)
}

// drain moves what is due now in bounded calls, without waiting for the
// next look while full batches come back. It reports how many moved (-1
// when a call failed), the time of the last call and the due time of the
// first member left (zero for none or unknown).
func (p *Poller) drain(ctx context.Context, s *pollState) (moved int, now, next time.Time) {
	for {
		now = p.cfg.Now()
		n, due, err := p.q.forwardNext(ctx, now, p.cfg.Batch)
		if err != nil {
			s.failed(ctx, err)
			return -1, now, next // look again soon
		}
		s.succeeded()
		moved += n
		next = due
		if n < p.cfg.Batch || ctx.Err() != nil {
			return moved, now, next
		}
	}
}

// waitAfter is the time to the next look: Every after a look that moved
// members or failed; until the first member left is due, between Every and
// Idle; Idle when the queue is empty.
func (p *Poller) waitAfter(moved int, now, next time.Time) time.Duration {
	switch {
	case moved != 0:
		return p.cfg.Every
	case !next.IsZero():
		return min(max(next.Sub(now), p.cfg.Every), p.cfg.Idle)
	default:
		return p.cfg.Idle
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
