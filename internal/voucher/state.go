package voucher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/lease"
	"seckill/internal/redisconn"
	"seckill/lua"
)

// State writes and reads the sale state the purchase script works on.
type State struct {
	rdb          redis.UniversalClient
	keys         Keys
	load         *redis.Script
	replace      *redis.Script
	reopen       *redis.Script
	dropReady    *redis.Script
	releaseLease *redis.Script
	requeue      *redis.Script
	// holder, when set, holds a voucher of several buckets still while
	// its buckets are first loaded (HoldWith).
	holder Holder
}

// HoldWith makes LoadBuckets load a voucher's buckets under h (the bucket
// package's Mover): the voucher's lease kept by a watchdog, every bucket
// fenced, and each bucket's state written only while its fence still holds.
// Without it (one instance and tests) a plain lease is taken, which a
// stall longer than its 30s (rebuildLease) can outlive. Set it before
// any Load.
func (s *State) HoldWith(h Holder) { s.holder = h }

// NewState returns a State; it does not own rdb.
func NewState(rdb redis.UniversalClient, keys Keys) *State {
	return &State{rdb: rdb, keys: keys, load: lua.Load(), replace: lua.Replace(), reopen: lua.Reopen(), dropReady: lua.DropReady(), releaseLease: lua.ReleaseLease(), requeue: lua.Requeue()}
}

// buyerChunk bounds the fields of one HSET when buyers are loaded.
const buyerChunk = 500

// Load writes v's state unless it is there already, with its buyers (user
// id -> order id) in the same step, so the script never sees stock
// without buyers. It reports whether the state was written. A voucher of
// more than one bucket is split (LoadBuckets), its stock v.TotalStock.
func (s *State) Load(ctx context.Context, v Voucher, buyers map[int64]int64) (bool, error) {
	if v.BucketCount() > 1 {
		return s.LoadBuckets(ctx, v, buyers)
	}
	return s.loadAt(ctx, s.keys.Shard(v.ID), v, int64(v.Stock), buyers, nil, nil)
}

// LoadBuckets writes the state of every bucket of v when none has any:
// bucket b gets its buyers (those whose Home is b) and a stock of its share
// of v.TotalStock (Share) less them, its alloc those two added up (SplitStock).
// Once one bucket has state, the others are loaded one by one
// (Warmer.loadBucket) from what the others hold. It reports whether any
// bucket was written.
//
// With a Holder (HoldWith), it holds the voucher (lease, fences) and then
// checks that no bucket has state, and each bucket is written only while
// its fence holds: a load that stalled past its lease, while another
// instance loaded a bucket from the others' alloc, writes nothing more.
func (s *State) LoadBuckets(ctx context.Context, v Voucher, buyers map[int64]int64) (bool, error) {
	nb := v.BucketCount()
	guards := make([]*Guard, nb)
	if s.holder != nil {
		h, err := s.holder.Hold(ctx, v.ID, nb)
		if err != nil {
			return false, fmt.Errorf("load buckets of voucher %d: %w", v.ID, err)
		}
		defer h.Release(context.WithoutCancel(ctx))
		ctx = h.Ctx
		for b := range guards {
			guards[b] = &h.Guards[b]
		}
		n, err := s.bucketsWithState(ctx, v)
		if err != nil {
			return false, err
		}
		if n > 0 {
			return false, fmt.Errorf("load buckets of voucher %d: %d of %d have state: %w", v.ID, n, nb, errSomeLoaded)
		}
	} else {
		key, token := s.keys.Lease(v.ID, nb), lease.NewToken()
		took, err := s.rdb.SetNX(ctx, key, token, rebuildLease).Result()
		if err != nil {
			return false, fmt.Errorf("load buckets of voucher %d: lease: %w", v.ID, err)
		}
		if !took {
			return false, fmt.Errorf("load buckets of voucher %d: %w", v.ID, errLeaseHeld)
		}
		defer s.releaseLease.Run(context.WithoutCancel(ctx), s.rdb, []string{key}, token)
	}
	homes := SplitBuyers(buyers, nb)
	held := make([]int64, nb)
	for b := range nb {
		held[b] = int64(len(homes[b]))
	}
	stocks := SplitStock(int64(v.TotalStock), held)
	wrote := false
	for b := range nb {
		stock := stocks[b]
		did, err := s.loadAt(ctx, s.keys.BucketShard(v.ID, b, nb), v, stock, homes[b], BucketFields(v, stock+held[b]), guards[b])
		if err != nil {
			return wrote, fmt.Errorf("bucket %d: %w", b, err)
		}
		wrote = wrote || did
	}
	return wrote, nil
}

// bucketsWithState counts the buckets of v whose state exists.
func (s *State) bucketsWithState(ctx context.Context, v Voucher) (int, error) {
	nb := v.BucketCount()
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, nb)
	for b := range nb {
		cmds[b] = pipe.Exists(ctx, s.keys.StateAt(s.keys.BucketShard(v.ID, b, nb), v.ID))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("check the buckets of voucher %d: %w", v.ID, err)
	}
	n := 0
	for _, c := range cmds {
		n += int(c.Val())
	}
	return n, nil
}

// Share is bucket b's part of total units over nb buckets: total/nb, one
// more for the first total%nb buckets.
func Share(total int64, b, nb int) int64 {
	share := total / int64(nb)
	if int64(b) < total%int64(nb) {
		share++
	}
	return share
}

// SplitStock is the stock each bucket gets when every bucket of a voucher of
// total units is loaded at once, bucket b already holding held[b] buyers:
// its share (Share) less its buyers, at least 0, and then, while the
// stocks and the buyers add up to more than total (units moved before the
// buckets' state was lost: a bucket sold more than its share), the
// largest stocks made smaller. The stocks never add up, with every buyer, to
// more than total: no unit is sold twice.
func SplitStock(total int64, held []int64) []int64 {
	nb := len(held)
	stocks := make([]int64, nb)
	sum := int64(0)
	for b := range nb {
		stocks[b] = max(Share(total, b, nb)-held[b], 0)
		sum += stocks[b] + held[b]
	}
	for sum > total {
		big := 0
		for b := range nb {
			if stocks[b] > stocks[big] {
				big = b
			}
		}
		if stocks[big] == 0 {
			break // more buyers than units: nothing left to sell
		}
		over := min(sum-total, stocks[big]-secondLargest(stocks, big), stocks[big])
		over = max(over, 1)
		stocks[big] -= over
		sum -= over
	}
	return stocks
}

// secondLargest is the largest of stocks but the one at skip (0 when none).
func secondLargest(stocks []int64, skip int) int64 {
	var m int64
	for b, x := range stocks {
		if b != skip && x > m {
			m = x
		}
	}
	return m
}

// SplitBuyers sorts buyers (user -> order) by their home bucket of nb.
func SplitBuyers(buyers map[int64]int64, nb int) []map[int64]int64 {
	out := make([]map[int64]int64, nb)
	for b := range out {
		out[b] = map[int64]int64{}
	}
	for u, o := range buyers {
		out[Home(u, nb)][u] = o
	}
	return out
}

// BucketFields are the state fields a bucket of a voucher of more than one
// bucket has beside stock and the window, for a bucket holding alloc
// units and lending none.
func BucketFields(v Voucher, alloc int64) []any {
	return []any{FieldBuckets, v.BucketCount(), FieldTotal, v.TotalStock, FieldAlloc, alloc, FieldOut, 0}
}

// loadAt writes v's state, of the given stock and further fields, with
// its buyers, in a shard, unless it is there already.
//
// The buyers are staged under a key of their own and put in place by the
// script that writes the state, so a load that finds the state there
// changes nothing. With a guard, the state is written only while the
// guard holds (errGuardLost otherwise).
func (s *State) loadAt(ctx context.Context, shard int, v Voucher, stock int64, buyers map[int64]int64, fields []any, guard *Guard) (bool, error) {
	fields = append(fields, DrawFields(v)...)
	staging := s.keys.BuyersLoading(shard, v.ID, lease.NewToken())
	if len(buyers) > 0 {
		pipe := s.rdb.Pipeline()
		args := make([]any, 0, 2*buyerChunk)
		flush := func() {
			if len(args) > 0 {
				pipe.HSet(ctx, staging, args...)
				args = make([]any, 0, 2*buyerChunk)
			}
		}
		for uid, oid := range buyers {
			args = append(args, uid, oid)
			if len(args) == 2*buyerChunk {
				flush()
			}
		}
		flush()
		// A load that dies here leaves nothing behind for long.
		pipe.Expire(ctx, staging, 10*time.Minute)
		if _, err := pipe.Exec(ctx); err != nil {
			return false, fmt.Errorf("load buyers of voucher %d: %w", v.ID, err)
		}
	}
	keys := []string{s.keys.StateAt(shard, v.ID), s.keys.BuyersAt(shard, v.ID), staging}
	args := []any{stock, v.SaleBegin().UnixMilli(), v.EndAt.UnixMilli()}
	if guard != nil {
		keys = append(keys, guard.Key)
		args = append(args, guard.Field, guard.Value)
	}
	n, err := s.load.Run(ctx, s.rdb, keys, append(args, fields...)...).Int()
	switch {
	case err != nil:
		return false, fmt.Errorf("load state of voucher %d: %w", v.ID, err)
	case n == 2:
		return false, fmt.Errorf("load state of voucher %d: %w", v.ID, errGuardLost)
	}
	return n == 1, nil
}

// MarkReady records that a shard's state was loaded into the master now
// serving it: the marker holds that master's identity (see masters), so
// a later restart, failover or slot move is noticed.
func (s *State) MarkReady(ctx context.Context, shard int) error {
	id, err := s.masters().identity(ctx, s.keys.Ready(shard))
	if err != nil {
		return fmt.Errorf("mark shard %d ready: %w", shard, err)
	}
	if err := s.rdb.Set(ctx, s.keys.Ready(shard), markerOf(id), 0).Err(); err != nil {
		return fmt.Errorf("mark shard %d ready: %w", shard, err)
	}
	return nil
}

// unknownMaster is the ready marker written when the master does not tell
// its run_id (see masters.identity).
const unknownMaster = "unknown"

// markerOf is the ready marker's value for a master identity.
func markerOf(id string) string { return cmp.Or(id, unknownMaster) }

// masters reads the identity of the masters that serve shards, each
// master once however many shards it serves; one is used per Warm round,
// so a restart between rounds is seen.
type masters struct {
	rdb  redis.UniversalClient
	seen map[string]masterID // by address
}

// masterID is what one master said of its identity.
type masterID struct {
	id  string
	err error
}

func (s *State) masters() *masters { return &masters{rdb: s.rdb, seen: map[string]masterID{}} }

// identity returns the run_id of the master that serves key: on a cluster
// the master of key's slot, not whichever node answers a keyless INFO. A
// run_id is new each time a redis-server process starts, and a replica
// promoted by a failover has its own, so a ready marker holding it says
// whether the shard's state was loaded into the process serving it now.
//
// It returns "" when the server refuses INFO server or answers it without
// a run_id (the embedded miniredis answers "section (server) is not
// supported"): the shard is then judged by its marker's existence alone,
// which notices lost data but not a restart with its data kept. A failed
// call (the master is unreachable) is an error; it is remembered for the
// round, so the other shards of that master do not wait on it again.
func (m *masters) identity(ctx context.Context, key string) (string, error) {
	c, err := redisconn.MasterFor(ctx, m.rdb, key)
	if err != nil {
		return "", fmt.Errorf("find the master of %s: %w", key, err)
	}
	addr := c.Options().Addr
	got, ok := m.seen[addr]
	if !ok {
		got.id, got.err = runID(ctx, c)
		m.seen[addr] = got
	}
	return got.id, got.err
}

// reread reads the run_id of the master that serves key again, past the
// round's memory, and remembers it for the rest of the round.
func (m *masters) reread(ctx context.Context, key string) (string, error) {
	c, err := redisconn.MasterFor(ctx, m.rdb, key)
	if err != nil {
		return "", fmt.Errorf("find the master of %s: %w", key, err)
	}
	var got masterID
	got.id, got.err = runID(ctx, c)
	m.seen[c.Options().Addr] = got
	return got.id, got.err
}

// runID reads a server's run_id from INFO server; "" when the server
// does not know the section or does not name one. A refusal for lack of
// rights (NOPERM: an ACL user without INFO) is an error, not an unknown
// identity: judged by its marker alone, a shard would go on selling on a
// promoted replica that lost writes.
func runID(ctx context.Context, c *redis.Client) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	var refused redis.Error
	switch {
	case errors.As(err, &refused) && strings.Contains(err.Error(), "not supported"):
		return "", nil
	case err != nil && (redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "NOAUTH")):
		return "", fmt.Errorf("read run_id of redis %s (the service's Redis user needs the INFO command): %w", c.Options().Addr, err)
	case err != nil:
		return "", fmt.Errorf("read run_id of redis %s: %w", c.Options().Addr, err)
	}
	for line := range strings.Lines(info) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return id, nil
		}
	}
	return "", nil
}

// StocksOf returns the live Redis stock of each voucher that has state, in
// one round trip: a voucher of more than one bucket shows the sum of its
// buckets' stocks (buyers see one voucher), and only when every bucket
// has state.
func (s *State) StocksOf(ctx context.Context, vs []Voucher) (map[int64]int64, error) {
	if len(vs) == 0 {
		return map[int64]int64{}, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([][]*redis.StringCmd, len(vs))
	for i, v := range vs {
		nb := v.BucketCount()
		cmds[i] = make([]*redis.StringCmd, nb)
		for b := range nb {
			cmds[i][b] = pipe.HGet(ctx, s.keys.StateAt(s.keys.BucketShard(v.ID, b, nb), v.ID), "stock")
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read stocks: %w", err)
	}
	out := make(map[int64]int64, len(vs))
	for i, v := range vs {
		var sum int64
		all := true
		for _, c := range cmds[i] {
			n, err := c.Int64()
			all = all && err == nil
			sum += n
		}
		if all {
			out[v.ID] = sum
		}
	}
	return out, nil
}

// Replace overwrites v's state and buyers during a rebuild of its shard
// (purchases there are stopped: its ready marker is missing), if token
// still holds the shard's rebuild lease. The buyers go in calls of at most
// buyerChunk each, so a voucher with many buyers never blocks Redis for
// long; the state is written by the last call.
func (s *State) Replace(ctx context.Context, token string, lease time.Duration, v Voucher, stock int64, buyers map[int64]int64) error {
	return s.ReplaceAt(ctx, token, lease, s.keys.Shard(v.ID), v, stock, nil, buyers)
}

// ReplaceAt is Replace for v's bucket in shard, with further state fields
// (BucketFields) written with the stock.
func (s *State) ReplaceAt(ctx context.Context, token string, lease time.Duration, shard int, v Voucher, stock int64, fields []any, buyers map[int64]int64) error {
	fields = append(fields, DrawFields(v)...)
	keys := []string{s.keys.Rebuilding(shard), s.keys.StateAt(shard, v.ID), s.keys.BuyersAt(shard, v.ID)}
	pairs := make([]any, 0, 2*len(buyers))
	for uid, oid := range buyers {
		pairs = append(pairs, uid, oid)
	}
	for first := true; first || len(pairs) > 0; first = false {
		n := min(len(pairs), 2*buyerChunk)
		last := n == len(pairs)
		args := make([]any, 0, 8+len(fields)+n)
		args = append(args, token, lease.Milliseconds(), scriptFlag(first), scriptFlag(last), stock, v.SaleBegin().UnixMilli(), v.EndAt.UnixMilli(), len(fields)/2)
		args = append(args, fields...)
		args = append(args, pairs[:n]...)
		pairs = pairs[n:]
		took, err := s.replace.Run(ctx, s.rdb, keys, args...).Int()
		if err != nil {
			return fmt.Errorf("replace state of voucher %d: %w", v.ID, err)
		}
		if took != 1 {
			return fmt.Errorf("replace state of voucher %d: %w", v.ID, errLeaseLost)
		}
	}
	return nil
}

// DropAt deletes v's state and buyers in shard under the shard's rebuild
// lease (token): a bucket a shard rebuild could not count leaves no old
// state behind to sell from once the shard reopens; it is loaded when it
// can be (loadMissingBuckets).
func (s *State) DropAt(ctx context.Context, token string, lease time.Duration, shard int, v Voucher) error {
	keys := []string{s.keys.Rebuilding(shard), s.keys.StateAt(shard, v.ID), s.keys.BuyersAt(shard, v.ID)}
	// replace.lua's first call without its last: the old state and buyers
	// dropped, nothing written.
	took, err := s.replace.Run(ctx, s.rdb, keys, token, lease.Milliseconds(), "1", "0", 0, 0, 0, 0).Int()
	if err != nil {
		return fmt.Errorf("drop state of voucher %d: %w", v.ID, err)
	}
	if took != 1 {
		return fmt.Errorf("drop state of voucher %d: %w", v.ID, errLeaseLost)
	}
	return nil
}

// scriptFlag is how the scripts take a yes or no: "1" or "0".
func scriptFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Reopen marks a rebuilt shard ready, if token still holds its rebuild
// lease and every guard (one per bucket rebuilt: Quiet.Guard) still holds.
// The marker holds master, the identity of the shard's master read before
// the rebuild began: a master that changed during the rebuild then shows
// as changed in the next round, which rebuilds again.
func (s *State) Reopen(ctx context.Context, token string, shard int, master string, guards ...Guard) error {
	keys := []string{s.keys.Rebuilding(shard), s.keys.Ready(shard)}
	args := []any{token, markerOf(master)}
	for _, g := range guards {
		keys = append(keys, g.Key)
		args = append(args, g.Field, g.Value)
	}
	n, err := s.reopen.Run(ctx, s.rdb, keys, args...).Int()
	switch {
	case err != nil:
		return fmt.Errorf("reopen shard %d: %w", shard, err)
	case n == 2:
		return fmt.Errorf("reopen shard %d: %w", shard, errGuardLost)
	case n != 1:
		return fmt.Errorf("reopen shard %d: %w", shard, errLeaseLost)
	}
	return nil
}

// dropMarker closes a shard whose ready marker names another master
// than the one serving it, and gives token its rebuild lease, if the
// marker still holds read and the lease is free: an instance that rebuilt
// the shard meanwhile wrote a new marker, which stays. It reports whether
// the marker was dropped and the lease taken.
func (s *State) dropMarker(ctx context.Context, shard int, read, token string, lease time.Duration) (bool, error) {
	keys := []string{s.keys.Ready(shard), s.keys.Rebuilding(shard)}
	n, err := s.dropReady.Run(ctx, s.rdb, keys, read, token, lease.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("drop shard %d ready marker: %w", shard, err)
	}
	return n == 1, nil
}

// releaseRebuild drops a shard's rebuild lease if token still holds it.
func (s *State) releaseRebuild(ctx context.Context, shard int, token string) {
	_ = s.releaseLease.Run(ctx, s.rdb, []string{s.keys.Rebuilding(shard)}, token).Err()
}

// ErrTakenOver is wrapped by every error that means a rebuild (or a first
// load) outlived its lease or its fences and another took over: what it
// counted was not made live, and the next round looks again. The bucket
// package's fence errors wrap it too.
var ErrTakenOver = errors.New("taken over by a newer rebuild")

// errLeaseLost means a rebuild outlived its lease; another one took over.
var errLeaseLost = fmt.Errorf("shard rebuild lease lost: %w", ErrTakenOver)

// errGuardLost means a bucket's rebuild outlived its voucher's lease: a
// newer rebuild took its fences over, and what it counted is not written.
var errGuardLost = fmt.Errorf("bucket rebuild fence taken over: %w", ErrTakenOver)

// errSomeLoaded means a first load of a voucher's buckets found some with
// state: the rest are loaded one by one from what those hold.
var errSomeLoaded = errors.New("some buckets already have state")

// errLeaseHeld means another instance holds a voucher's lease: it is
// loading the voucher's buckets or rebuilding one. Tried again later.
var errLeaseHeld = errors.New("voucher lease held by another instance")
