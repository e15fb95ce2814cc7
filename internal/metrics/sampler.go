package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/mq"
)

// Shard is one order stream, the delay queue that feeds it and the marker
// that says its sale state is loaded.
type Shard struct {
	Stream string
	Delay  *mq.DelayQueue // nil: no delay queue
	Ready  string         // the shard's ready marker key; "": not sampled
}

// SamplerConfig tunes a Sampler. Shard i is labelled shard="i".
type SamplerConfig struct {
	Group  string // the consumer group whose pending entries and lag are read
	Shards []Shard
	Every  time.Duration    // default 5s
	Now    func() time.Time // default time.Now
}

// maxLagCount bounds the fallback count of undelivered entries when Redis
// cannot tell the lag: the gauge then says "at least this many".
const maxLagCount = 10_000

// Sampler reads, every Every, each shard's stream length, its group's
// pending entries and lag (XINFO GROUPS, Redis 7), its delay queue's size
// and most overdue age, and whether its ready marker is there, into gauges. Every instance runs one; the
// values are the same everywhere, so dashboards take the max per shard.
type Sampler struct {
	rdb    redis.UniversalClient
	m      *Metrics
	cfg    SamplerConfig
	labels []string
	log    *slog.Logger
}

// NewSampler returns a Sampler; it does not own rdb.
func NewSampler(rdb redis.UniversalClient, m *Metrics, cfg SamplerConfig, log *slog.Logger) *Sampler {
	cfg.Every = cmp.Or(cfg.Every, 5*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	labels := make([]string, len(cfg.Shards))
	for i := range labels {
		labels[i] = strconv.Itoa(i)
	}
	return &Sampler{rdb: rdb, m: m, cfg: cfg, labels: labels, log: log}
}

// Run samples at once and then every Every until ctx is done.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	failing := false
	for {
		err := s.Sample(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			s.log.Warn("metrics sampler failing; gauges keep their last values", "err", err)
			failing = true
		case err == nil && failing:
			s.log.Info("metrics sampler recovered")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads every shard once. A shard that fails keeps its last values.
func (s *Sampler) Sample(ctx context.Context) error {
	var errs []error
	for i, sh := range s.cfg.Shards {
		if err := s.sampleShard(ctx, s.labels[i], sh); err != nil {
			if ctx.Err() == nil {
				s.m.RedisError("sample")
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Sampler) sampleShard(ctx context.Context, label string, sh Shard) error {
	pipe := s.rdb.Pipeline()
	xlen := pipe.XLen(ctx, sh.Stream)
	groups := pipe.XInfoGroups(ctx, sh.Stream)
	var ready *redis.IntCmd
	if sh.Ready != "" {
		ready = pipe.Exists(ctx, sh.Ready)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	if err := xlen.Err(); err != nil {
		return fmt.Errorf("length of %s: %w", sh.Stream, err)
	}
	if ready != nil {
		if err := ready.Err(); err != nil {
			return fmt.Errorf("ready marker %s: %w", sh.Ready, err)
		}
		s.m.shardReady.WithLabelValues(label).Set(float64(ready.Val()))
	}
	length := xlen.Val()
	var pending, lag int64
	switch err := groups.Err(); {
	case mq.IsNoStream(err):
		// No stream yet: nothing queued.
	case err != nil:
		return fmt.Errorf("groups of %s: %w", sh.Stream, err)
	default:
		lag = length // no group yet: nothing was delivered
		for _, g := range groups.Val() {
			if g.Name != s.cfg.Group {
				continue
			}
			pending, lag = g.Pending, g.Lag
			if lag < 0 {
				// Redis cannot tell (entries were deleted past the
				// group's position): count what follows that position.
				n, err := s.rdb.XRangeN(ctx, sh.Stream, "("+g.LastDeliveredID, "+", maxLagCount).Result()
				if err != nil {
					return fmt.Errorf("entries after %s of %s: %w", g.LastDeliveredID, sh.Stream, err)
				}
				lag = int64(len(n))
			}
		}
	}
	s.m.streamLength.WithLabelValues(label).Set(float64(length))
	s.m.streamPending.WithLabelValues(label).Set(float64(pending))
	s.m.streamLag.WithLabelValues(label).Set(float64(lag))

	if sh.Delay == nil {
		return nil
	}
	st, err := sh.Delay.Stats(ctx, s.cfg.Now())
	if err != nil {
		return err
	}
	s.m.delaySize.WithLabelValues(label).Set(float64(st.Size))
	s.m.delayOverdue.WithLabelValues(label).Set(st.OldestOverdue.Seconds())
	return nil
}
