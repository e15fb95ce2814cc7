package mq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
}

// NewDelayQueue returns the delay queue in key that feeds stream.
func NewDelayQueue(rdb redis.UniversalClient, key, stream string) *DelayQueue {
	return &DelayQueue{rdb: rdb, key: key, stream: stream, forward: lua.Forward()}
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
	return nil
}

// Forward moves up to limit members due at now onto the stream, atomically.
func (q *DelayQueue) Forward(ctx context.Context, now time.Time, limit int) (int, error) {
	n, err := q.forward.Run(ctx, q.rdb, []string{q.key, q.stream}, now.UnixMilli(), limit).Int()
	if err != nil {
		return 0, fmt.Errorf("forward %s: %w", q.key, err)
	}
	return n, nil
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
	Every time.Duration    // how often to look for due members, default 100ms
	Batch int              // most members moved per call, default 500
	Now   func() time.Time // the clock, default time.Now
}

// Poller moves due members of one delay queue back onto its stream. Every
// instance runs one per queue; the script makes that safe.
type Poller struct {
	q   *DelayQueue
	cfg PollerConfig
	log *slog.Logger
}

// NewPoller returns a Poller for q.
func NewPoller(q *DelayQueue, cfg PollerConfig, log *slog.Logger) *Poller {
	cfg.Every = cmp.Or(cfg.Every, 100*time.Millisecond)
	cfg.Batch = cmp.Or(cfg.Batch, 500)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Poller{q: q, cfg: cfg, log: log.With("delay_queue", q.key)}
}

// Run polls until ctx is done.
func (p *Poller) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// Drain what is due now in bounded calls, without waiting for the
		// next tick while full batches come back.
		for {
			n, err := p.q.Forward(ctx, p.cfg.Now(), p.cfg.Batch)
			if err != nil {
				if !failing && ctx.Err() == nil {
					p.log.Warn("delay queue poller failing; retrying", "err", err)
					failing = true
				}
				break
			}
			if failing {
				p.log.Info("delay queue poller recovered")
				failing = false
			}
			if n < p.cfg.Batch || ctx.Err() != nil {
				break
			}
		}
	}
}
