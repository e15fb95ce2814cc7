package testenv_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"seckill/internal/testenv"
)

// dsn returns the DSN of database db at addr for user, without a password.
func dsn(user, addr, db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = user, "tcp", addr, db
	return cfg.FormatDSN()
}

// ids returns the ids of table t, in order.
func ids(t *testing.T, db *sql.DB) []int {
	t.Helper()
	got, err := queryIDs(db)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// hasIDs reports whether table t holds exactly want; an error (the table,
// or the user, not there yet) is a no.
func hasIDs(db *sql.DB, want ...int) bool {
	got, err := queryIDs(db)
	return err == nil && slices.Equal(got, want)
}

func queryIDs(db *sql.DB) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, "SELECT id FROM t ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

func insert(t *testing.T, db *sql.DB, id int) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), "INSERT INTO t VALUES (?)", id); err != nil {
		t.Fatalf("insert %d: %v", id, err)
	}
}

// TestAsyncFailoverLosesWhatTheReplicaLacked fails over as an operator
// would, with the replica lagging: the commit it had not received is lost,
// and the promoted replica takes the application's writes.
func TestAsyncFailoverLosesWhatTheReplicaLacked(t *testing.T) {
	t.Parallel()
	began := time.Now()
	r := testenv.StartReplication(t, testenv.ReplicationOptions{})
	t.Logf("replication running in %s", time.Since(began).Round(time.Millisecond))
	if got := r.Replica.Var(t, "read_only"); got != "ON" {
		t.Fatalf("replica read_only = %s, want ON", got)
	}
	// The application's own user: root would write through read_only.
	r.Primary.Exec(t, "CREATE DATABASE shop")
	r.Primary.Exec(t, "CREATE TABLE shop.t (id INT PRIMARY KEY)")
	r.Primary.Exec(t, "CREATE USER app@'127.0.0.1'")
	r.Primary.Exec(t, "GRANT ALL ON shop.* TO app@'127.0.0.1'")
	addr := testenv.StartProxy(t, r.Primary.Addr)
	app := openDB(t, dsn("app", addr.Addr, "shop"))

	insert(t, app, 1)
	onReplica := openDB(t, dsn("app", r.Replica.Addr, "shop"))
	testenv.WaitFor(t, 10*time.Second, "row 1 on the replica", func() bool { return hasIDs(onReplica, 1) })
	r.WaitCaughtUp(t, 10*time.Second)
	var mysqlErr *mysql.MySQLError
	if _, err := onReplica.Exec("INSERT INTO t VALUES (99)"); !errors.As(err, &mysqlErr) || mysqlErr.Number != 1290 {
		t.Fatalf("write on the read-only replica: %v, want error 1290 (read-only)", err)
	}

	r.StopReceiving(t)
	insert(t, app, 2) // returns: nothing waits for the replica
	r.Primary.Kill(t)
	began = time.Now()
	r.Promote(t)
	addr.MoveTo(r.Replica.Addr)
	t.Logf("promoted in %s", time.Since(began).Round(time.Millisecond))

	// The pool's connection to the old primary was closed by the move; the
	// driver finds out before it sends, and dials the new one.
	if got := ids(t, app); !slices.Equal(got, []int{1}) {
		t.Fatalf("after failover: ids %v, want [1] (2 was never received)", got)
	}
	insert(t, app, 3)
	if got := ids(t, app); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("after a write on the promoted replica: ids %v, want [1 3]", got)
	}
}

// TestSemiSyncFailoverKeepsEveryReturnedCommit: with the replica not
// receiving, a commit waits for it; killed under a stream of commits, the
// primary has no returned commit the promoted replica lacks.
func TestSemiSyncFailoverKeepsEveryReturnedCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	r := testenv.StartReplication(t, testenv.ReplicationOptions{SemiSync: true})
	t.Logf("semi-sync replication running in %s", time.Since(began).Round(time.Millisecond))
	r.Primary.Exec(t, "CREATE DATABASE shop")
	r.Primary.Exec(t, "CREATE TABLE shop.t (id INT PRIMARY KEY)")
	addr := testenv.StartProxy(t, r.Primary.Addr)
	db := openDB(t, dsn("root", addr.Addr, "shop"))

	r.StopReceiving(t)
	returned := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1)")
		returned <- err
	}()
	testenv.WaitFor(t, 10*time.Second, "the commit waiting for an acknowledgement", func() bool {
		return r.Primary.Var(t, "Rpl_semi_sync_master_wait_sessions") == "1"
	})
	select {
	case err := <-returned:
		t.Fatalf("commit returned (%v) while the replica was not receiving", err)
	case <-time.After(time.Second):
	}
	r.StartReceiving(t)
	select {
	case err := <-returned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("commit still waiting 5 s after the replica receives again")
	}

	// Commits go on while the primary is killed.
	var (
		mu   sync.Mutex
		done []int
	)
	stopped := make(chan error, 1)
	go func() {
		for id := 2; ; id++ {
			if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (?)", id); err != nil {
				stopped <- err
				return
			}
			mu.Lock()
			done = append(done, id)
			mu.Unlock()
		}
	}()
	testenv.WaitFor(t, 10*time.Second, "50 commits returned", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) >= 50
	})
	if n := r.Primary.Var(t, "Rpl_semi_sync_master_no_tx"); n != "0" {
		t.Fatalf("Rpl_semi_sync_master_no_tx = %s: commits returned without an acknowledgement", n)
	}
	r.Primary.Kill(t)
	select {
	case err := <-stopped:
		t.Logf("writer stopped by the kill: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("writer still committing 10 s after the primary was killed")
	}
	r.Promote(t)
	addr.MoveTo(r.Replica.Addr)

	got := ids(t, db)
	mu.Lock()
	defer mu.Unlock()
	for _, id := range append([]int{1}, done...) {
		if _, ok := slices.BinarySearch(got, id); !ok {
			t.Fatalf("commit %d returned on the primary, missing on the promoted replica (%d rows there)", id, len(got))
		}
	}
	t.Logf("%d commits returned, %d rows on the promoted replica", len(done)+1, len(got))
	insert(t, db, 0)
}
