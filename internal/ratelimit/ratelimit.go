// Package ratelimit holds in-process token buckets keyed by a string (a user
// id, a client address) and the Gin middleware that answers 429 with
// Retry-After when a bucket is empty.
//
// The buckets live in one process: with N instances behind nginx a client
// gets up to N times the limit. They are the second line behind nginx's
// limit_req, cheap enough for the purchase path (no Redis round trip), and
// they keep one noisy client from taking an instance's whole Redis pool.
package ratelimit

import (
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Rule is a token bucket: Burst tokens at most, refilled at Burst per Per.
// The zero Rule allows everything.
type Rule struct {
	Burst int
	Per   time.Duration
}

// Off reports whether the rule allows everything.
func (r Rule) Off() bool { return r.Burst <= 0 || r.Per <= 0 }

func (r Rule) String() string {
	if r.Off() {
		return "off"
	}
	return strconv.Itoa(r.Burst) + "/" + r.Per.String()
}

// ParseRule reads "N/D" (N requests, refilled over duration D, e.g. "5/1s",
// "10/1m") or "off".
func ParseRule(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if s == "off" || s == "0" {
		return Rule{}, nil
	}
	n, d, ok := strings.Cut(s, "/")
	if !ok {
		return Rule{}, fmt.Errorf("rate %q: want N/DURATION such as 5/1s, or off", s)
	}
	burst, err := strconv.Atoi(n)
	if err != nil || burst < 1 || burst > 1_000_000 {
		return Rule{}, fmt.Errorf("rate %q: N must be an integer from 1 to 1000000", s)
	}
	per, err := time.ParseDuration(d)
	if err != nil || per < time.Millisecond || per > 24*time.Hour {
		return Rule{}, fmt.Errorf("rate %q: DURATION must be from 1ms to 24h, such as 1s or 1m", s)
	}
	return Rule{Burst: burst, Per: per}, nil
}

// shards spreads the buckets over locks so that concurrent purchases from
// different users rarely meet on one mutex.
const shards = 32

// maxKeysPerShard bounds memory under a flood of distinct keys (spoofed
// addresses): past it, full buckets are dropped, and if none is full the
// oldest half is, which only ever errs towards allowing.
const maxKeysPerShard = 4096

// Limiter is a set of token buckets with one rule. It is safe for
// concurrent use.
type Limiter struct {
	rule  Rule
	now   func() time.Time
	seed  maphash.Seed
	shard [shards]struct {
		sync.Mutex
		buckets map[string]*bucket
	}
}

type bucket struct {
	tokens float64
	last   time.Time
}

// New returns a Limiter; now is the clock (time.Now when nil), injectable
// so tests need not sleep.
func New(rule Rule, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	l := &Limiter{rule: rule, now: now, seed: maphash.MakeSeed()}
	for i := range l.shard {
		l.shard[i].buckets = map[string]*bucket{}
	}
	return l
}

// Rule is the limiter's rule.
func (l *Limiter) Rule() Rule { return l.rule }

// Allow takes one token from key's bucket. When it is empty it reports
// false and how long until a token is back.
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration) {
	if l == nil || l.rule.Off() {
		return true, 0
	}
	rate := float64(l.rule.Burst) / float64(l.rule.Per) // tokens per nanosecond
	now := l.now()
	s := &l.shard[maphash.String(l.seed, key)%shards]
	s.Lock()
	defer s.Unlock()
	b, found := s.buckets[key]
	if !found {
		if len(s.buckets) >= maxKeysPerShard {
			l.evict(s.buckets, now, rate)
		}
		b = &bucket{tokens: float64(l.rule.Burst), last: now}
		s.buckets[key] = b
	}
	if el := now.Sub(b.last); el > 0 {
		b.tokens = math.Min(float64(l.rule.Burst), b.tokens+float64(el)*rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration(math.Ceil((1 - b.tokens) / rate))
	return false, max(wait, time.Millisecond)
}

// evict drops buckets that have refilled (forgetting them changes
// nothing), and when none has, the least recently used half.
func (l *Limiter) evict(m map[string]*bucket, now time.Time, rate float64) {
	for k, b := range m {
		if b.tokens+float64(now.Sub(b.last))*rate >= float64(l.rule.Burst) {
			delete(m, k)
		}
	}
	if len(m) < maxKeysPerShard {
		return
	}
	var sum int64
	for _, b := range m {
		sum += b.last.UnixNano() / int64(len(m))
	}
	for k, b := range m {
		if b.last.UnixNano() <= sum {
			delete(m, k)
		}
	}
}
