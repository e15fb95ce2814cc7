package voucher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// State writes and reads the sale state the purchase script works on.
type State struct {
	rdb  redis.UniversalClient
	keys Keys
	load *redis.Script
}

// NewState returns a State; it does not own rdb.
func NewState(rdb redis.UniversalClient, keys Keys) *State {
	return &State{rdb: rdb, keys: keys, load: lua.Load()}
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

// BuyerLister reads who bought a voucher (user id -> order id) from the
// database; the order side supplies it.
type BuyerLister interface {
	Buyers(ctx context.Context, voucherID int64) (map[int64]int64, error)
}

// Warmer loads the Redis state of every voucher still on sale whose state is
// missing: at start-up, and again periodically, so an instance that finds
// state gone repairs it.
type Warmer struct {
	store  *Store
	state  *State
	buyers BuyerLister
	keys   Keys
	every  time.Duration
	log    *slog.Logger
}

// NewWarmer returns a Warmer that checks every interval (default 5s).
func NewWarmer(store *Store, state *State, buyers BuyerLister, keys Keys, every time.Duration, log *slog.Logger) *Warmer {
	if every <= 0 {
		every = 5 * time.Second
	}
	return &Warmer{store: store, state: state, buyers: buyers, keys: keys, every: every, log: log}
}

// Warm loads missing state once and marks every shard ready.
func (w *Warmer) Warm(ctx context.Context) (loaded int, err error) {
	vs, err := w.store.Live(ctx, time.Now())
	if err != nil {
		return 0, err
	}
	pipe := w.state.rdb.Pipeline()
	exists := make([]*redis.IntCmd, len(vs))
	for i, v := range vs {
		exists[i] = pipe.Exists(ctx, w.keys.State(v.ID))
	}
	if len(vs) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, fmt.Errorf("check voucher state: %w", err)
		}
	}
	for i, v := range vs {
		if exists[i].Val() == 1 {
			continue
		}
		buyers, err := w.buyers.Buyers(ctx, v.ID)
		if err != nil {
			return loaded, err
		}
		wrote, err := w.state.Load(ctx, v, buyers)
		if err != nil {
			return loaded, err
		}
		if wrote {
			loaded++
			w.log.Info("voucher state loaded from database", "voucher_id", v.ID, "stock", v.Stock, "buyers", len(buyers))
		}
	}
	for shard := range w.keys.Shards() {
		if err := w.state.MarkReady(ctx, shard); err != nil {
			return loaded, err
		}
	}
	return loaded, nil
}

// Run warms periodically until ctx is done.
func (w *Warmer) Run(ctx context.Context) error {
	t := time.NewTicker(w.every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, err := w.Warm(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			w.log.Warn("warming voucher state failed; retrying", "err", err)
			failing = true
		case err == nil && failing:
			w.log.Info("warming voucher state works again")
			failing = false
		}
	}
}
