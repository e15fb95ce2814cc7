package order

import (
	"context"
	"strconv"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// admit decodes the batch and reads what needs no lock and no database:
// undecodable, an order id repeated in the batch, over the delivery limit.
func (w *Writer) admit(batch []mq.Message) []item {
	items := make([]item, len(batch))
	ids := make(map[int64]bool, len(batch))
	for i, m := range batch {
		it := &items[i]
		it.msg = m
		o, err := voucher.Decode(m.Values)
		switch {
		case err != nil:
			it.read = readUndecodable
			continue
		case ids[o.OrderID]:
			// An earlier message of this batch has the same order id:
			// another buyer's (ids minted twice) or another message of
			// this order (a replay beside a stale copy still pending). One
			// transaction decides one message per order id; this one is
			// decided in a later batch, once that one is committed.
			it.read = readRepeatedID
		case m.Deliveries > w.cfg.MaxDeliveries:
			it.ord, it.read = o, readDeliveryLimit
			ids[o.OrderID] = true
		default:
			it.ord = o
			ids[o.OrderID] = true
		}
	}
	return items
}

// lock takes the buyer locks of the admitted items all at once, when the
// writer has locks: an item whose lock is held elsewhere reads
// readLockHeld, or readAttemptLimit on its last try. The locks are kept
// alive until unlock, which releases them.
func (w *Writer) lock(ctx context.Context, items []item) (unlock func(), err error) {
	if w.cfg.Locks == nil {
		return func() {}, nil
	}
	var keys, values []string
	var idx []int
	for i, it := range items {
		if it.read != readOK {
			continue
		}
		keys = append(keys, lockKey(w.cfg.KeyPrefix, it.ord.VoucherID, it.ord.UserID))
		values = append(values, lockValue(it.ord.OrderID))
		idx = append(idx, i)
	}
	if len(keys) == 0 {
		return func() {}, nil
	}
	held, err := w.cfg.Locks.tryAll(ctx, keys, values)
	if err != nil {
		w.cfg.Observer.RedisError("lock")
		return nil, err
	}
	conflicts := 0
	for j, m := range held {
		if m != nil {
			continue
		}
		conflicts++
		it := &items[idx[j]]
		it.read = readLockHeld
		if it.msg.Attempt+1 >= w.cfg.MaxAttempts {
			it.read = readAttemptLimit
		}
	}
	if conflicts > 0 {
		w.cfg.Observer.LockConflicts(conflicts)
	}
	stop := w.cfg.Locks.watch(ctx, held)
	return func() {
		stop()
		w.cfg.Locks.release(context.WithoutCancel(ctx), held)
	}, nil
}

// lockValue is the value of the buyer lock taken for an order,
// order:ORDER_ID.
func lockValue(orderID int64) string {
	var buf [32]byte
	return string(strconv.AppendInt(append(buf[:0], "order:"...), orderID, 10))
}
