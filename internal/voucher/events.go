package voucher

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The events, as published: a kind and its numbers, space separated.
const (
	eventGivenBack = "g" // "g <voucher id> <user id> <order id>": a unit given back, a buyer entry removed
	eventLoaded    = "l" // "l <voucher id>": a voucher's state loaded
	eventRebuilt   = "r" // "r <shard>": a shard rebuilt
	// "a <age us> <voucher id> <user id> <order id> ...": purchases accepted
	// by an instance, the oldest accepted age microseconds (on the
	// instance's clock) before the publish.
	eventAccepted = "a"
	// "w <voucher id> <user id> <order id> ...": orders written to the
	// database; the buyer's entry in Redis may now name the written order
	// (settle.lua's takeover).
	eventWritten = "w"
)

// maxWrittenPerEvent bounds the orders one written event carries.
const maxWrittenPerEvent = 256

// Events publishes what can make a local refusal wrong on the events
// channel (Keys.Events), for every instance's Refusals. A publish that
// fails is logged at most once a second and otherwise ignored: each local
// answer expires after its bound anyway. A nil *Events publishes nothing.
// One is shared by everything of an instance that publishes, so the
// throttle covers them all.
type Events struct {
	rdb      redis.UniversalClient
	channel  string
	log      *slog.Logger
	lastWarn atomic.Int64
}

// NewEvents returns a publisher of events; it does not own rdb.
func NewEvents(rdb redis.UniversalClient, keys Keys, log *slog.Logger) *Events {
	return &Events{rdb: rdb, channel: keys.Events(), log: log}
}

// GivenBack announces that the reservation of order orderID, userID's for
// voucherID, was given back: the unit returned to stock, or the buyer
// entry removed.
func (e *Events) GivenBack(ctx context.Context, voucherID, userID, orderID int64) {
	e.publish(ctx, eventGivenBack+" "+strconv.FormatInt(voucherID, 10)+" "+strconv.FormatInt(userID, 10)+" "+strconv.FormatInt(orderID, 10))
}

// Loaded announces that a voucher's state was (re)loaded.
func (e *Events) Loaded(ctx context.Context, voucherID int64) {
	e.publish(ctx, eventLoaded+" "+strconv.FormatInt(voucherID, 10))
}

// Rebuilt announces that a shard's state was rebuilt.
func (e *Events) Rebuilt(ctx context.Context, shard int) {
	e.publish(ctx, eventRebuilt+" "+strconv.Itoa(shard))
}

// Written announces that these orders were written to the database and
// settled in Redis: every instance then asks Redis again on its next
// purchase by each of their buyers, so an answer it kept names the order
// Redis now holds for the buyer (settle.lua may have moved the buyer's
// entry to the written order), and an instance that never heard of the
// buyer stops answering sold_out or ended to them.
func (e *Events) Written(ctx context.Context, orders []Message) {
	for len(orders) > 0 {
		n := min(len(orders), maxWrittenPerEvent)
		b := make([]byte, 0, 1+n*24)
		b = append(b, eventWritten...)
		for _, o := range orders[:n] {
			b = appendInts(b, o.VoucherID, o.UserID, o.OrderID)
		}
		e.publish(ctx, string(b))
		orders = orders[n:]
	}
}

// appendInts appends each of xs after a space.
func appendInts(b []byte, xs ...int64) []byte {
	for _, x := range xs {
		b = append(b, ' ')
		b = strconv.AppendInt(b, x, 10)
	}
	return b
}

// publish publishes payload, and logs a failure at most once a second.
// It reports whether Redis took it.
func (e *Events) publish(ctx context.Context, payload string) bool {
	if e == nil {
		return false
	}
	err := e.rdb.Publish(context.WithoutCancel(ctx), e.channel, payload).Err()
	if err == nil {
		return true
	}
	e.warn("publish sale-state event failed; local refusals elsewhere stay stale up to their bound",
		"event", payload[:min(len(payload), 64)], "err", err)
	return false
}

// warn logs at most once a second, whatever the message.
func (e *Events) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := e.lastWarn.Load()
	if now-last < int64(time.Second) || !e.lastWarn.CompareAndSwap(last, now) {
		return
	}
	e.log.Warn(msg, args...)
}
