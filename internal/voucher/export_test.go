package voucher

import "context"

// MigratedMySQL is migratedMySQL for package voucher_test.
var MigratedMySQL = migratedMySQL

// LoadAt is loadAt for package voucher_test: one bucket's state, under a
// guard when one is given.
func (s *State) LoadAt(ctx context.Context, shard int, v Voucher, stock int64, fields []any, g *Guard) (bool, error) {
	return s.loadAt(ctx, shard, v, stock, nil, fields, g)
}

// ErrGuardLost is errGuardLost for package voucher_test.
var ErrGuardLost = errGuardLost

// AfterPage sets a hook run after each page of a shard's pending index is
// read, for package voucher_test (a rebuild stalled there).
func (w *Warmer) AfterPage(f func()) { w.afterPage = f }
