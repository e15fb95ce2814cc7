package voucher

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"seckill/internal/redisconn"
)

// TestNewKeysNames pins the single-server key names: a deployment that
// upgrades keeps finding its data.
func TestNewKeysNames(t *testing.T) {
	t.Parallel()
	k := NewKeys("", 3)
	for _, c := range []struct{ got, want string }{
		{k.Tag(0), "seckill:{0}"},
		{k.Tag(1), "seckill:{1}"},
		{k.Tag(2), "seckill:{2}"},
		{k.Tag(7), "seckill:{7}"}, // past the last shard: the same spelling
		{k.State(7), "seckill:{1}:voucher:7"},
		{k.Buyers(7), "seckill:{1}:voucher:7:buyers"},
		{k.State(-1), "seckill:{0}:voucher:-1"},
		{k.Ready(2), "seckill:{2}:ready"},
		{k.Rebuilding(2), "seckill:{2}:rebuilding"},
		{k.Stream(0), "seckill:{0}:orders"},
		{k.Pending(1), "seckill:{1}:pending"},
		{k.Delayed(1), "seckill:{1}:delayed"},
		{NewKeys("shop", 0).Stream(0), "shop:{0}:orders"},
		{KeysFor("shop", 2, false).Tag(1), "shop:{1}"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if k.Shards() != 3 || k.Prefix() != "seckill" || k.Shard(7) != 1 || NewKeys("", 0).Shards() != 1 {
		t.Errorf("Shards %d, Prefix %q, Shard(7) %d, NewKeys(\"\", 0).Shards() %d",
			k.Shards(), k.Prefix(), k.Shard(7), NewKeys("", 0).Shards())
	}
}

// TestClusterKeysSpread checks that every shard's tag hashes into the middle
// half of its part of the slot range, that it is the first "i.k" to do so
// (the rule every process follows to find the same tags), and that all keys
// of a shard share its slot.
func TestClusterKeysSpread(t *testing.T) {
	t.Parallel()
	counts := []int{1024}
	for n := 1; n <= 64; n++ {
		counts = append(counts, n)
	}
	for _, n := range counts {
		k := NewClusterKeys("shop", n)
		if KeysFor("shop", n, true).Tag(n-1) != k.Tag(n-1) {
			t.Fatalf("KeysFor(cluster) differs from NewClusterKeys for %d shards", n)
		}
		if k.Shards() != n {
			t.Fatalf("%d shards: Shards() = %d", n, k.Shards())
		}
		seen := map[string]bool{}
		for i := range n {
			tag := k.Tag(i)
			if seen[tag] {
				t.Fatalf("%d shards: tag %q twice", n, tag)
			}
			seen[tag] = true
			lo, hi := i*redisconn.SlotCount/n, (i+1)*redisconn.SlotCount/n
			slot := redisconn.Slot(tag)
			if q := (hi - lo) / 4; slot < lo+q || slot >= hi-q {
				t.Fatalf("%d shards: shard %d tag %q slot %d outside [%d, %d)", n, i, tag, slot, lo+q, hi-q)
			}
			for _, key := range []string{k.Stream(i), k.Ready(i), k.Pending(i), k.Delayed(i), k.Rebuilding(i)} {
				if redisconn.Slot(key) != slot {
					t.Fatalf("%q: slot %d, its shard's %d", key, redisconn.Slot(key), slot)
				}
			}
			if n <= 64 {
				if want := "shop:{" + firstFit(i, n) + "}"; tag != want {
					t.Fatalf("%d shards: shard %d tag %q, the first fitting is %q", n, i, tag, want)
				}
			}
		}
		for id := int64(0); id < int64(3*n); id += 1 + int64(n/7) {
			if got, want := redisconn.Slot(k.State(id)), redisconn.Slot(k.Tag(k.Shard(id))); got != want || redisconn.Slot(k.Buyers(id)) != want {
				t.Fatalf("voucher %d: state slot %d, buyers slot %d, shard slot %d", id, got, redisconn.Slot(k.Buyers(id)), want)
			}
			if !strings.HasSuffix(k.State(id), fmt.Sprintf(":voucher:%d", id)) {
				t.Fatalf("State(%d) = %q", id, k.State(id))
			}
		}
	}
}

// firstFit is the tag search spelled as plainly as possible: the first
// "i.k" whose slot lies in the middle half of part i of n.
func firstFit(i, n int) string {
	lo, hi := i*16384/n, (i+1)*16384/n
	q := (hi - lo) / 4
	for k := 0; ; k++ {
		c := fmt.Sprintf("%d.%d", i, k)
		if s := redisconn.Slot(c); s >= lo+q && s < hi-q {
			return c
		}
	}
}

// redisCliRanges returns the first slot of each of m masters as
// redis-cli --cluster create assigns them: 16384/m slots each (a float),
// each range ending at the rounded cursor, the last taking the rest. For 3
// masters: 0-5460, 5461-10922, 10923-16383.
func redisCliRanges(m int) []int {
	per := float64(float32(16384) / float32(m))
	starts := make([]int, m)
	first, cursor := 0, 0.0
	for i := range m {
		starts[i] = first
		last := int(math.Round(cursor + per - 1))
		if last < first {
			last = first
		}
		first = last + 1
		cursor += per
	}
	return starts
}

// perMaster counts the shards whose slot each master serves.
func perMaster(k Keys, starts []int) []int {
	counts := make([]int, len(starts))
	for s := range k.Shards() {
		slot := redisconn.Slot(k.Tag(s))
		m, found := slices.BinarySearch(starts, slot)
		if !found {
			m--
		}
		counts[m]++
	}
	return counts
}

// TestClusterKeysEvenOnMasters checks the point of the cluster tags: on the
// slot layout redis-cli creates, a shard count that is a multiple of the
// master count puts the same number of shards on every master. Any other
// count puts within one of shards/masters on each: the parts of the slot
// range and the masters' ranges do not line up, and a part straddling two
// masters may land on either.
func TestClusterKeysEvenOnMasters(t *testing.T) {
	t.Parallel()
	if got, want := redisCliRanges(3), []int{0, 5461, 10923}; !slices.Equal(got, want) {
		t.Fatalf("redis-cli ranges for 3 masters start at %v, want %v", got, want)
	}
	for _, n := range []int{3, 6, 9} {
		if got := perMaster(NewClusterKeys("", n), redisCliRanges(3)); !slices.Equal(got, []int{n / 3, n / 3, n / 3}) {
			t.Errorf("%d shards on 3 masters: %v", n, got)
		}
	}
	for m := 3; m <= 12; m++ {
		for n := 1; n <= 64; n++ {
			counts := perMaster(NewClusterKeys("", n), redisCliRanges(m))
			lo, hi := slices.Min(counts), slices.Max(counts)
			if n%m == 0 && lo != hi || lo < n/m-1 || hi > (n+m-1)/m+1 {
				t.Errorf("%d shards on %d masters: %v", n, m, counts)
			}
		}
	}
	// The single-server tags, for contrast: 3 shards on 3 masters leave one
	// master without a shard.
	if got := perMaster(NewKeys("", 3), redisCliRanges(3)); !slices.Contains(got, 0) {
		t.Errorf("single-server tags of 3 shards on 3 masters: %v, expected one master empty", got)
	}
}

var sink string

// BenchmarkKeysState measures the key names of the purchase path.
func BenchmarkKeysState(b *testing.B) {
	for name, k := range map[string]Keys{"single": NewKeys("seckill", 16), "cluster": NewClusterKeys("seckill", 16)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := range b.N {
				sink = k.State(int64(i))
				sink = k.Buyers(int64(i))
			}
		})
	}
}

// BenchmarkNewClusterKeys measures the tag search at the largest shard count.
func BenchmarkNewClusterKeys(b *testing.B) {
	for range b.N {
		_ = NewClusterKeys("seckill", 1024)
	}
}

// TestSplitStock: the stocks of buckets loaded all at once never add up,
// with the buyers the buckets hold, to more than the voucher's units, even
// when a bucket sold more than its share before the state was lost.
func TestSplitStock(t *testing.T) {
	for _, c := range []struct {
		total int64
		held  []int64
		want  []int64
	}{
		{10, []int64{0, 0, 0}, []int64{4, 3, 3}},
		{10, []int64{2, 1, 0}, []int64{2, 2, 3}},
		{10, []int64{8, 1}, []int64{0, 1}},
		{10, []int64{6, 0, 0}, []int64{0, 2, 2}},
		{10, []int64{9, 3}, []int64{0, 0}},
	} {
		got := SplitStock(c.total, c.held)
		if !slices.Equal(got, c.want) {
			t.Errorf("SplitStock(%d, %v) = %v, want %v", c.total, c.held, got, c.want)
		}
		var sum int64
		for b := range got {
			sum += got[b] + c.held[b]
		}
		if sum > max(c.total, 0) && slices.ContainsFunc(got, func(x int64) bool { return x > 0 }) {
			t.Errorf("SplitStock(%d, %v): %d units with the buyers", c.total, c.held, sum)
		}
	}
}
