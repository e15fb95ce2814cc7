package voucher

import (
	"slices"
	"testing"

	"seckill/internal/testenv"
)

// TestInShardsAgreesWithShard: the SQL condition picks exactly the vouchers
// Shard places in the shards named, on both databases (MySQL's % and
// SQLite's agree on positive ids).
func TestInShardsAgreesWithShard(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "mariadb"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			g := testenv.DB(t, dialect)
			if err := g.Exec("CREATE TABLE ids (voucher_id BIGINT NOT NULL)").Error; err != nil {
				t.Fatal(err)
			}
			var all []int64
			for id := int64(1); id <= 40; id++ {
				all = append(all, id)
				if err := g.Exec("INSERT INTO ids (voucher_id) VALUES (?)", id).Error; err != nil {
					t.Fatal(err)
				}
			}
			all = append(all, 1<<40+3) // ids from the generator are large
			if err := g.Exec("INSERT INTO ids (voucher_id) VALUES (?)", all[len(all)-1]).Error; err != nil {
				t.Fatal(err)
			}
			k := NewKeys("", 6)
			shards := []int{1, 4, 5}
			var want []int64
			for _, id := range all {
				if slices.Contains(shards, k.Shard(id)) {
					want = append(want, id)
				}
			}
			cond, args := k.InShards("voucher_id", shards)
			var got []int64
			if err := g.Table("ids").Where(cond, args...).Order("voucher_id").Pluck("voucher_id", &got).Error; err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("InShards(%v) found %v, Shard places %v there", shards, got, want)
			}
		})
	}
}
