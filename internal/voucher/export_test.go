package voucher

// AfterBucket sets the hook a shard rebuild runs after each bucket it
// wrote, before the shard reopens (tests of package voucher_test).
func (w *Warmer) AfterBucket(f func(voucherID int64, bucket int)) { w.afterBucket = f }

// MigratedMySQL is migratedMySQL for package voucher_test.
var MigratedMySQL = migratedMySQL
