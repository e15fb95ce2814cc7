// Package mq runs consumer groups on Redis Streams: it reads batches, hands
// them to a Handler and acknowledges what the handler finished. It knows
// nothing about what the messages mean.
package mq

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// Message is one stream entry delivered to this consumer.
type Message struct {
	Stream string
	ID     string
	Values map[string]any
}

// Outcome is what became of one message.
type Outcome int

const (
	// Ack: the message's work is durably done; acknowledge and delete it.
	Ack Outcome = iota
	// LeavePending: do not acknowledge; the entry stays in the group's
	// pending list for a later delivery.
	LeavePending
)

// Handler processes a batch and says what became of each message, in order.
// An error means nothing in the batch is known to be done: nothing is
// acknowledged and the batch is delivered again after a backoff.
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
}

// Consumer reads one stream as one member of a consumer group.
type Consumer struct {
	rdb     redis.UniversalClient
	cfg     ConsumerConfig
	handler Handler
	ack     *redis.Script
	log     *slog.Logger

	// reported remembers ids left pending that were logged, so a message
	// seen again on a backlog pass is not logged twice.
	reported map[string]struct{}
}

// NewConsumer returns a Consumer; it does not own rdb.
func NewConsumer(rdb redis.UniversalClient, cfg ConsumerConfig, h Handler, log *slog.Logger) *Consumer {
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.Block = cmp.Or(cfg.Block, time.Second)
	cfg.Grace = cmp.Or(cfg.Grace, 10*time.Second)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, 5*time.Second)
	return &Consumer{
		rdb: rdb, cfg: cfg, handler: h, ack: lua.Ack(),
		log:      log.With("stream", cfg.Stream, "consumer", cfg.Consumer),
		reported: map[string]struct{}{},
	}
}

// EnsureGroup creates the group at the start of the stream (id 0, so no
// entry already in the stream is skipped), creating the stream if needed.
func EnsureGroup(ctx context.Context, rdb redis.UniversalClient, stream, group string) error {
	err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s on %s: %w", group, stream, err)
	}
	return nil
}

// Run consumes until ctx is done. The read in progress is finished (it
// blocks at most Block) and its batch is handled and acknowledged, bounded by
// Grace; then Run returns.
func (c *Consumer) Run(ctx context.Context) error {
	if err := EnsureGroup(ctx, c.rdb, c.cfg.Stream, c.cfg.Group); err != nil && ctx.Err() == nil {
		c.log.Warn("consumer group not created yet; retrying", "err", err)
	}
	// work outlives ctx by at most Grace, so a batch read before the stop
	// is still handled and acknowledged.
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(c.cfg.Grace)
		defer t.Stop()
		select {
		case <-work.Done():
		case <-t.C:
			cancel()
		}
	})
	defer stop()

	// Start with this consumer's own pending entries (there are some after
	// a failed batch), then read new ones.
	cursor := "0"
	backoff := time.Duration(0)
	failing := false
	for ctx.Err() == nil {
		n, err := c.once(work, cursor)
		if err == nil {
			if failing {
				c.log.Info("consumer recovered")
				failing = false
			}
			backoff = 0
			if cursor != ">" && n.last == "" {
				cursor = ">" // backlog done
			} else if cursor != ">" {
				cursor = n.last
			}
			continue
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			break
		}
		if !failing {
			c.log.Warn("consumer failing; backing off and retrying", "err", err)
			failing = true
		}
		if strings.HasPrefix(err.Error(), "NOGROUP") {
			if err := EnsureGroup(work, c.rdb, c.cfg.Stream, c.cfg.Group); err == nil {
				c.log.Warn("consumer group was missing and is created again from id 0")
			}
		}
		cursor = "0" // what failed is in our pending list: read it again
		backoff = min(max(2*backoff, 50*time.Millisecond), c.cfg.MaxBackoff)
		if !sleep(ctx, backoff) {
			break
		}
	}
	return nil
}

// maxReported bounds the memory of logged pending ids.
const maxReported = 10_000

type readResult struct {
	last string // id of the last entry read, "" when none
}

// once reads one batch from cursor ("0"-style for own pending, ">" for new),
// handles it and acknowledges the done entries.
func (c *Consumer) once(ctx context.Context, cursor string) (readResult, error) {
	block := c.cfg.Block
	if cursor != ">" {
		block = -1 // no BLOCK: pending entries are there or not
	}
	streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.cfg.Group, Consumer: c.cfg.Consumer,
		Streams: []string{c.cfg.Stream, cursor}, Count: int64(c.cfg.Batch), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return readResult{}, nil
	}
	if err != nil {
		return readResult{}, fmt.Errorf("read %s: %w", c.cfg.Stream, err)
	}
	var batch []Message
	for _, s := range streams {
		for _, e := range s.Messages {
			batch = append(batch, Message{Stream: s.Stream, ID: e.ID, Values: e.Values})
		}
	}
	if len(batch) == 0 {
		return readResult{}, nil
	}
	res := readResult{last: batch[len(batch)-1].ID}
	outcomes, err := c.handler.Handle(ctx, batch)
	if err != nil {
		return res, fmt.Errorf("handle batch of %d: %w", len(batch), err)
	}
	if len(outcomes) != len(batch) {
		return res, fmt.Errorf("handler gave %d outcomes for %d messages", len(outcomes), len(batch))
	}
	var done []any
	for i, o := range outcomes {
		switch o {
		case Ack:
			done = append(done, batch[i].ID)
			delete(c.reported, batch[i].ID)
		case LeavePending:
			if _, seen := c.reported[batch[i].ID]; !seen {
				if len(c.reported) >= maxReported {
					clear(c.reported)
				}
				c.reported[batch[i].ID] = struct{}{}
				c.log.Warn("message left pending", "id", batch[i].ID)
			}
		}
	}
	if len(done) > 0 {
		args := append([]any{c.cfg.Group}, done...)
		if err := c.ack.Run(ctx, c.rdb, []string{c.cfg.Stream}, args...).Err(); err != nil {
			return res, fmt.Errorf("ack %d entries: %w", len(done), err)
		}
	}
	return res, nil
}

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
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", cmp.Or(host, "host"), os.Getpid(), hex.EncodeToString(b[:]))
}
