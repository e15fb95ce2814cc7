package bucket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Move is one journaled move of a voucher, as an operator reads it
// (api buckets): Mark is the receiver's apply-once mark ("applied",
// "refused", or "" while there is none: not applied yet, or expired), and
// after Settle, Outcome is how the move was closed or Err why it was not.
type Move struct {
	ID      string        `json:"id"`
	From    int           `json:"from_bucket"`
	To      int           `json:"to_bucket"`
	Units   int           `json:"units"`
	Age     time.Duration `json:"-"`
	AgeText string        `json:"age"`
	Mark    string        `json:"mark"`
	Outcome string        `json:"outcome,omitempty"`
	Err     string        `json:"error,omitempty"`
}

// Moves lists voucher v's journaled moves (of nb buckets), every bucket's
// journal read, with each receiver's mark; a journal or mark that cannot
// be read fails the list.
func (m *Mover) Moves(ctx context.Context, v int64, nb int) ([]Move, error) {
	var out []Move
	err := m.eachMove(ctx, v, nb, func(j journaled, from int) error {
		mark, err := m.rdb.Get(ctx, markKey(m.keys, m.receiver(j.e), j.id)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("move %s: read its mark: %w", j.id, err)
		}
		out = append(out, move(j, from, mark))
		return nil
	})
	return out, err
}

// Settle decides every journaled move of voucher v now, whatever its age,
// by the rule the Recoverer follows once a move is StaleAfter old (settle
// in mover.go: a rule that never makes a unit twice), then lifts the
// fences a rebuild left when nobody holds the voucher's lease. It is what
// an operator runs on a move the recovery loop keeps failing on, once its
// cause (a master down) is mended: "api buckets settle VOUCHER". A move
// still in its mover's hands is refused at its apply if not applied yet,
// and its units go back to its donor: a borrower tries again.
//
// Each move's Outcome or Err says what became of it; fenced is whether a
// rebuild holds the voucher (its fences stay). The error is the first
// move that could not be settled, or a journal that could not be read.
func (m *Mover) Settle(ctx context.Context, v int64, nb int) (moves []Move, fenced bool, err error) {
	var failed []error
	err = m.eachMove(ctx, v, nb, func(j journaled, from int) error {
		mv := move(j, from, "")
		outcome, serr := m.settle(ctx, j, &m.stats)
		if serr != nil {
			mv.Err = serr.Error()
			failed = append(failed, fmt.Errorf("move %s: %w", j.id, serr))
		}
		mv.Outcome = outcome
		moves = append(moves, mv)
		return nil
	})
	if err != nil {
		return moves, false, err
	}
	if err := errors.Join(failed...); err != nil {
		return moves, false, err
	}
	fenced, err = m.clearFences(ctx, v, nb)
	return moves, fenced, err
}

// eachMove calls visit for each journaled move of v, bucket by bucket;
// from is the donor bucket.
func (m *Mover) eachMove(ctx context.Context, v int64, nb int, visit func(j journaled, from int) error) error {
	for b := range nb {
		var failed error
		err := m.scanJournal(ctx, m.keys.BucketShard(v, b, nb), func(j journaled) {
			// An entry that does not parse names no voucher: the
			// recovery loop logs it.
			if failed != nil || j.err != nil || j.e.v != v {
				return
			}
			failed = visit(j, b)
		})
		if err = errors.Join(err, failed); err != nil {
			return fmt.Errorf("moves of voucher %d out of bucket %d: %w", v, b, err)
		}
	}
	return nil
}

func move(j journaled, from int, mark string) Move {
	return Move{ID: j.id, From: from, To: j.e.to, Units: j.e.units, Age: j.age, AgeText: j.age.Round(time.Millisecond).String(), Mark: mark}
}
