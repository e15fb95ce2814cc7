package draw

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"seckill/internal/voucher"
	"seckill/lua"
)

// Router sends the purchases of fair vouchers into their draw until it is
// done (voucher.Draws). It learns whether a voucher has a draw from the
// database once per voucher, and that a draw is done from Redis once.
type Router struct {
	store *voucher.Store
	rdb   redis.Scripter
	keys  voucher.Keys
	enter *redis.Script
	group singleflight.Group
	// known: voucher id -> known (no draw, or done: nil; else its close).
	known sync.Map
}

// NewRouter returns the Router of an instance.
func NewRouter(store *voucher.Store, rdb redis.Scripter, keys voucher.Keys) *Router {
	return &Router{store: store, rdb: rdb, keys: keys, enter: lua.DrawEnter()}
}

// open is a draw not known to be done: when it closes.
type open struct{ closes time.Time }

// Enter implements voucher.Draws. A voucher the database cannot be asked
// about is an error, not a purchase: it may have a draw, which a purchase
// must not overtake.
func (r *Router) Enter(ctx context.Context, v, user, ticket int64) (voucher.DrawEntry, bool, error) {
	o, err := r.draw(ctx, v)
	if err != nil || o == nil {
		return voucher.DrawEntry{}, false, err
	}
	res, err := r.enter.Run(ctx, r.rdb, []string{entriesKey(r.keys, v), doneKey(r.keys, v)},
		user, ticket, o.closes.UnixMilli()).Slice()
	if err != nil {
		return voucher.DrawEntry{}, false, fmt.Errorf("enter the draw of voucher %d: %w", v, err)
	}
	code, detail, err := decodeEnter(res)
	if err != nil {
		return voucher.DrawEntry{}, false, fmt.Errorf("enter the draw of voucher %d: %w", v, err)
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
	}
	return e, false, fmt.Errorf("enter the draw of voucher %d: key %s has another type", v, detail)
}

// draw is voucher v's draw not known to be done, or nil.
func (r *Router) draw(ctx context.Context, v int64) (*open, error) {
	if o, ok := r.known.Load(v); ok {
		return o.(*open), nil
	}
	o, err, _ := r.group.Do(strconv.FormatInt(v, 10), func() (any, error) {
		vc, err := r.store.Get(ctx, v)
		switch {
		case errors.Is(err, voucher.ErrNotFound):
			return (*open)(nil), nil // the script answers it
		case err != nil:
			return nil, err
		case !vc.Fair() || vc.DrawDoneAt != nil:
			r.known.Store(v, (*open)(nil))
			return (*open)(nil), nil
		}
		o := &open{closes: vc.DrawClose()}
		r.known.Store(v, o)
		return o, nil
	})
	if err != nil {
		return nil, fmt.Errorf("read voucher %d for its draw: %w", v, err)
	}
	return o.(*open), nil
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
