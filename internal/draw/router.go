package draw

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"seckill/internal/redisconn"
	"seckill/internal/voucher"
	"seckill/lua"
)

// Router sends the purchases of fair vouchers into their draw until it is
// done (voucher.Draws). It learns whether a voucher has a draw from its
// sale state in Redis once per voucher, and that a draw is done from
// Redis once.
type Router struct {
	rdb  redis.UniversalClient
	keys voucher.Keys
	// acks replicas must have an entry before it is answered (WAIT on
	// the connection of the entry, bounded by ackWait; replicas applies
	// the policy for a master with none); 0: not waited for.
	acks     int
	ackWait  time.Duration
	replicas *redisconn.Replicas
	enter    *redis.Script
	group    singleflight.Group
	// known: voucher id -> known (no draw, or done: nil; else its close).
	known sync.Map
}

// NewRouter returns the Router of an instance.
func NewRouter(rdb redis.UniversalClient, keys voucher.Keys) *Router {
	return &Router{rdb: rdb, keys: keys, enter: lua.DrawEnter()}
}

// WaitReplicas makes an entry wait until n replicas have it, as an
// accepted purchase does (SECKILL_REDIS_WAIT_REPLICAS): a failover then
// loses no entry that was answered. Call it before serving.
func (r *Router) WaitReplicas(n int, timeout time.Duration, rs *redisconn.Replicas) {
	r.acks, r.ackWait, r.replicas = n, timeout, rs
}

// open is a draw not known to be done: when it closes, when its entries
// open (zero: at once), and the proof of work an entry takes (pow bits, 0
// for none, over challenge).
type open struct {
	closes, opens time.Time
	pow           int
	challenge     string
}

// Enter implements voucher.Draws. A voucher whose state cannot be read is
// an error, not a purchase: it may have a draw, which a purchase must not
// overtake. A draw with a proof of work checks pow before the
// script runs, so no entry is written without one.
func (r *Router) Enter(ctx context.Context, v, user, ticket int64, pow string) (voucher.DrawEntry, bool, error) {
	o, err := r.draw(ctx, v)
	if err != nil || o == nil {
		return voucher.DrawEntry{}, false, err
	}
	if !PowOK(o.challenge, user, pow, o.pow) {
		return r.noPow(ctx, v, o)
	}
	code, detail, err := r.run(ctx, v, user, ticket, o)
	if err != nil {
		return voucher.DrawEntry{}, false, err
	}
	e := voucher.DrawEntry{ClosesAt: o.closes}
	switch code {
	case 0, 1:
		e.Ticket, err = strconv.ParseInt(detail, 10, 64)
		return e, true, err
	case 2:
		e.Closed = true
		return e, true, nil
	case 3:
		r.known.Store(v, (*open)(nil))
		return e, false, nil
	case 4:
		ms, _ := strconv.ParseInt(detail, 10, 64)
		return e, true, fmt.Errorf("enter the draw of voucher %d: %w", v, &voucher.NotStartedError{Until: time.Duration(ms) * time.Millisecond})
	}
	return e, false, fmt.Errorf("enter the draw of voucher %d: key %s has another type", v, detail)
}

// noPow answers an entry without its proof of work. The proof is asked
// for entries only: once the draw is done the purchase buys as in any sale
// (this instance may not have learnt it yet: Redis says), and after the
// close it is told the draw is being drawn, as with one.
func (r *Router) noPow(ctx context.Context, v int64, o *open) (voucher.DrawEntry, bool, error) {
	done, err := r.rdb.Exists(ctx, doneKey(r.keys, v)).Result()
	switch {
	case err != nil:
		return voucher.DrawEntry{}, false, fmt.Errorf("is the draw of voucher %d done: %w", v, err)
	case done == 1:
		r.known.Store(v, (*open)(nil))
		return voucher.DrawEntry{}, false, nil
	case !time.Now().Before(o.closes):
		return voucher.DrawEntry{ClosesAt: o.closes, Closed: true}, true, nil
	case time.Now().Before(o.opens):
		// No proof can be made before the challenge is published.
		return voucher.DrawEntry{}, true, fmt.Errorf("enter the draw of voucher %d: %w", v, &voucher.NotStartedError{Until: time.Until(o.opens)})
	}
	return voucher.DrawEntry{}, false, fmt.Errorf("enter the draw of voucher %d: %w", v, voucher.ErrPowRequired)
}

// Learn records, from the database's live vouchers (the warmer's round:
// voucher.Warmer.Teach), those that have no draw or whose draw is done:
// their purchases go to the purchase script without a read of bucket 0's
// state, so they go on while bucket 0's master is away. A voucher gets
// its draw at creation or never, and the purchase script still refuses a
// purchase while a bucket says its draw is pending.
func (r *Router) Learn(vs []voucher.Voucher) {
	for _, v := range vs {
		if !v.Fair() || v.DrawDoneAt != nil {
			r.known.LoadOrStore(v.ID, (*open)(nil))
		}
	}
}

// draw is voucher v's draw not known to be done, or nil. It is read from
// the voucher's sale state (bucket 0's; voucher.DrawFields), never from
// the database, so purchases go on while the database is away. A voucher
// whose state is not loaded is not remembered: the purchase script
// answers for it, and the next purchase asks again.
func (r *Router) draw(ctx context.Context, v int64) (*open, error) {
	if o, ok := r.known.Load(v); ok {
		return o.(*open), nil
	}
	o, err, _ := r.group.Do(strconv.FormatInt(v, 10), func() (any, error) {
		f, err := r.rdb.HMGet(ctx, r.keys.State(v), "stock", voucher.FieldDrawClose, voucher.FieldDrawPow, voucher.FieldDrawChallenge, voucher.FieldDrawOpens).Result()
		if err != nil {
			return nil, err
		}
		if f[0] == nil {
			return (*open)(nil), nil // no state: the script answers
		}
		closeMs, _ := f[1].(string)
		if closeMs == "" {
			r.known.Store(v, (*open)(nil))
			return (*open)(nil), nil
		}
		ms, err1 := strconv.ParseInt(closeMs, 10, 64)
		pow, err2 := strconv.Atoi(fmt.Sprint(f[2]))
		challenge, _ := f[3].(string)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("voucher %d's draw fields %v", v, f[1:])
		}
		o := &open{closes: time.UnixMilli(ms), pow: pow, challenge: challenge}
		if s, _ := f[4].(string); s != "" && s != "0" {
			opens, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("voucher %d's draw opens at %q", v, s)
			}
			o.opens = time.UnixMilli(opens)
		}
		r.known.Store(v, o)
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read voucher %d's draw: %w", v, err)
	}
	return o.(*open), nil
}

// run runs draw_enter.lua and, with acks, confirms an entry (code 0 or
// 1) by WAIT on the same connection of the master holding the entries.
func (r *Router) run(ctx context.Context, v, user, ticket int64, o *open) (int64, string, error) {
	keys := []string{entriesKey(r.keys, v), doneKey(r.keys, v), closedKey(r.keys, v)}
	args := []any{user, ticket, o.closes.UnixMilli()}
	if !o.opens.IsZero() {
		args = append(args, o.opens.UnixMilli())
	}
	if r.acks == 0 {
		res, err := r.enter.Run(ctx, r.rdb, keys, args...).Slice()
		if err != nil {
			return 0, "", fmt.Errorf("enter the draw of voucher %d: %w", v, err)
		}
		return decodeEnter(res)
	}
	c, err := redisconn.MasterFor(ctx, r.rdb, keys[0])
	if err != nil {
		return 0, "", fmt.Errorf("enter the draw of voucher %d: find the master: %w", v, err)
	}
	conn := c.Conn()
	defer func() { _ = conn.Close() }()
	res, err := r.enter.Run(ctx, conn, keys, args...).Slice()
	if err != nil {
		return 0, "", fmt.Errorf("enter the draw of voucher %d: %w", v, err)
	}
	code, detail, err := decodeEnter(res)
	if err != nil || code > 1 {
		return code, detail, err
	}
	conf, err := r.replicas.Confirm(ctx, conn, c.Options().Addr, r.acks, r.ackWait)
	switch {
	case err != nil:
		return 0, "", fmt.Errorf("draw entry of user %d made, replicas unknown: %w", user, err)
	case !conf.OK(r.acks):
		return 0, "", fmt.Errorf("draw entry of user %d confirmed by %d of %d replicas within %s: %w", user, conf.Acked, r.acks, r.ackWait, voucher.ErrNotReplicated)
	}
	return code, detail, nil
}

// decodeEnter reads draw_enter.lua's {code, detail}.
func decodeEnter(res []any) (int64, string, error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("draw_enter answered %v", res)
	}
	code, ok := res[0].(int64)
	detail, _ := res[1].(string)
	if !ok {
		return 0, "", fmt.Errorf("draw_enter answered %v", res)
	}
	return code, detail, nil
}
