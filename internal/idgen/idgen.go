// Package idgen makes 64-bit order ids that are unique across instances and
// restarts and roughly ordered by time, without a network round trip per id.
//
// An id is 41 bits of milliseconds since Epoch, 10 bits of worker number and
// 12 bits of sequence. Each instance leases its worker number from Redis at
// start-up and keeps renewing it; while the lease is not known to be held,
// Next refuses to make ids, so two live instances never share a number.
//
// The milliseconds come from the id clock, not from the wall clock: it is
// read from the wall clock once, when the number is leased, and then runs on
// the monotonic clock, so a wall clock stepped back (NTP) does not stop ids
// or make them go back. A step forward is taken up at the next renewal.
// Next to each lease Redis keeps the number's mark: the id clock's highest
// millisecond its holder may have used. A new holder of the number, be it
// the same instance after a restart with a wall clock that went back, starts
// its id clock above the mark, so no millisecond of a number is used twice.
// Marks live as long as Redis keeps its data: after a restart without
// persistence a holder starts from the wall clock again, and the orders
// table's primary key is what stands between a repeated id and an order.
package idgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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
)

// ErrNoLease means the worker number's lease is not known to be held (Redis
// unreachable long enough, or the lease lost): making ids could collide.
var ErrNoLease = errors.New("id worker lease not held")

// Clock is what the generator reads time from. Wall is read only when a
// number is leased or renewed; Mono, which never steps, between the two.
type Clock interface {
	Wall() time.Time
	// Mono is the time since an origin of the clock's choice.
	Mono() time.Duration
}

// systemClock is the process's clocks: Mono is time.Since of a time.Time
// taken at start, which Go measures on the monotonic clock.
type systemClock struct{ origin time.Time }

func (c systemClock) Wall() time.Time     { return time.Now() }
func (c systemClock) Mono() time.Duration { return time.Since(c.origin) }

// Generator makes ids. It is safe for concurrent use.
type Generator struct {
	rdb    redis.Cmdable
	key    string
	prefix string
	owner  string
	worker int64
	ttl    time.Duration
	log    *slog.Logger
	clock  Clock

	mu     sync.Mutex
	lastMs int64
	seq    int64
	// The id clock reads anchorMs at the Mono reading anchor.
	anchor   time.Duration
	anchorMs int64
	// maxMs is the mark this holder wrote to Redis: no id goes above it.
	maxMs int64
	// floorMs is the mark found at lease time: every id of this lease is
	// above it.
	floorMs int64
	// validUntil is the Mono reading after which the lease is not known
	// to be held; zero when it is not held.
	validUntil time.Duration
}

// Config tunes the lease.
type Config struct {
	// KeyPrefix names the lease keys: <prefix>:idgen:worker:<n>.
	KeyPrefix string
	// TTL is the lease time; it is renewed every TTL/3. Default 30s.
	TTL time.Duration
	// Clock is read for the id clock; default the system's clocks.
	Clock Clock
}

// leaseScript takes a free worker number and moves its mark past the
// caller's lease.
var leaseScript = redis.NewScript(`
-- KEYS[1] lease key (string: owner token, expires)
-- KEYS[2] the number's mark (string: highest id-clock ms its holders may have used; never expires)
-- ARGV[1] owner token; ARGV[2] lease ms; ARGV[3] the caller's id clock now, ms
-- Returns the ms the caller's id clock starts at (above the mark), or -1 when
-- the number is taken. The mark is read before the first write.
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
if mark == nil then
  return redis.error_reply('id worker mark is not a number')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -1
end
local start = math.max(tonumber(ARGV[3]), mark + 1)
redis.call('SET', KEYS[2], string.format('%d', start + tonumber(ARGV[2])))
return start`)

var renewScript = redis.NewScript(`
-- KEYS[1] lease key; KEYS[2] the number's mark
-- ARGV[1] owner token; ARGV[2] lease ms; ARGV[3] the caller's id clock now, ms
-- Returns 1 when the caller still owns the lease: it was extended and the
-- mark raised to ARGV[3] + ARGV[2] (never lowered); 0 otherwise.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
if mark == nil then
  return redis.error_reply('id worker mark is not a number')
end
local want = tonumber(ARGV[3]) + tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if want > mark then
  redis.call('SET', KEYS[2], string.format('%d', want))
end
return 1`)

var releaseScript = redis.NewScript(`
-- KEYS[1] lease key; KEYS[2] the number's mark
-- ARGV[1] owner token; ARGV[2] the highest ms the caller used
-- Returns 1 when the lease was released, 0 when the caller did not own it.
-- The owner makes no ids any more, so its mark comes down to what it used:
-- the next holder's id clock then starts near the wall clock.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return redis.call('DEL', KEYS[1])`)

// Lease takes the first free worker number and returns a Generator that uses
// it. Run must run for the lease to be renewed.
func Lease(ctx context.Context, rdb redis.Cmdable, cfg Config, log *slog.Logger) (*Generator, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("lease id worker: %w", err)
	}
	// Start at a random number so instances that start together rarely race
	// for the same one.
	return lease(ctx, rdb, cfg, log, hex.EncodeToString(b[:]), int64(b[0])<<2|int64(b[1]&3))
}

func lease(ctx context.Context, rdb redis.Cmdable, cfg Config, log *slog.Logger, owner string, start int64) (*Generator, error) {
	ttl := cfg.TTL
	if ttl <= 0 {
		ttl = 30 * time.Second
	}
	clock := cfg.Clock
	if clock == nil {
		clock = systemClock{origin: time.Now()}
	}
	g := &Generator{rdb: rdb, owner: owner, ttl: ttl, log: log, clock: clock, prefix: cfg.KeyPrefix}
	if err := g.take(ctx, start, wallMs(clock.Wall())); err != nil {
		return nil, err
	}
	log.Info("id worker leased", "worker", g.worker)
	return g, nil
}

func wallMs(t time.Time) int64 { return t.Sub(Epoch).Milliseconds() }

// take leases the first free worker number from start on, with the id clock
// starting at fromMs or above the number's mark, and makes it the
// generator's. A number whose key cannot be reached is passed over: on a
// Redis Cluster each number's key lives on some master, and an instance
// starting while one master is down takes a number on another. It gives
// up after maxUnreached numbers in a row could not be reached.
func (g *Generator) take(ctx context.Context, start, fromMs int64) error {
	ttlMs := g.ttl.Milliseconds()
	unreached := 0
	for i := int64(0); i <= maxWorker; i++ {
		w := (start + i) & maxWorker
		key := leaseKey(g.prefix, w)
		before := g.clock.Mono()
		ms, err := leaseScript.Run(ctx, g.rdb, []string{key, markKey(key)}, g.owner, ttlMs, fromMs).Int64()
		if err != nil {
			unreached++
			if ctx.Err() != nil || unreached == maxUnreached {
				return fmt.Errorf("lease id worker: %w", err)
			}
			continue
		}
		unreached = 0
		if ms < 0 {
			continue
		}
		g.mu.Lock()
		g.worker, g.key = w, key
		g.anchor, g.anchorMs = before, ms
		g.floorMs, g.maxMs = ms-1, ms+ttlMs
		g.validUntil = before + g.ttl - g.ttl/10
		g.mu.Unlock()
		return nil
	}
	return fmt.Errorf("lease id worker: all %d worker numbers are taken", maxWorker+1)
}

// maxUnreached bounds the worker numbers in a row take passes over
// because their key could not be reached.
const maxUnreached = 16

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
	now := g.clock.Mono()
	if now >= g.validUntil {
		return 0, ErrNoLease
	}
	ms := max(g.anchorMs+int64((now-g.anchor)/time.Millisecond), g.lastMs)
	seq := int64(0)
	if ms == g.lastMs {
		seq = g.seq + 1
		if seq > maxSeq {
			// This millisecond is used up: borrow the next one. The clock
			// catches up within a few ms even at full rate.
			ms++
			seq = 0
		}
	}
	if ms > g.maxMs {
		// Only borrowing gets here: the mark in Redis is a lease ahead of
		// the id clock.
		return 0, fmt.Errorf("next id: %dms ahead of the id clock's mark", ms-g.maxMs)
	}
	g.lastMs, g.seq = ms, seq
	return ms<<(workerBits+seqBits) | g.worker<<seqBits | seq, nil
}

// reading is the id clock at the Mono reading m, never behind an id made
// or a wall clock that stepped forward. Callers hold mu.
func (g *Generator) reading(m time.Duration) int64 {
	return max(g.anchorMs+int64((m-g.anchor)/time.Millisecond), g.lastMs, wallMs(g.clock.Wall()))
}

// Run renews the lease until ctx is done, then releases it.
func (g *Generator) Run(ctx context.Context) error {
	t := time.NewTicker(g.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.release(ctx)
			return nil
		case <-t.C:
		}
		g.renew(ctx)
	}
}

// renew extends the lease and moves the id clock's mark a lease ahead; the
// id clock takes up a wall clock that stepped forward.
func (g *Generator) renew(ctx context.Context) {
	before := g.clock.Mono()
	g.mu.Lock()
	key, at := g.key, g.reading(before)
	g.mu.Unlock()
	held, err := renewScript.Run(ctx, g.rdb, []string{key, markKey(key)}, g.owner, g.ttl.Milliseconds(), at).Int()
	switch {
	case err != nil:
		if ctx.Err() == nil {
			g.log.Warn("id worker lease renewal failed", "err", err)
		}
	case held == 1:
		g.mu.Lock()
		if g.key == key {
			g.anchor, g.anchorMs = before, at
			g.maxMs = at + g.ttl.Milliseconds()
			g.validUntil = before + g.ttl - g.ttl/10
		}
		g.mu.Unlock()
	default:
		// The lease expired and may be someone else's now: stop making
		// ids and lease a free number afresh (it may be the same one,
		// if nobody took it), the id clock going on from where it is.
		g.mu.Lock()
		g.validUntil = 0
		lost := g.worker
		from := g.reading(g.clock.Mono()) + 1
		g.mu.Unlock()
		if err := g.take(ctx, lost, from); err != nil {
			g.log.Error("id worker lease lost; purchases fail until a number is leased again", "worker", lost, "err", err)
			return
		}
		g.log.Warn("id worker lease was lost; leased again", "lost", lost, "worker", g.Worker())
	}
}

// release stops making ids and gives the number back, its mark lowered to
// the last id made.
func (g *Generator) release(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	g.mu.Lock()
	g.validUntil = 0
	key, used := g.key, max(g.lastMs, g.floorMs)
	g.mu.Unlock()
	if err := releaseScript.Run(rctx, g.rdb, []string{key, markKey(key)}, g.owner, used).Err(); err != nil {
		g.log.Warn("id worker lease not released; it expires on its own", "err", err)
	}
}

func leaseKey(prefix string, worker int64) string {
	if prefix == "" {
		prefix = "seckill"
	}
	return fmt.Sprintf("%s:idgen:worker:%d", prefix, worker)
}

// markKey is the mark kept next to a lease key. Its hash tag is the lease
// key, so on a cluster both sit in the lease key's slot (a prefix with its
// own tag already puts them together).
func markKey(lease string) string {
	if strings.Contains(lease, "{") {
		return lease + ":mark"
	}
	return "{" + lease + "}:mark"
}

// Time is when id was made: its milliseconds since Epoch. An order's id
// names when it was accepted.
func Time(id int64) time.Time {
	return Epoch.Add(time.Duration(id>>(workerBits+seqBits)) * time.Millisecond).UTC()
}
