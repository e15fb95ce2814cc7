package failover

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/order"
	"seckill/internal/testenv"
	"seckill/internal/voucher"
	schema "seckill/sql"
)

// watched counts what a Watcher reports.
type watched struct{ rolledBack, unverified atomic.Int64 }

func (w *watched) DatabaseSeen(string, time.Time, bool, bool) {}
func (w *watched) DatabaseVerified(ok bool) {
	if !ok {
		w.unverified.Add(1)
	}
}
func (w *watched) DatabaseDown()       {}
func (w *watched) DatabaseRolledBack() { w.rolledBack.Add(1) }
func (w *watched) DatabaseRestored()   {}

// TestWatcherSeesNoLossInABusySale: one healthy primary with a binary
// log, no failover; between each check's reading of the shard's record
// and its reading of the server, a commit is made and recorded (as settle
// records a batch's GTID). No check finds a loss, and every check leaves
// the shard ready: the commit is in the server's history, read after it.
func TestWatcherSeesNoLossInABusySale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := testenv.StartMariaDBWith(t, testenv.MariaDBOptions{ServerID: 1, LogBin: true})
	g, p, err := db.OpenPrimary(m.CreateDatabase(t), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
	if _, err := schema.Apply(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := g.Exec("CREATE TABLE marks (id INT AUTO_INCREMENT PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	keys := voucher.NewKeys(testenv.Prefix(t), 1)
	if err := voucher.NewState(rdb, keys).MarkReady(ctx, 0); err != nil {
		t.Fatal(err)
	}
	life := order.NewLifecycle(g, rdb, keys, order.LifecycleConfig{}, quiet)
	obs := &watched{}
	w := NewWatcher(g, p, rdb, keys, NewHealer(g, rdb, keys, life, nil, quiet), WatchConfig{Observer: obs}, quiet)
	w.betweenReads = func() {
		var gtid string
		err := g.Connection(func(c *gorm.DB) error {
			if err := c.Exec("INSERT INTO marks () VALUES ()").Error; err != nil {
				return err
			}
			var err error
			gtid, err = db.LastGTID(ctx, c)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := db.ParseGTID(gtid)
		if err != nil {
			t.Fatal(err)
		}
		field := "g:" + db.Origin{Domain: got.Domain, Server: got.Server}.String()
		if err := rdb.HSet(ctx, keys.DBSeen(0), field, got.Seq).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		if err := w.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if !w.Ready(0) {
			t.Fatalf("shard 0 not ready after a check: %+v", w.Status())
		}
	}
	if n := obs.rolledBack.Load(); n != 0 {
		t.Fatalf("%d of 20 checks found a loss; want none", n)
	}
}
