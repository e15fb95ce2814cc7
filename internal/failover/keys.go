package failover

import "seckill/internal/voucher"

// healLease is held by the one instance healing the database's loss.
// Each shard's record of the database is voucher.Keys.DBSeen, and an
// order's recorded end voucher.Keys.EndedAt: the purchase side's keys.
func healLease(k voucher.Keys) string { return k.Prefix() + ":heal" }
