package order

import "seckill/internal/mq"

// read is what Handle learnt of a message before the transaction.
type read uint8

const (
	readOK            read = iota // decoded, its buyer lock taken (or no locks)
	readUndecodable               // its values do not decode
	readRepeatedID                // an earlier message of the batch has its order id
	readDeliveryLimit             // delivered more than MaxDeliveries times
	readLockHeld                  // its buyer lock is held elsewhere, tries left
	readAttemptLimit              // its buyer lock was held elsewhere on its last try
)

// holding is what MySQL holds for a message, read in the transaction (or
// what a guard of the write answered).
type holding uint8

const (
	// holdsNothing: nothing under its order id or its message, or only
	// this buyer's replayed letter of another message (this message is the
	// replay's own).
	holdsNothing     holding = iota
	holdsOrder               // this buyer's order
	holdsEndedOrder          // this buyer's order, cancelled or refunded since: it gave its unit back
	holdsLetter              // this buyer's live dead letter, under the order id or by this message
	holdsReplayed            // this message's own dead letter, replayed: this is a stale copy
	holdsOthersOrder         // another buyer's order has the order id
	// holdsOthersLetter: another buyer's dead letter has the order id,
	// which stays free for an order; a letter of this message is kept by
	// its message.
	holdsOthersLetter
	holdsNoStock     // the stock guard refused: no unit left
	holdsNoVoucher   // the stock guard refused: no such voucher
	holdsBuyersOrder // the buyer already has another order of this voucher
)

// found is what MySQL holds for a message, with the reason of its live
// letter (holdsLetter).
type found struct {
	holds  holding
	reason string
}

// idTaken: another buyer's order or dead letter has the order id, so a
// dead letter of the message is kept by its message alone.
func (f found) idTaken() bool { return f.holds == holdsOthersOrder || f.holds == holdsOthersLetter }

// fate is what becomes of a message; effectsOf says what each one does.
type fate uint8

const (
	retry       fate = iota // tried again through the delay queue
	inserted                // its order is written by this batch
	written                 // its order was written before (a redelivery, or a concurrent batch)
	lettered                // its dead letter is recorded by this batch (with a reason)
	letterFound             // its live dead letter was there (recorded before, or by a concurrent worker)
	stale                   // a stale copy of a message whose letter was replayed: the replay decides
	poisoned                // undecodable: its dead letter is recorded by this batch
	poisonFound             // undecodable, its dead letter was there
	ended                   // its order was written, then cancelled or refunded: it gave its unit back
)

var fateNames = [...]string{"retry", "inserted", "written", "lettered", "letter_found", "stale", "poisoned", "poison_found", "ended"}

func (f fate) String() string { return fateNames[f] }

// verdict is a message's fate, with the reason of its dead letter
// (lettered, letterFound, poisoned, poisonFound).
type verdict struct {
	fate   fate
	reason string
}

// decide is the one place a message's fate is chosen: from what was read
// before the transaction and what MySQL holds for it. Before the
// transaction only a retry is final (MySQL is not read for it); the
// others are decided again from what the transaction reads, and again
// when a write of it meets what a concurrent worker committed.
func decide(r read, f found) verdict {
	switch r {
	case readRepeatedID, readLockHeld:
		return verdict{fate: retry}
	case readUndecodable:
		if f.holds == holdsLetter {
			return verdict{poisonFound, ReasonUndecodable}
		}
		return verdict{poisoned, ReasonUndecodable}
	}
	switch f.holds {
	case holdsOrder:
		return verdict{fate: written}
	case holdsEndedOrder:
		return verdict{fate: ended}
	case holdsLetter:
		return verdict{letterFound, f.reason}
	case holdsReplayed:
		return verdict{fate: stale}
	case holdsOthersOrder:
		return verdict{lettered, ReasonIDCollision}
	case holdsNoStock:
		return verdict{lettered, ReasonOutOfStock}
	case holdsNoVoucher:
		return verdict{lettered, ReasonUnknownVoucher}
	case holdsBuyersOrder:
		return verdict{lettered, ReasonDuplicateBuyer}
	}
	switch r {
	case readDeliveryLimit:
		return verdict{lettered, ReasonDeliveryLimit}
	case readAttemptLimit:
		return verdict{lettered, ReasonAttemptLimit}
	}
	return verdict{fate: inserted}
}

// effects is what a verdict does; effectsOf holds one row per fate. In
// words, from what was read and what MySQL holds to what happens:
//
//	read / MySQL holds                      verdict                    record  count   give back  settle
//	id repeated in the batch; lock held     retry                      -       -       -          -
//	nothing, or another buyer's letter      inserted                   order   order   -          yes
//	  the same, over the delivery limit     lettered(delivery_limit)   letter  letter  yes        -
//	  the same, lock held on its last try   lettered(attempt_limit)    letter  letter  yes        -
//	this buyer's order                      written                    -       -       -          yes
//	this buyer's order, cancelled/refunded  ended                      -       -       yes        -
//	this buyer's live letter                letterFound(its reason)    -       -       yes        -
//	this message's replayed letter          stale                      -       -       -          -
//	another buyer's order on the id         lettered(id_collision)     letter  letter  yes        -
//	no unit left, no such voucher           lettered(out_of_stock,     letter  letter  yes        -
//	                                          unknown_voucher)
//	the buyer's other order of the voucher  lettered(duplicate_buyer)  letter  letter  yes        -
//	undecodable, no letter yet              poisoned(undecodable)      letter  letter  -          -
//	undecodable, its letter there           poisonFound(undecodable)   -       -       -          -
//
// The last three MySQL answers come from the guards of the careful way
// (insertOrLetter). A give-back drops the buyer entry while it names this
// order, and returns the unit to the Redis stock only for the reasons
// restocks names (out_of_stock and unknown_voucher have no unit to give),
// and for an ended order: its move gave the unit back in MySQL, and this
// gives it back in Redis if the move did not get that far (a no-op if it
// did). Settling an ended order would take its unit again.
type effects struct {
	outcome  mq.Outcome // mq.Ack unless said
	record   record     // what the transaction writes
	count    count      // what the observer hears once committed
	giveBack bool       // the Redis reservation is given back
	settle   bool       // Redis is made to agree with the written order
}

type record uint8

const (
	recordNothing record = iota
	recordOrder
	recordLetter
)

type count uint8

const (
	countNothing count = iota
	countOrder
	countLetter
)

var effectsOf = [...]effects{
	retry:       {outcome: mq.Retry},
	inserted:    {record: recordOrder, count: countOrder, settle: true},
	written:     {settle: true},
	lettered:    {record: recordLetter, count: countLetter, giveBack: true},
	letterFound: {giveBack: true},
	stale:       {},
	poisoned:    {record: recordLetter, count: countLetter},
	poisonFound: {},
	ended:       {giveBack: true},
}

func (v verdict) effects() effects { return effectsOf[v.fate] }
