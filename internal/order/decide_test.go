package order

import (
	"fmt"
	"testing"

	"seckill/internal/mq"
	"seckill/internal/voucher"
)

// TestEffectsOfEveryFate: what each fate does, row by row, as the table
// beside effectsOf says.
func TestEffectsOfEveryFate(t *testing.T) {
	t.Parallel()
	want := map[fate]effects{
		retry:       {outcome: mq.Retry},
		inserted:    {outcome: mq.Ack, record: recordOrder, count: countOrder, settle: true},
		written:     {outcome: mq.Ack, settle: true},
		lettered:    {outcome: mq.Ack, record: recordLetter, count: countLetter, giveBack: true},
		letterFound: {outcome: mq.Ack, giveBack: true},
		stale:       {outcome: mq.Ack},
		poisoned:    {outcome: mq.Ack, record: recordLetter, count: countLetter},
		poisonFound: {outcome: mq.Ack},
		ended:       {outcome: mq.Ack, giveBack: true},
	}
	for f := range fate(len(effectsOf)) {
		if _, ok := want[f]; !ok || int(f) >= len(fateNames) {
			t.Errorf("fate %d has effects but no test or no name", f)
		}
	}
	if len(want) != len(effectsOf) {
		t.Errorf("%d fates tested, %d rows of effects", len(want), len(effectsOf))
	}
	for f, e := range want {
		if got := (verdict{fate: f}).effects(); got != e {
			t.Errorf("%v: effects %+v, want %+v", f, got, e)
		}
	}
}

// TestDecide: a message's verdict from what Handle read and what MySQL
// holds.
func TestDecide(t *testing.T) {
	t.Parallel()
	nothing := found{}
	for _, c := range []struct {
		read read
		f    found
		want verdict
	}{
		// Retries are decided before MySQL is read, whatever it holds.
		{readRepeatedID, nothing, verdict{fate: retry}},
		{readRepeatedID, found{holds: holdsOrder}, verdict{fate: retry}},
		{readLockHeld, nothing, verdict{fate: retry}},
		{readLockHeld, found{holdsLetter, ReasonOutOfStock}, verdict{fate: retry}},

		// Undecodable: a letter, once.
		{readUndecodable, nothing, verdict{poisoned, ReasonUndecodable}},
		{readUndecodable, found{holds: holdsLetter}, verdict{poisonFound, ReasonUndecodable}},

		// Nothing yet: an order, or the letter of a limit.
		{readOK, nothing, verdict{fate: inserted}},
		{readDeliveryLimit, nothing, verdict{lettered, ReasonDeliveryLimit}},
		{readAttemptLimit, nothing, verdict{lettered, ReasonAttemptLimit}},

		// This buyer's order exists: written, whatever the limits.
		{readOK, found{holds: holdsOrder}, verdict{fate: written}},
		{readDeliveryLimit, found{holds: holdsOrder}, verdict{fate: written}},
		{readAttemptLimit, found{holds: holdsOrder}, verdict{fate: written}},

		// This buyer's order, cancelled or refunded since: ended, whatever
		// the limits (its unit is given back in Redis, never taken again).
		{readOK, found{holds: holdsEndedOrder}, verdict{fate: ended}},
		{readDeliveryLimit, found{holds: holdsEndedOrder}, verdict{fate: ended}},
		{readAttemptLimit, found{holds: holdsEndedOrder}, verdict{fate: ended}},

		// This buyer's live letter: it stands, with its own reason.
		{readOK, found{holdsLetter, ReasonOutOfStock}, verdict{letterFound, ReasonOutOfStock}},
		{readDeliveryLimit, found{holdsLetter, ReasonAttemptLimit}, verdict{letterFound, ReasonAttemptLimit}},

		// This message's letter was replayed: a stale copy.
		{readOK, found{holds: holdsReplayed}, verdict{fate: stale}},
		{readDeliveryLimit, found{holds: holdsReplayed}, verdict{fate: stale}},

		// Another buyer's order on the id: a collision, before any limit.
		{readOK, found{holds: holdsOthersOrder}, verdict{lettered, ReasonIDCollision}},
		{readDeliveryLimit, found{holds: holdsOthersOrder}, verdict{lettered, ReasonIDCollision}},

		// Another buyer's letter on the id: the id is free for an order.
		{readOK, found{holds: holdsOthersLetter}, verdict{fate: inserted}},
		{readDeliveryLimit, found{holds: holdsOthersLetter}, verdict{lettered, ReasonDeliveryLimit}},

		// The guards of the careful way.
		{readOK, found{holds: holdsNoStock}, verdict{lettered, ReasonOutOfStock}},
		{readOK, found{holds: holdsNoVoucher}, verdict{lettered, ReasonUnknownVoucher}},
		{readOK, found{holds: holdsBuyersOrder}, verdict{lettered, ReasonDuplicateBuyer}},
	} {
		if got := decide(c.read, c.f); got != c.want {
			t.Errorf("decide(read %d, holds %d %q) = %v, want %v", c.read, c.f.holds, c.f.reason, got, c.want)
		}
	}
}

// TestHoldingOf: what the order and letter under a message's order id
// hold for it.
func TestHoldingOf(t *testing.T) {
	t.Parallel()
	it := &item{msg: mq.Message{Stream: "s", ID: "1-1"}, ord: voucher.Message{OrderID: 7, UserID: 1, VoucherID: 2}}
	mine, others := it.owner(), orderOwner{ID: 7, UserID: 3, VoucherID: 2}
	letter := func(o orderOwner, replayed bool, message string) *letterRow {
		return &letterRow{owner: o, reason: ReasonDeliveryLimit, replayed: replayed, stream: "s", message: message}
	}
	for i, c := range []struct {
		order  *orderOwner
		letter *letterRow
		want   found
	}{
		{nil, nil, found{}},
		{&mine, nil, found{holds: holdsOrder}},
		{&others, nil, found{holds: holdsOthersOrder}},
		{nil, letter(mine, false, "1-9"), found{holdsLetter, ReasonDeliveryLimit}},
		{nil, letter(mine, true, "1-1"), found{holds: holdsReplayed}},
		{nil, letter(mine, true, "1-9"), found{}}, // the replay's own message
		{nil, letter(others, false, "1-9"), found{holds: holdsOthersLetter}},
		{&others, letter(others, false, "1-9"), found{holds: holdsOthersOrder}},
		{&others, letter(mine, false, "1-1"), found{holdsLetter, ReasonDeliveryLimit}},
		{&mine, letter(mine, false, "1-1"), found{holds: holdsOrder}},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := holdingOf(it, c.order, c.letter); got != c.want {
				t.Errorf("holdingOf = %+v, want %+v", got, c.want)
			}
		})
	}
}
