package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"seckill/internal/bucket"
	"seckill/internal/voucher"
)

// bucketFields are the fields of a bucket's state hash that "api buckets"
// shows, in its order.
var bucketFields = []string{"stock", voucher.FieldAlloc, voucher.FieldOut}

// unknownMaster is printed for a bucket whose slot no master serves.
const unknownMaster = "(unknown)"

// bucketPlace is one bucket of a voucher as "api buckets" prints it. A
// field missing from the bucket's state hash is null; stock, alloc and
// out are numbers, or the string found when it is not an integer.
type bucketPlace struct {
	Bucket int    `json:"bucket"`
	Shard  int    `json:"shard"`
	Tag    string `json:"tag"`
	Slot   int    `json:"slot"`
	Master string `json:"master"`
	Stock  any    `json:"stock"`
	Alloc  any    `json:"alloc"`
	Out    any    `json:"out"`
	// Ready: the shard's ready marker is set (its state was loaded).
	Ready bool `json:"ready"`
	// Fence is the rebuild fence on the bucket ("<nb>:<token>" of the
	// rebuild or first load holding it), "" when none.
	Fence string `json:"fence"`
}

// bucketsCommand runs "api buckets VOUCHER": where each bucket of the
// voucher lives (shard, hash tag, slot, master), what its state hash
// holds and the moves between its buckets under way, as JSON, with a
// warning when two buckets share a master (they then share its CPU and
// fail over together).
func bucketsCommand(ctx context.Context, e *cmdEnv) error {
	return withBuckets(ctx, e, func(s bucketSite) error {
		out, err := readBuckets(ctx, s.rdb, s.keys, s.places, s.v)
		if err != nil {
			return err
		}
		res := map[string]any{"voucher_id": s.v.ID, "bucket_count": s.v.BucketCount(), "buckets": out}
		if s.v.BucketCount() > 1 {
			moves, err := s.mover.Moves(ctx, s.v.ID, s.v.BucketCount())
			if err != nil {
				return err
			}
			res["moves"] = orEmpty(moves)
		}
		if w := sharedMasters(out); w != "" {
			res["warning"] = w
		}
		return printJSON(e.stdout, res)
	})
}

// settleCommand runs "api buckets settle VOUCHER": every move of the
// voucher still journaled is decided now, whatever its age, by the rule
// of the recovery loop (bucket.Mover.Settle), and fences no rebuild holds
// are lifted; it prints each move's outcome and the buckets after, and
// fails when a move could not be settled (its master unreachable, say).
func settleCommand(ctx context.Context, e *cmdEnv) error {
	return withBuckets(ctx, e, func(s bucketSite) error {
		nb := s.v.BucketCount()
		if nb < 2 {
			return fmt.Errorf("voucher %d has one bucket: no moves to settle", s.v.ID)
		}
		moves, fenced, serr := s.mover.Settle(ctx, s.v.ID, nb)
		out, err := readBuckets(ctx, s.rdb, s.keys, s.places, s.v)
		if err != nil {
			return errors.Join(serr, err)
		}
		res := map[string]any{"voucher_id": s.v.ID, "bucket_count": nb, "settled": orEmpty(moves),
			"rebuild_running": fenced, "buckets": out}
		if err := printJSON(e.stdout, res); err != nil {
			return err
		}
		return serr
	})
}

// orEmpty prints no moves as [], not null.
func orEmpty(ms []bucket.Move) []bucket.Move {
	if ms == nil {
		return []bucket.Move{}
	}
	return ms
}

// bucketSite is what the buckets commands read a voucher's buckets with.
type bucketSite struct {
	rdb    redis.UniversalClient
	keys   voucher.Keys
	places []voucher.ShardPlace
	v      voucher.Voucher
	mover  *bucket.Mover
}

// withBuckets opens the service's Redis and database, reads the voucher
// named by the command's argument and where its shards live, and calls f.
func withBuckets(ctx context.Context, e *cmdEnv, f func(bucketSite) error) error {
	id, err := strconv.ParseInt(e.args[0], 10, 64)
	if err != nil || id <= 0 {
		return fmt.Errorf("voucher id must be a positive integer")
	}
	if e.cfg.embeddedRedis() {
		return fmt.Errorf("set SECKILL_REDIS_URL (and SECKILL_MYSQL_DSN) to the service's servers; the embedded Redis lives in the service's own process")
	}
	rdb, closeRedis, err := openRedis(ctx, e.cfg, e.log)
	if err != nil {
		return err
	}
	defer closeRedis()
	db, closeDB, err := openDB(ctx, e.cfg, e.log, false)
	if err != nil {
		return err
	}
	defer closeDB()
	v, err := voucher.NewStore(db).Get(ctx, id)
	if errors.Is(err, voucher.ErrNotFound) {
		return fmt.Errorf("no voucher has id %d", id)
	}
	if err != nil {
		return err
	}
	keys := saleKeys(e.cfg, rdb)
	places, err := keys.Placement(ctx, rdb)
	if err != nil {
		return err
	}
	mover := newMover(e.cfg, rdb, keys, confirmAlone(e.cfg, rdb), crashHooks{}, nil, e.log)
	return f(bucketSite{rdb: rdb, keys: keys, places: places, v: v, mover: mover})
}

// readBuckets reads every bucket of v with one pipeline: HMGET of its
// state hash and EXISTS of its shard's ready marker; then its fence.
func readBuckets(ctx context.Context, rdb redis.UniversalClient, keys voucher.Keys, places []voucher.ShardPlace, v voucher.Voucher) ([]bucketPlace, error) {
	nb := v.BucketCount()
	out := make([]bucketPlace, nb)
	fields := make([]*redis.SliceCmd, nb)
	ready := make([]*redis.IntCmd, nb)
	pipe := rdb.Pipeline()
	for b := range out {
		shard := keys.BucketShard(v.ID, b, nb)
		p := places[shard]
		out[b] = bucketPlace{Bucket: b, Shard: shard, Tag: p.Tag, Slot: p.Slot, Master: cmp.Or(p.Master, unknownMaster)}
		fields[b] = pipe.HMGet(ctx, keys.StateAt(shard, v.ID), bucketFields...)
		ready[b] = pipe.Exists(ctx, keys.Ready(shard))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read the buckets of voucher %d: %w", v.ID, err)
	}
	for b := range out {
		vals := fields[b].Val()
		out[b].Stock, out[b].Alloc, out[b].Out = number(vals[0]), number(vals[1]), number(vals[2])
		out[b].Ready = ready[b].Val() == 1
	}
	if nb > 1 {
		fences, err := bucket.Fences(ctx, rdb, keys, v.ID, nb)
		if err != nil {
			return nil, err
		}
		for b, f := range fences {
			out[b].Fence = f
		}
	}
	return out, nil
}

// number is a hash field as printed: nil when missing, an integer when
// it is one, else the string as found.
func number(v any) any {
	s, ok := v.(string)
	if !ok {
		return nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n
	}
	return s
}

// sharedMasters says which buckets share a master, or "". Buckets whose
// master is unknown (no master serves their slot) are not counted as
// sharing one.
func sharedMasters(bs []bucketPlace) string {
	on := map[string][]string{}
	var masters []string
	for _, b := range bs {
		if len(on[b.Master]) == 0 {
			masters = append(masters, b.Master)
		}
		on[b.Master] = append(on[b.Master], strconv.Itoa(b.Bucket))
	}
	var shared []string
	for _, m := range masters {
		if len(on[m]) > 1 && m != unknownMaster {
			shared = append(shared, "buckets "+strings.Join(on[m], ", ")+" on "+m)
		}
	}
	if len(shared) == 0 {
		return ""
	}
	return fmt.Sprintf("%d buckets, %d distinct masters (%s): buckets on one master share its CPU and stop together when it fails; "+
		"on a Redis Cluster make SECKILL_SHARDS a multiple of the masters and create the voucher with \"buckets\": \"auto\"",
		len(bs), len(masters), strings.Join(shared, "; "))
}
