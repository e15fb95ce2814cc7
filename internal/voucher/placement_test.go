package voucher

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

// TestPlacementSingle: on one server every shard is on that server, and
// each place names its shard's tag and slot.
func TestPlacementSingle(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	k := NewKeys("", 4)
	places, err := k.Placement(context.Background(), srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(places) != 4 {
		t.Fatalf("%d places for 4 shards", len(places))
	}
	for i, p := range places {
		if want := (ShardPlace{Shard: i, Tag: "seckill:{" + strconv.Itoa(i) + "}", Slot: p.Slot, Master: srv.Addr}); p != want {
			t.Errorf("shard %d: %+v, want %+v", i, p, want)
		}
	}
}

// TestPlacementCluster: on a real 3-master cluster laid out by redis-cli,
// Placement names for each shard the master the cluster itself says serves
// the shard's keys, and 3 (6) cluster-tagged shards put one (two) on each
// master.
func TestPlacementCluster(t *testing.T) {
	t.Parallel()
	cl := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	rdb := cl.Client(t)
	ctx := context.Background()

	// The layout the even-spread test assumes is the one redis-cli made.
	ranges, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var starts []int
	for _, r := range ranges {
		starts = append(starts, r.Start)
	}
	slices.Sort(starts)
	if want := redisCliRanges(3); !slices.Equal(starts, want) {
		t.Errorf("redis-cli made ranges starting at %v, the tests assume %v", starts, want)
	}

	for _, n := range []int{3, 6} {
		k := NewClusterKeys("", n)
		places, err := k.Placement(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		perMaster := map[string]int{}
		for i, p := range places {
			if p.Shard != i || p.Tag != k.Tag(i) || p.Slot != cl.KeySlot(t, k.Stream(i)) {
				t.Errorf("%d shards: place %+v, want shard %d tag %q slot %d", n, p, i, k.Tag(i), cl.KeySlot(t, k.Stream(i)))
			}
			if want := cl.MasterOf(t, k.Stream(i)).Addr; p.Master != want {
				t.Errorf("%d shards: shard %d on %q, the cluster says %q", n, i, p.Master, want)
			}
			perMaster[p.Master]++
		}
		if len(perMaster) != 3 {
			t.Errorf("%d shards on %d masters, want 3: %v", n, len(perMaster), perMaster)
		}
		for m, c := range perMaster {
			if c != n/3 {
				t.Errorf("%d shards: master %s holds %d, want %d", n, m, c, n/3)
			}
		}
	}
}

// TestMasterOf covers the slot map lookup's edges: the ends of ranges, a
// gap no master serves, and no slot map at all.
func TestMasterOf(t *testing.T) {
	t.Parallel()
	node := func(a string) []redis.ClusterNode { return []redis.ClusterNode{{Addr: a}} }
	ranges := []redis.ClusterSlot{
		{Start: 0, End: 99, Nodes: node("a")},
		{Start: 100, End: 149, Nodes: node("b")},
		{Start: 200, End: 16383, Nodes: node("c")},
	}
	for slot, want := range map[int]string{0: "a", 99: "a", 100: "b", 149: "b", 150: "", 199: "", 200: "c", 16383: "c"} {
		if got := masterOf(ranges, slot); got != want {
			t.Errorf("slot %d: %q, want %q", slot, got, want)
		}
	}
	if got := masterOf(nil, 5); got != "" {
		t.Errorf("no ranges: %q", got)
	}
}
