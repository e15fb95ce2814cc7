package voucher

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestLoadLeavesLiveBuyers: a load that finds the state there writes
// nothing, its buyers included: a buyer entry removed by a release since
// the load read the database is not written back (a second delivery of
// that release would then give the unit back twice). A load whose guard
// is gone writes nothing either; a load that writes the state puts its
// buyers in place with it, and leaves no staged key behind.
func TestLoadLeavesLiveBuyers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	st := NewState(rdb, keys)
	v := Voucher{ID: 9, Stock: 10, BeginAt: time.Now().Add(-time.Hour), EndAt: time.Now().Add(time.Hour)}
	buyers := func() map[string]string {
		m, err := rdb.HGetAll(ctx, keys.Buyers(v.ID)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if ok, err := st.Load(ctx, v, map[int64]int64{1: 101}); err != nil || !ok {
		t.Fatalf("first load: %v, %v", ok, err)
	}
	if got, want := buyers(), map[string]string{"1": "101"}; !maps.Equal(got, want) {
		t.Fatalf("buyers %v, want %v", got, want)
	}
	// Buyer 1's order is released (entry removed); a late load read the
	// database before and still counts buyers 1 and 2.
	rdb.HDel(ctx, keys.Buyers(v.ID), "1")
	if ok, err := st.Load(ctx, v, map[int64]int64{1: 101, 2: 102}); err != nil || ok {
		t.Fatalf("load over live state: %v, %v; want nothing written", ok, err)
	}
	if got := buyers(); len(got) != 0 {
		t.Errorf("buyers %v after a load that found the state, want none written back", got)
	}
	g := Guard{Key: keys.Tag(0) + ":guard", Field: "9", Value: "mine"}
	rdb.Del(ctx, keys.State(v.ID))
	if ok, err := st.loadAt(ctx, 0, v, 9, map[int64]int64{3: 103}, nil, &g); !errors.Is(err, errGuardLost) || ok {
		t.Fatalf("load without its guard: %v, %v; want errGuardLost", ok, err)
	}
	if n, _ := rdb.Exists(ctx, keys.State(v.ID)).Result(); n != 0 || len(buyers()) != 0 {
		t.Errorf("a load refused by its guard wrote the state (%d) or buyers %v", n, buyers())
	}
	rdb.HSet(ctx, g.Key, g.Field, g.Value)
	if ok, err := st.loadAt(ctx, 0, v, 9, map[int64]int64{3: 103}, nil, &g); err != nil || !ok {
		t.Fatalf("load under its guard: %v, %v", ok, err)
	}
	if got, want := buyers(), map[string]string{"3": "103"}; !maps.Equal(got, want) {
		t.Errorf("buyers %v, want %v", got, want)
	}
	if left, _ := rdb.Keys(ctx, keys.Buyers(v.ID)+":loading:*").Result(); len(left) != 0 {
		t.Errorf("staged buyers left behind: %v", left)
	}
}

// TestReopenChecksGuards: a shard reopens only while every guard holds
// its rebuild's value: a guard holding another rebuild's value (a
// takeover), or none, keeps the shard closed and its lease held; each
// guard is checked, not only the first.
func TestReopenChecksGuards(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := NewKeys(testenv.Prefix(t), 1)
	st := NewState(rdb, keys)
	if err := rdb.Set(ctx, keys.Rebuilding(0), "mine", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	fences := keys.Tag(0) + ":fences"
	rdb.HSet(ctx, fences, "7", "3:mine", "8", "3:newer")
	guards := []Guard{{Key: fences, Field: "7", Value: "3:mine"}, {Key: fences, Field: "8", Value: "3:mine"}}
	if err := st.Reopen(ctx, "mine", 0, "", guards...); !errors.Is(err, errGuardLost) {
		t.Fatalf("reopen with voucher 8's fence taken over = %v, want errGuardLost", err)
	}
	rdb.HDel(ctx, fences, "8")
	if err := st.Reopen(ctx, "mine", 0, "", guards...); !errors.Is(err, errGuardLost) {
		t.Fatalf("reopen with voucher 8's fence lifted = %v, want errGuardLost", err)
	}
	if n, _ := rdb.Exists(ctx, keys.Ready(0)).Result(); n != 0 {
		t.Fatal("the shard reopened with a guard not held")
	}
	rdb.HSet(ctx, fences, "8", "3:mine")
	if err := st.Reopen(ctx, "mine", 0, "", guards...); err != nil {
		t.Fatalf("reopen with every guard held: %v", err)
	}
	if n, _ := rdb.Exists(ctx, keys.Ready(0), keys.Rebuilding(0)).Result(); n != 1 {
		t.Fatal("want the shard ready and its lease dropped")
	}
}
