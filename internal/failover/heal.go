// Package failover keeps the sale whole across a failover of the
// database: it watches which server the database's address reaches, tells
// when that server lacks commits the sale's Redis saw it make (an
// asynchronous replica promoted after the primary died), and writes back
// what Redis still holds: the orders the database lost, through the
// worker's own path and guards, and the ends (cancellations, expiries,
// refunds) of orders whose units Redis already put back on sale.
//
// Which store is newer is decided by an identity, never a clock: each
// shard of the sale's Redis records the GTID of every batch its orders
// were written in (lua/settle.lua) and the database's lineage token
// (db_lineage). A database of the same lineage that lacks a recorded
// GTID lost it in a failover; the heal runs. A database of another
// lineage was restored from a dump on purpose: Redis is rebuilt from it
// and nothing is written back.
package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/idgen"
	"seckill/internal/order"
	"seckill/internal/payment"
	"seckill/internal/voucher"
)

// Horizon bounds the vouchers the heal looks at: those whose sale ended
// less than this long ago, or has not ended. Orders of a sale that ended
// earlier are not written again (a restore of the database brings those
// back).
const Horizon = 24 * time.Hour

// Observer hears what the heal writes back (metrics). The orders it
// queues again are counted by the worker that writes them.
type Observer interface {
	EndHealed(how string)
}

type nopObserver struct{}

func (nopObserver) EndHealed(string) {}

// Healer writes back what the database lost and the sale's Redis still
// holds, for the live vouchers of some shards (Heal).
type Healer struct {
	db       *gorm.DB
	keys     voucher.Keys
	vouchers *voucher.Store
	state    *voucher.State
	life     *order.Lifecycle
	refunds  *payment.Refunder
	expiries *order.Expiries
	obs      Observer
	log      *slog.Logger
	now      func() time.Time
}

// NewHealer returns a Healer; it owns none of its clients. obs may be nil.
func NewHealer(g *gorm.DB, rdb redis.UniversalClient, keys voucher.Keys, life *order.Lifecycle, obs Observer, log *slog.Logger) *Healer {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Healer{
		db: g, keys: keys, vouchers: voucher.NewStore(g), state: voucher.NewState(rdb, keys), life: life,
		refunds: payment.NewRefunder(g, life), expiries: order.NewExpiries(rdb, keys), obs: obs, log: log, now: time.Now,
	}
}

// Report is what one heal did and left.
type Report struct {
	// Vouchers is how many vouchers it looked at.
	Vouchers int `json:"vouchers"`
	// Requeued lists the orders it queued again: the worker writes them
	// (seckill_orders_healed_total counts those it writes).
	Requeued []ID `json:"requeued"`
	// Ends lists the ends it wrote again, by how the order ended.
	Ends map[string][]ID `json:"ends"`
	// Left lists what it found and did not write, with why.
	Left []Left `json:"left"`
	// NotReady lists the shards whose sale state was not loaded (Redis
	// lost it, or a rebuild from the database is under way): Redis holds
	// nothing there to write back.
	NotReady []int `json:"shards_not_ready"`
	// Failed names the shards it could not finish (a call failed), with
	// why; every other shard it looked at is healed.
	Failed map[int]string `json:"failed_shards"`
}

// ID is an order id; in JSON a string, as the API spells order ids
// (they exceed JavaScript's exact integers).
type ID int64

// MarshalJSON spells the id as a JSON string.
func (id ID) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(id), 10) + `"`), nil
}

// UnmarshalJSON reads an id spelt as a JSON string.
func (id *ID) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	*id = ID(n)
	return err
}

// Left is an order the heal found and did not write back.
type Left struct {
	OrderID   int64  `json:"order_id,string"`
	UserID    int64  `json:"user_id"`
	VoucherID int64  `json:"voucher_id"`
	Why       string `json:"why"`
}

// Healed reports whether the heal left shard whole: no call failed there.
func (r Report) Healed(shard int) bool { _, failed := r.Failed[shard]; return !failed }

// Heal writes back, for every voucher whose sale has not ended or ended
// less than Horizon ago, in the buckets that live in shards (nil: every
// shard), first the ends the database lost (an order it holds live that
// Redis recorded as ended), then the orders it lost (an order Redis holds
// that the database has neither written nor dead-lettered, and that is not
// on its way there). decideEnd and decideOrder say what each becomes.
//
// An order that cannot be moved as decided (it moved on meanwhile, its
// voucher's stock is at its total) is left, named in the report; a shard
// whose calls fail is named in its Failed and tried again by the caller;
// a shard that is not ready holds nothing to write back (NotReady). The
// error is non-nil only when the vouchers cannot be listed.
func (h *Healer) Heal(ctx context.Context, shards map[int]bool) (Report, error) {
	rep := Report{Requeued: []ID{}, Ends: map[string][]ID{}, Left: []Left{}, NotReady: []int{}, Failed: map[int]string{}}
	vs, err := h.vouchers.Live(ctx, h.now().Add(-Horizon))
	if err != nil {
		return rep, err
	}
	rep.Vouchers = len(vs)
	ready := map[int]bool{}
	pending := map[int]map[int64]bool{} // each shard's pending index, read once
	for _, v := range vs {
		nb := v.BucketCount()
		// Every bucket's ends first: an order its buyer cancelled and
		// bought again holds the buyer's live slot in the database until
		// its end is written back, and the new order would meet it.
		for _, pass := range []func(context.Context, voucher.Voucher, int, int, *Report, map[int]map[int64]bool) error{h.healEnds, h.healOrders} {
			for b := range nb {
				shard := h.keys.BucketShard(v.ID, b, nb)
				if shards != nil && !shards[shard] || !rep.Healed(shard) {
					continue
				}
				ok, seen := ready[shard]
				if !seen {
					var err error
					if ok, err = h.state.Ready(ctx, shard); err != nil {
						rep.Failed[shard] = err.Error()
						continue
					}
					ready[shard] = ok
					if !ok {
						rep.NotReady = append(rep.NotReady, shard)
					}
				}
				if !ok {
					continue
				}
				if err := pass(ctx, v, b, shard, &rep, pending); err != nil {
					rep.Failed[shard] = err.Error()
					h.log.Warn("heal of a shard failed; it is tried again", "shard", shard, "voucher_id", v.ID, "err", err)
				}
			}
		}
	}
	return rep, nil
}

// healEnds writes back the ends the database lost of voucher v's orders
// in bucket b (on shard), a page of Redis's record at a time.
func (h *Healer) healEnds(ctx context.Context, v voucher.Voucher, _, shard int, rep *Report, _ map[int]map[int64]bool) error {
	return h.state.EndedOrders(ctx, shard, v.ID, func(ended map[int64]voucher.Ended) error {
		var rows []struct {
			ID     int64
			Status string
		}
		if err := h.db.WithContext(ctx).Raw("SELECT id, status FROM orders WHERE id IN ?", slices.Collect(maps.Keys(ended))).Scan(&rows).Error; err != nil {
			return fmt.Errorf("read ended orders of voucher %d: %w", v.ID, err)
		}
		status := make(map[int64]string, len(rows))
		for _, r := range rows {
			status[r.ID] = r.Status
		}
		for _, id := range slices.Sorted(maps.Keys(ended)) {
			e := ended[id]
			st, found := status[id]
			if err := h.end(ctx, decideEnd(found, st, e.How), id, e, v.ID, rep); err != nil {
				return err
			}
		}
		return nil
	})
}

// end does what f says for ended order id. An order the move cannot take
// now (it moved on since it was read, its voucher's stock is at its total,
// it is gone) is left, named; any other error fails the shard's heal.
func (h *Healer) end(ctx context.Context, f endFate, id int64, e voucher.Ended, voucherID int64, rep *Report) error {
	var err error
	switch f {
	case endHeld:
		return nil
	case endGone:
		rep.Left = append(rep.Left, Left{id, e.User, voucherID, "its order and its " + e.How + " both lost: its unit is on sale, its record is not written again"})
		return nil
	case endConflict:
		rep.Left = append(rep.Left, Left{id, e.User, voucherID, "recorded " + e.How + " in redis, in a state the database cannot move from"})
		return nil
	case endCancel:
		_, _, err = h.life.Do(ctx, order.Cancel, id)
	case endExpire:
		_, _, err = h.life.Do(ctx, order.Expire, id)
	case endRefund:
		_, err = h.refunds.Refund(ctx, id)
	}
	switch {
	case errors.Is(err, order.ErrWrongState), errors.Is(err, order.ErrNotDue), errors.Is(err, order.ErrNotFound), errors.Is(err, order.ErrStockFull):
		rep.Left = append(rep.Left, Left{id, e.User, voucherID, "recorded " + e.How + " in redis; the database's order cannot take it: " + err.Error()})
		return nil
	case err != nil && !errors.Is(err, order.ErrUnitNotBack):
		// A unit not back in Redis yet is the sweeper's to finish: the
		// end is written. Anything else is tried again.
		return fmt.Errorf("write back the %s of order %d: %w", e.How, id, err)
	}
	how := e.How
	if f == endCancel && how == voucher.EndedRefunded {
		h.log.Warn("heal: the database lost an order's payment and refund; written back as cancelled, its unit on sale as it was",
			"order_id", id, "voucher_id", voucherID)
		how = voucher.EndedCancelled
	}
	rep.Ends[how] = append(rep.Ends[how], ID(id))
	h.obs.EndHealed(how)
	h.log.Warn("order end healed: the database had lost it and redis still knew it; written again",
		"order_id", id, "user_id", e.User, "voucher_id", voucherID, "end", how)
	return nil
}

// healOrders queues again the orders of voucher v's bucket b (on shard)
// that Redis holds and the database lost, a page of buyers at a time.
func (h *Healer) healOrders(ctx context.Context, v voucher.Voucher, b, shard int, rep *Report, pending map[int]map[int64]bool) error {
	if pending[shard] == nil {
		p, err := h.state.InFlight(ctx, shard)
		if err != nil {
			return err
		}
		pending[shard] = p
	}
	return h.state.Buyers(ctx, shard, v.ID, func(held map[int64]int64) error {
		ids := slices.Collect(maps.Keys(held))
		written, err := h.idsIn(ctx, "SELECT id FROM orders WHERE id IN ?", ids)
		if err != nil {
			return err
		}
		lettered, err := h.idsIn(ctx, "SELECT order_id FROM dead_letters WHERE order_id IN ?", ids)
		if err != nil {
			return err
		}
		others, err := h.liveOrders(ctx, v.ID, held)
		if err != nil {
			return err
		}
		var queue []voucher.Message
		for _, id := range slices.Sorted(maps.Keys(held)) {
			user := held[id]
			other, otherLive := others[user]
			switch decideOrder(pending[shard][id], written[id], lettered[id], otherLive && other != id) {
			case orderRequeue:
				m, err := h.message(ctx, v, b, id, user)
				if err != nil {
					return err
				}
				queue = append(queue, m)
			case orderLettered:
				rep.Left = append(rep.Left, Left{id, user, v.ID, "redis holds it and the database its dead letter"})
			case orderConflict:
				rep.Left = append(rep.Left, Left{id, user, v.ID, fmt.Sprintf("the buyer holds order %d of the voucher in the database", other)})
			}
		}
		return h.requeue(ctx, queue, rep)
	})
}

// message is a lost order's stream message: its acceptance time from its
// id, its bucket, and for a priced voucher the pay deadline Redis still
// holds for it, if any.
func (h *Healer) message(ctx context.Context, v voucher.Voucher, b int, id, user int64) (voucher.Message, error) {
	m := voucher.Message{OrderID: id, UserID: user, VoucherID: v.ID, AcceptedAt: idgen.Time(id), Healed: true}
	if nb := v.BucketCount(); nb > 1 {
		m.Bucket, m.Buckets = b, nb
	}
	if v.Price > 0 {
		due, ok, err := h.expiries.Due(ctx, id, user, v.ID, v.BucketCount())
		if err != nil {
			return m, err
		}
		if ok {
			m.Due = due
		}
	}
	return m, nil
}

// requeue queues the lost orders again and records what became of each.
func (h *Healer) requeue(ctx context.Context, ms []voucher.Message, rep *Report) error {
	got, err := h.state.Requeue(ctx, ms)
	if err != nil {
		return err
	}
	for i, r := range got {
		m := ms[i]
		switch r {
		case voucher.RequeueQueued:
			rep.Requeued = append(rep.Requeued, ID(m.OrderID))
			h.log.Info("heal: an order the database lost is queued again", "order_id", m.OrderID, "user_id", m.UserID, "voucher_id", m.VoucherID)
		case voucher.RequeueNotReady:
			return errNotReady
		case voucher.RequeueBadKeys:
			rep.Left = append(rep.Left, Left{m.OrderID, m.UserID, m.VoucherID, "its shard's keys hold another type than the scripts read"})
		}
		// Pending or no longer held: it was written, or moved on, since it
		// was read.
	}
	return nil
}

// errNotReady means a shard's sale state went away during the heal.
var errNotReady = errors.New("shard not ready (its sale state is being rebuilt)")

// idsIn runs query, which selects one id column WHERE ... IN ?, for ids.
func (h *Healer) idsIn(ctx context.Context, query string, ids []int64) (map[int64]bool, error) {
	out := map[int64]bool{}
	if len(ids) == 0 {
		return out, nil
	}
	var got []int64
	if err := h.db.WithContext(ctx).Raw(query, ids).Scan(&got).Error; err != nil {
		return nil, fmt.Errorf("heal: %w", err)
	}
	for _, id := range got {
		out[id] = true
	}
	return out, nil
}

// liveOrders returns, for the buyers of held (order -> buyer), the live
// order each holds of the voucher in the database.
func (h *Healer) liveOrders(ctx context.Context, voucherID int64, held map[int64]int64) (map[int64]int64, error) {
	out := map[int64]int64{}
	if len(held) == 0 {
		return out, nil
	}
	users := slices.Collect(maps.Values(held))
	var rows []struct{ ID, UserID int64 }
	if err := h.db.WithContext(ctx).Raw("SELECT id, user_id FROM orders WHERE voucher_id = ? AND user_id IN ? AND live = 1", voucherID, users).Scan(&rows).Error; err != nil {
		return nil, fmt.Errorf("heal: read the buyers' live orders of voucher %d: %w", voucherID, err)
	}
	for _, r := range rows {
		out[r.UserID] = r.ID
	}
	return out, nil
}
