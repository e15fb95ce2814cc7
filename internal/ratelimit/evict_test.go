package ratelimit

import (
	"hash/maphash"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestEvictionKeepsEmptyRecentBuckets: when a shard is full, eviction
// drops buckets that have refilled (forgetting them changes nothing) and
// then the least recently used half, never a recent bucket still empty:
// a client refused a moment ago stays refused however many new keys come.
func TestEvictionKeepsEmptyRecentBuckets(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	l := New(Rule{Burst: 1, Per: time.Hour}, c.now)
	shard := func(k string) *struct {
		sync.Mutex
		buckets map[string]*bucket
	} {
		return &l.shard[maphash.String(l.seed, k)%shards]
	}
	const victim = "victim"
	s := shard(victim)
	// Older keys of the victim's shard, each with its token used.
	filled := 0
	for i := 0; filled < maxKeysPerShard-1; i++ {
		k := "old" + strconv.Itoa(i)
		if shard(k) != s {
			continue
		}
		l.Allow(k)
		filled++
		c.add(time.Millisecond)
	}
	if ok, _ := l.Allow(victim); !ok {
		t.Fatal("the victim's first request refused")
	}
	if ok, _ := l.Allow(victim); ok {
		t.Fatal("the victim's second request allowed: the bucket holds one token")
	}
	// One more key fills the shard past its bound: eviction runs.
	c.add(time.Millisecond)
	for i := 0; len(s.buckets) >= maxKeysPerShard-1; i++ {
		if k := "new" + strconv.Itoa(i); shard(k) == s {
			l.Allow(k)
		}
	}
	if _, kept := s.buckets[victim]; !kept {
		t.Fatal("eviction dropped the victim's recent, still empty bucket")
	}
	if ok, _ := l.Allow(victim); ok {
		t.Fatal("the victim was allowed again after an eviction, within the hour its token takes")
	}
}
