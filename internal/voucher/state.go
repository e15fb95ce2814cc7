package voucher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// State writes and reads the sale state the purchase script works on.
type State struct {
	rdb     redis.UniversalClient
	keys    Keys
	load    *redis.Script
	replace *redis.Script
	reopen  *redis.Script
}

// NewState returns a State; it does not own rdb.
func NewState(rdb redis.UniversalClient, keys Keys) *State {
	return &State{rdb: rdb, keys: keys, load: lua.Load(), replace: lua.Replace(), reopen: lua.Reopen()}
}

// buyerChunk bounds the fields of one HSET when buyers are loaded.
const buyerChunk = 500

// Load writes v's state unless it is there already, the buyers (user id ->
// order id) first, so the script never sees stock without buyers. It
// reports whether the state was written.
func (s *State) Load(ctx context.Context, v Voucher, buyers map[int64]int64) (bool, error) {
	if len(buyers) > 0 {
		pipe := s.rdb.Pipeline()
		args := make([]any, 0, 2*buyerChunk)
		flush := func() {
			if len(args) > 0 {
				pipe.HSet(ctx, s.keys.Buyers(v.ID), args...)
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
		if _, err := pipe.Exec(ctx); err != nil {
			return false, fmt.Errorf("load buyers of voucher %d: %w", v.ID, err)
		}
	}
	n, err := s.load.Run(ctx, s.rdb, []string{s.keys.State(v.ID)},
		v.Stock, v.BeginAt.UnixMilli(), v.EndAt.UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("load state of voucher %d: %w", v.ID, err)
	}
	return n == 1, nil
}

// MarkReady records that a shard's state was loaded.
func (s *State) MarkReady(ctx context.Context, shard int) error {
	if err := s.rdb.Set(ctx, s.keys.Ready(shard), time.Now().UTC().Format(time.RFC3339), 0).Err(); err != nil {
		return fmt.Errorf("mark shard %d ready: %w", shard, err)
	}
	return nil
}

// Stocks returns the live Redis stock of each voucher that has state, in one
// round trip.
func (s *State) Stocks(ctx context.Context, ids []int64) (map[int64]int64, error) {
	if len(ids) == 0 {
		return map[int64]int64{}, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGet(ctx, s.keys.State(id), "stock")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read stocks: %w", err)
	}
	out := make(map[int64]int64, len(ids))
	for i, c := range cmds {
		if n, err := c.Int64(); err == nil {
			out[ids[i]] = n
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
	keys := []string{s.keys.Rebuilding(s.keys.Shard(v.ID)), s.keys.State(v.ID), s.keys.Buyers(v.ID)}
	pairs := make([]any, 0, 2*len(buyers))
	for uid, oid := range buyers {
		pairs = append(pairs, uid, oid)
	}
	for first := true; first || len(pairs) > 0; first = false {
		n := min(len(pairs), 2*buyerChunk)
		last := n == len(pairs)
		args := make([]any, 0, 7+n)
		args = append(args, token, lease.Milliseconds(), scriptFlag(first), scriptFlag(last), stock, v.BeginAt.UnixMilli(), v.EndAt.UnixMilli())
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

// scriptFlag is how the scripts take a yes or no: "1" or "0".
func scriptFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Reopen marks a rebuilt shard ready, if token still holds its rebuild
// lease.
func (s *State) Reopen(ctx context.Context, token string, shard int) error {
	keys := []string{s.keys.Rebuilding(shard), s.keys.Ready(shard)}
	n, err := s.reopen.Run(ctx, s.rdb, keys, token, time.Now().UTC().Format(time.RFC3339)).Int()
	if err != nil {
		return fmt.Errorf("reopen shard %d: %w", shard, err)
	}
	if n != 1 {
		return fmt.Errorf("reopen shard %d: %w", shard, errLeaseLost)
	}
	return nil
}

// errLeaseLost means a rebuild outlived its lease; another one took over.
var errLeaseLost = errors.New("shard rebuild lease lost")
