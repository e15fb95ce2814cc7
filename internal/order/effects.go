package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"seckill/internal/voucher"
)

// afterCommit tells the observer what the transaction recorded, then
// makes Redis agree with it: the reservations of dead letters given back,
// the written orders settled.
func (w *Writer) afterCommit(ctx context.Context, work []*item, gtid string) error {
	w.observeCommitted(work)
	if w.cfg.AfterCommit != nil {
		w.cfg.AfterCommit()
	}
	// Give back the reservations of dead letters before the ack: after a
	// crash here the redelivery finds the dead letter and gives back again,
	// which the script makes a no-op.
	if err := w.giveBack(ctx, work); err != nil {
		if !errors.Is(err, errNotReady) {
			w.cfg.Observer.RedisError("give_back")
		}
		return err
	}
	did, err := w.settle(ctx, work, gtid)
	if err != nil {
		return err
	}
	if err := w.undoEnded(ctx, did, work); err != nil {
		return err
	}
	return w.scheduleWritten(ctx, work)
}

// leave leaves an item's message pending: Redis could not be made to
// agree with it alone (err: its voucher's keys cannot be read). It is
// counted as a failed Redis call of op and logged here, once per delivery.
func (w *Writer) leave(it *item, op string, err error) {
	it.left = err
	w.cfg.Observer.RedisError(op)
	w.log.Warn("message left pending: its voucher's redis keys cannot be read; it is tried again when redelivered",
		"message_id", it.msg.ID, "order_id", it.ord.OrderID, "voucher_id", it.ord.VoucherID, "step", op, "err", err)
}

// releaseKeys are release.lua's keys for an order of the voucher taken in
// the voucher's bucket on shard (Keys.BucketShard).
func releaseKeys(k voucher.Keys, shard int, voucherID int64) []string {
	return []string{k.Ready(shard), k.StateAt(shard, voucherID), k.BuyersAt(shard, voucherID), k.Pending(shard)}
}

// shardOf is the shard of the bucket a message's order was taken in.
func shardOf(k voucher.Keys, m voucher.Message) int {
	return k.BucketShard(m.VoucherID, m.Bucket, m.Buckets)
}

// released decodes release.lua's answer, the one place that does: given
// is true when the reservation was given back now (false: it was not held
// any more); errNotReady when the shard is not ready, errBadKeys when the
// voucher's keys cannot be read (nothing written, either way).
func released(c *redis.Cmd) (given bool, err error) {
	n, err := c.Int()
	switch {
	case err != nil:
		return false, err
	case n == -1:
		return false, errNotReady
	case n == -2:
		return false, errBadKeys
	}
	return n == 1, nil
}

// settled is what settle.lua did for one order (its header lists them).
type settled uint8

const (
	settledNothing  settled = iota // the entry named the order already, or another order no longer pending
	settledTook                    // the buyer recorded and the unit taken
	settledNoUnit                  // the buyer recorded, no unit left to take
	settledTakeover                // the entry taken over from the buyer's later pending order
	settledBadKeys                 // nothing: its voucher's keys cannot be read
)

// recorded says whether settle recorded the buyer, which undoEnded undoes
// for an order ended since.
func (d settled) recorded() bool {
	return d == settledTook || d == settledNoUnit || d == settledTakeover
}

// undoEnded undoes in Redis what settle did for orders cancelled or
// refunded between their commit and their settling: the move gave the
// unit back (or will: then settle found the entry and did nothing), and
// settle, finding no entry, recorded the buyer again. Read after the
// settle, every such move is seen. A unit settle took goes back with the
// entry; an entry it recorded without a unit is dropped alone (the unit
// was sold again meanwhile); both only while the entry names the order.
// An entry it took over from the buyer's later order cannot be handed
// back here: that is logged, and the next rebuild or reconcile sees it.
func (w *Writer) undoEnded(ctx context.Context, did map[int64]settled, items []*item) error {
	ids := make([]int64, 0, len(did))
	for id, d := range did {
		if d.recorded() {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	var ended []orderOwner
	if err := w.db.WithContext(ctx).Raw("SELECT id, user_id, voucher_id FROM orders WHERE id IN " + inList(ids) + " AND live IS NULL").Scan(&ended).Error; err != nil {
		w.cfg.Observer.MySQLError("write")
		return fmt.Errorf("find orders ended since written: %w", err)
	}
	shards := make(map[int64]int, len(ended))
	for _, it := range items {
		shards[it.ord.OrderID] = shardOf(w.keys, it.ord)
	}
	for _, o := range ended {
		if did[o.ID] == settledTakeover {
			w.log.Warn("an order cancelled while being written took over its buyer's later order in redis; reconcile the voucher",
				"order_id", o.ID, "voucher_id", o.VoucherID)
			continue
		}
		// A failure fails the batch. Were it the order's keys, made
		// unreadable since settle read them, the batch tried again settles
		// none of that order (settledBadKeys) and leaves its message alone.
		if err := w.undoSettled(ctx, o, shards[o.ID], did[o.ID] == settledTook); err != nil {
			return err
		}
	}
	return nil
}

// undoSettled drops the buyer entry settle recorded for an order ended
// since, with the unit it took when restock.
func (w *Writer) undoSettled(ctx context.Context, o orderOwner, shard int, restock bool) error {
	given, err := released(w.release.Run(ctx, w.rdb, releaseKeys(w.keys, shard, o.VoucherID), o.UserID, o.ID, scriptFlag(restock)))
	if err != nil {
		if !errors.Is(err, errNotReady) {
			w.cfg.Observer.RedisError("give_back")
		}
		return fmt.Errorf("undo settling of order %d ended since written: %w", o.ID, err)
	}
	if given && restock {
		w.cfg.Events.GivenBack(ctx, o.VoucherID, o.UserID, o.ID)
	}
	return nil
}

// scriptFlag spells a flag argument of a script.
func scriptFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// observeCommitted tells the observer what the committed transaction
// recorded for the first time, and logs each order healed: one the
// database had lost, written again.
func (w *Writer) observeCommitted(items []*item) {
	orders, healed := 0, 0
	for _, it := range items {
		switch it.v.effects().count {
		case countOrder:
			orders++
			if it.ord.Healed {
				healed++
				w.logHealed(it)
			}
		case countLetter:
			w.cfg.Observer.DeadLettered(it.v.reason)
		}
	}
	if orders > 0 {
		w.cfg.Observer.Written(orders)
	}
	if healed > 0 {
		w.cfg.Observer.Healed(healed)
	}
}

// logHealed logs one line for an order written again after the database
// lost it.
func (w *Writer) logHealed(it *item) {
	attrs := []any{"order_id", it.ord.OrderID, "user_id", it.ord.UserID, "voucher_id", it.ord.VoucherID, "accepted_at", it.ord.AcceptedAt}
	if it.deadline != nil {
		attrs = append(attrs, "pay_deadline", *it.deadline)
	}
	w.log.Warn("order healed: the database had lost it and redis still held it; written again", attrs...)
}

// restocks says which dead letters give their unit back to the Redis
// stock: those whose unit MySQL still has. An order refused for lack of
// MySQL stock, or for an unknown voucher, has no unit to give back.
func restocks(reason string) bool {
	return reason == ReasonDeliveryLimit || reason == ReasonAttemptLimit || reason == ReasonDuplicateBuyer ||
		reason == ReasonIDCollision
}

// giveBack returns the Redis reservation of every dead-lettered item. In
// a shard that is not ready (being rebuilt) the script gives nothing back,
// and the batch is tried again after the rebuild (errNotReady): the dead
// letter is committed, so the redelivery finds it and gives back then. An
// item whose voucher's keys cannot be read is left pending alone.
func (w *Writer) giveBack(ctx context.Context, items []*item) error {
	pipe := w.rdb.Pipeline()
	var (
		cmds  []*redis.Cmd
		given []*item
	)
	for _, it := range items {
		if !it.v.effects().giveBack {
			continue
		}
		o := it.ord
		restock := it.v.fate == ended || restocks(it.v.reason)
		cmds = append(cmds, w.release.Eval(ctx, pipe, releaseKeys(w.keys, shardOf(w.keys, o), o.VoucherID), o.UserID, o.OrderID, scriptFlag(restock)))
		given = append(given, it)
	}
	if len(cmds) == 0 {
		return nil
	}
	_, _ = pipe.Exec(ctx) // each command's answer is read below
	// Every instance may be refusing these buyers, or the voucher as sold
	// out, from memory: tell them of each reservation Redis gave back (or
	// had given back before, by a run that stopped before it published),
	// even when others of the batch failed and the batch is tried again.
	// A failed publish is logged at most once a second; the instances'
	// answers expire after their bound anyway.
	var failed error
	for i, c := range cmds {
		it := given[i]
		_, err := released(c)
		switch {
		case errors.Is(err, errBadKeys):
			w.leave(it, "give_back", fmt.Errorf("give back reservation of order %d: %w", it.ord.OrderID, err))
		case err != nil:
			failed = cmp.Or(failed, err)
		default:
			w.cfg.Events.GivenBack(ctx, it.ord.VoucherID, it.ord.UserID, it.ord.OrderID)
		}
	}
	if failed != nil {
		return fmt.Errorf("give back %d reservations: %w", len(cmds), failed)
	}
	return nil
}

// settle makes Redis agree with the orders just written, one script call
// per shard: it drops them from the pending index and, when a rebuild of
// Redis missed one (it was in this worker's hands), records its buyer and
// takes its unit; when the buyer bought again meanwhile, the written order
// takes over that later order's entry and unit (lua/settle.lua says why).
// While a shard is being rebuilt it cannot settle, and the batch is tried
// again. Once settled, the orders are announced (Events.Written): an
// instance that remembers a buyer's order asks Redis again, which names
// the written one after a takeover. Each call also records gtid, the
// transaction that wrote the orders, in the shard's record of the
// database (Keys.DBSeen). It returns what it did for each order
// (undoEnded needs it).
func (w *Writer) settle(ctx context.Context, items []*item, gtid string) (map[int64]settled, error) {
	calls := map[int]*settleCall{}
	var written []voucher.Message
	for _, it := range items {
		if !it.v.effects().settle {
			continue
		}
		o := it.ord
		written = append(written, o)
		shard := shardOf(w.keys, o)
		c := calls[shard]
		if c == nil {
			c = &settleCall{shard: shard, keys: []string{w.keys.Ready(shard), w.keys.Pending(shard), w.keys.DBSeen(shard)}, args: []any{gtid}}
			calls[shard] = c
		}
		c.keys = append(c.keys, w.keys.StateAt(shard, o.VoucherID), w.keys.BuyersAt(shard, o.VoucherID))
		c.args = append(c.args, o.UserID, o.OrderID, o.VoucherID)
		c.items = append(c.items, it)
	}
	did := make(map[int64]settled, len(written))
	for _, c := range calls {
		res, err := w.settleShard(ctx, c)
		if err != nil {
			return nil, err
		}
		for i, d := range res {
			it := c.items[i]
			if d == settledBadKeys {
				w.leave(it, "settle", fmt.Errorf("settle order %d: %w", it.ord.OrderID, errBadKeys))
				continue
			}
			did[it.ord.OrderID] = d
		}
	}
	w.cfg.Events.Written(ctx, written)
	return did, nil
}

// settleCall is one settle.lua call: the orders of one shard.
type settleCall struct {
	shard int
	keys  []string
	args  []any
	items []*item
}

// settleShard runs settle.lua for one shard and decodes its answer: what
// it did for each order, in the call's order.
func (w *Writer) settleShard(ctx context.Context, c *settleCall) ([]settled, error) {
	res, err := w.settleScript.Run(ctx, w.rdb, c.keys, c.args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("settle %d orders of shard %d in redis: %w", len(c.items), c.shard, err)
	}
	if len(res) == 0 || res[0] != 1 {
		return nil, fmt.Errorf("settle orders of shard %d in redis: %w", c.shard, errNotReady)
	}
	if len(res) != 1+len(c.items) {
		return nil, fmt.Errorf("settle %d orders of shard %d in redis: %d answers", len(c.items), c.shard, len(res)-1)
	}
	out := make([]settled, len(c.items))
	for i, d := range res[1:] {
		out[i] = settled(d)
	}
	return out, nil
}
