// Package idgen makes 64-bit order ids that are unique across instances and
// restarts and roughly ordered by time, without a network round trip per id.
//
// An id is 41 bits of milliseconds since Epoch, 10 bits of worker number and
// 12 bits of sequence. Each instance leases its worker number from Redis at
// start-up and keeps renewing it; while the lease is not known to be held,
// Next refuses to make ids, so two live instances never share a number.
package idgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Epoch is the zero of the id clock: 2026-01-01 UTC. 41 bits of
// milliseconds last about 69 years from it.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const (
	workerBits = 10
	seqBits    = 12
	maxWorker  = 1<<workerBits - 1
	maxSeq     = 1<<seqBits - 1
	// maxBackwards is how far the wall clock may step back before Next fails
	// instead of waiting for it to catch up.
	maxBackwards = 50 * time.Millisecond
)

// ErrNoLease means the worker number's lease is not known to be held (Redis
// unreachable long enough, or the lease lost): making ids could collide.
var ErrNoLease = errors.New("id worker lease not held")

// Generator makes ids. It is safe for concurrent use.
type Generator struct {
	rdb    redis.Cmdable
	key    string
	prefix string
	owner  string
	worker int64
	ttl    time.Duration
	log    *slog.Logger
	now    func() time.Time

	mu         sync.Mutex
	lastMs     int64
	seq        int64
	validUntil time.Time
}

// Config tunes the lease.
type Config struct {
	// KeyPrefix names the lease keys: <prefix>:idgen:worker:<n>.
	KeyPrefix string
	// TTL is the lease time; it is renewed every TTL/3. Default 30s.
	TTL time.Duration
}

var renewScript = redis.NewScript(`
-- KEYS[1] lease key; ARGV[1] owner token; ARGV[2] ttl ms
-- Returns 1 when the caller still owns the lease (and it was extended), 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)

var releaseScript = redis.NewScript(`
-- KEYS[1] lease key; ARGV[1] owner token
-- Returns 1 when the lease was released, 0 when the caller did not own it.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// Lease takes the first free worker number and returns a Generator that uses
// it. Run must run for the lease to be renewed.
func Lease(ctx context.Context, rdb redis.Cmdable, cfg Config, log *slog.Logger) (*Generator, error) {
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("lease id worker: %w", err)
	}
	owner := hex.EncodeToString(b[:])
	// Start at a random number so instances that start together rarely race
	// for the same one.
	start := int64(b[0])<<2 | int64(b[1]&3)
	w, key, before, err := take(ctx, rdb, cfg.KeyPrefix, owner, ttl, start)
	if err != nil {
		return nil, err
	}
	g := &Generator{
		rdb: rdb, key: key, owner: owner, worker: w, ttl: ttl, log: log, now: time.Now,
		prefix: cfg.KeyPrefix, validUntil: before.Add(ttl - ttl/10),
	}
	log.Info("id worker leased", "worker", w)
	return g, nil
}

// take leases the first free worker number from start on; before is when
// the winning request was sent, the lease's start as far as we know.
func take(ctx context.Context, rdb redis.Cmdable, prefix, owner string, ttl time.Duration, start int64) (w int64, key string, before time.Time, err error) {
	for i := int64(0); i <= maxWorker; i++ {
		w = (start + i) & maxWorker
		key = leaseKey(prefix, w)
		before = time.Now()
		ok, err := rdb.SetNX(ctx, key, owner, ttl).Result()
		if err != nil {
			return 0, "", time.Time{}, fmt.Errorf("lease id worker: %w", err)
		}
		if ok {
			return w, key, before, nil
		}
	}
	return 0, "", time.Time{}, fmt.Errorf("lease id worker: all %d worker numbers are taken", maxWorker+1)
}

// Worker is the leased worker number.
func (g *Generator) Worker() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.worker
}

// Next returns a new id.
func (g *Generator) Next() (int64, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if now.After(g.validUntil) {
		return 0, ErrNoLease
	}
	ms := now.Sub(Epoch).Milliseconds()
	if ms < g.lastMs {
		if time.Duration(g.lastMs-ms)*time.Millisecond > maxBackwards {
			return 0, fmt.Errorf("next id: clock stepped back %dms", g.lastMs-ms)
		}
		ms = g.lastMs // keep counting in the last millisecond
	}
	if ms == g.lastMs {
		g.seq++
		if g.seq > maxSeq {
			// This millisecond is used up: borrow the next one. The clock
			// catches up within a few ms even at full rate.
			ms++
			g.seq = 0
		}
	} else {
		g.seq = 0
	}
	g.lastMs = ms
	return ms<<(workerBits+seqBits) | g.worker<<seqBits | g.seq, nil
}

// Run renews the lease until ctx is done, then releases it.
func (g *Generator) Run(ctx context.Context) error {
	t := time.NewTicker(g.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			g.mu.Lock()
			g.validUntil = time.Time{}
			g.mu.Unlock()
			if err := releaseScript.Run(rctx, g.rdb, []string{g.key}, g.owner).Err(); err != nil {
				g.log.Warn("id worker lease not released; it expires on its own", "err", err)
			}
			return nil
		case <-t.C:
		}
		before := time.Now()
		held, err := renewScript.Run(ctx, g.rdb, []string{g.key}, g.owner, g.ttl.Milliseconds()).Int()
		switch {
		case err != nil:
			if ctx.Err() == nil {
				g.log.Warn("id worker lease renewal failed", "err", err)
			}
		case held == 1:
			g.mu.Lock()
			g.validUntil = before.Add(g.ttl - g.ttl/10)
			g.mu.Unlock()
		default:
			// The lease expired and may be someone else's now: stop making
			// ids and lease a free number afresh (it may be the same one,
			// if nobody took it).
			g.mu.Lock()
			g.validUntil = time.Time{}
			g.mu.Unlock()
			w, key, before, err := take(ctx, g.rdb, g.prefix, g.owner, g.ttl, g.worker)
			if err != nil {
				g.log.Error("id worker lease lost; purchases fail until a number is leased again", "worker", g.worker, "err", err)
				continue
			}
			g.mu.Lock()
			lost := g.worker
			g.worker, g.key, g.validUntil = w, key, before.Add(g.ttl-g.ttl/10)
			g.mu.Unlock()
			g.log.Warn("id worker lease was lost; leased again", "lost", lost, "worker", w)
		}
	}
}

func leaseKey(prefix string, worker int64) string {
	if prefix == "" {
		prefix = "seckill"
	}
	return fmt.Sprintf("%s:idgen:worker:%d", prefix, worker)
}
