package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ReplicationOptions configures StartReplication.
type ReplicationOptions struct {
	// SemiSync makes the replication semi-synchronous: a commit on the
	// primary returns once the replica has it in its relay log, or once
	// SemiSyncTimeout has passed without an acknowledgement (then the
	// primary falls back to asynchronous replication until the replica
	// catches up). Without it, a commit returns at once and a failover
	// loses whatever the replica had not received.
	SemiSync bool
	// SemiSyncTimeout is rpl_semi_sync_master_timeout, 10 s by default.
	SemiSyncTimeout time.Duration
}

// Replication is a MariaDB primary (server_id 1) and a read-only replica
// (server_id 2) replicating from it with GTIDs, both with a binary log, so
// that a test can fail over as an operator would: stop the replica
// receiving (it lags), kill -9 the primary, Promote the replica, move the
// address (see Proxy).
type Replication struct {
	Primary, Replica *MariaDB // after Promote, Replica is the one taking writes

	semiSync bool
}

// StartReplication starts a primary and a replica and returns once the
// replica's IO and SQL threads run and, with SemiSync, the primary counts
// the replica as a semi-sync client (Rpl_semi_sync_master_clients = 1).
//
// The replica starts from an empty GTID position, so it replays the
// primary's binlog from its first event and replicates the first write
// made: mariadb-install-db's own writes (system tables, root) are in
// neither binlog, and each server has identical ones of its own. Nothing
// is written on the replica first: a GTID of its own would be ahead of the
// primary's in gtid_strict_mode, and stop the applier.
func StartReplication(tb testing.TB, opt ReplicationOptions) *Replication {
	tb.Helper()
	base := MariaDBOptions{LogBin: true, SemiSync: opt.SemiSync, SemiSyncTimeout: opt.SemiSyncTimeout}
	primary, replica := base, base
	primary.ServerID = 1
	replica.ServerID, replica.ReadOnly = 2, true
	if opt.SemiSync {
		// The master side off while it replicates (see MariaDBOptions.SemiSync).
		replica.ExtraArgs = []string{"--rpl-semi-sync-master-enabled=OFF"}
	}
	r := &Replication{semiSync: opt.SemiSync}
	r.Primary = StartMariaDBWith(tb, primary)
	r.Replica = StartMariaDBWith(tb, replica)

	host, port, err := net.SplitHostPort(r.Primary.Addr)
	if err != nil {
		tb.Fatal(err)
	}
	// A retry every second, not every minute, when the primary is gone.
	r.Replica.Exec(tb, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='%s', MASTER_PORT=%s, "+
		"MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1", host, port))
	r.Replica.Exec(tb, "START SLAVE")
	r.waitReceiving(tb)
	return r
}

// StopReceiving stops the replica's IO thread: from now on it receives
// nothing, and lags behind every commit on the primary. With SemiSync, a
// commit on the primary waits (up to SemiSyncTimeout) for an
// acknowledgement that does not come.
func (r *Replication) StopReceiving(tb testing.TB) {
	tb.Helper()
	r.stopIO(tb)
}

// stopIO stops the replica's IO thread and returns its SHOW SLAVE STATUS
// once stopped.
func (r *Replication) stopIO(tb testing.TB) map[string]string {
	tb.Helper()
	r.Replica.Exec(tb, "STOP SLAVE IO_THREAD")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := r.Replica.row(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		tb.Fatal(err)
	}
	if st["Slave_IO_Running"] != "No" {
		tb.Fatalf("replica %s: Slave_IO_Running %q after STOP SLAVE IO_THREAD", r.Replica.Addr, st["Slave_IO_Running"])
	}
	return st
}

// StartReceiving starts the replica's IO thread again and waits until it
// runs and, with SemiSync, the primary counts it as a client again: a
// commit waiting for it returns then.
func (r *Replication) StartReceiving(tb testing.TB) {
	tb.Helper()
	r.Replica.Exec(tb, "START SLAVE IO_THREAD")
	r.waitReceiving(tb)
}

// waitReceiving waits until the replica's threads both run and, with
// SemiSync, the primary has it as a semi-sync client.
func (r *Replication) waitReceiving(tb testing.TB) {
	tb.Helper()
	poll(tb, 30*time.Second, "replica "+r.Replica.Addr+" replicating from "+r.Primary.Addr, func(ctx context.Context) error {
		st, err := r.Replica.row(ctx, "SHOW SLAVE STATUS")
		if err != nil {
			return err
		}
		if st["Slave_IO_Running"] != "Yes" || st["Slave_SQL_Running"] != "Yes" {
			return fmt.Errorf("Slave_IO_Running %q (%s), Slave_SQL_Running %q (%s)",
				st["Slave_IO_Running"], st["Last_IO_Error"], st["Slave_SQL_Running"], st["Last_SQL_Error"])
		}
		if !r.semiSync {
			return nil
		}
		n, err := r.Primary.value(ctx, "Rpl_semi_sync_master_clients")
		if err != nil {
			return err
		}
		if n != "1" {
			return fmt.Errorf("primary's Rpl_semi_sync_master_clients = %s", n)
		}
		return nil
	})
}

// WaitCaughtUp waits until the replica has applied everything the
// primary's binlog holds now: its gtid_slave_pos reaches the primary's
// gtid_binlog_pos in every replication domain. It needs the primary alive.
func (r *Replication) WaitCaughtUp(tb testing.TB, within time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want, err := r.Primary.value(ctx, "gtid_binlog_pos")
	if err != nil {
		tb.Fatal(err)
	}
	r.waitApplied(tb, within, want, "the primary's binlog")
}

// waitApplied waits until the replica's SQL thread has applied every
// transaction up to the GTID position want.
func (r *Replication) waitApplied(tb testing.TB, within time.Duration, want, what string) {
	tb.Helper()
	poll(tb, within, "replica "+r.Replica.Addr+" applied "+what+" ("+want+")", func(ctx context.Context) error {
		st, err := r.Replica.row(ctx, "SHOW SLAVE STATUS")
		if err != nil {
			return err
		}
		if st["Slave_SQL_Running"] != "Yes" {
			return fmt.Errorf("Slave_SQL_Running %q: %s", st["Slave_SQL_Running"], st["Last_SQL_Error"])
		}
		have, err := r.Replica.value(ctx, "gtid_slave_pos")
		if err != nil {
			return err
		}
		ok, err := gtidReached(have, want)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("gtid_slave_pos %q", have)
		}
		return nil
	})
}

// Promote makes the replica the primary, as an operator does once the
// primary is dead (it works with the primary dead or alive): it stops
// receiving, applies what it had received (its relay log may hold
// transactions that semi-sync acknowledged and the SQL thread has not yet
// applied), forgets its primary (STOP SLAVE; RESET SLAVE ALL) and takes
// writes (read_only=OFF).
//
// With SemiSync, the promoted server keeps the master side of semi-sync
// off, as it ran while replicating: it has no replica yet, and with the
// master side on its first commit would wait SemiSyncTimeout for one,
// then fall back to asynchronous replication. Attaching a replica to it
// is when semi-sync means something again.
func (r *Replication) Promote(tb testing.TB) {
	tb.Helper()
	st := r.stopIO(tb)
	r.waitApplied(tb, 30*time.Second, st["Gtid_IO_Pos"], "what it received")
	r.Replica.Exec(tb, "STOP SLAVE")
	r.Replica.Exec(tb, "RESET SLAVE ALL")
	r.Replica.Exec(tb, "SET GLOBAL read_only = OFF")
}

// gtidReached reports whether the GTID position have (a list such as
// "0-1-12,1-2-5") is at or past want in each of want's domains. Sequence
// numbers grow within a domain whatever server wrote them
// (gtid_strict_mode), so the server id is not compared.
func gtidReached(have, want string) (bool, error) {
	h, err := gtidSeqs(have)
	if err != nil {
		return false, err
	}
	w, err := gtidSeqs(want)
	if err != nil {
		return false, err
	}
	for domain, seq := range w {
		if h[domain] < seq {
			return false, nil
		}
	}
	return true, nil
}

// gtidSeqs maps each domain of a GTID position to its sequence number.
func gtidSeqs(pos string) (map[uint64]uint64, error) {
	m := map[uint64]uint64{}
	for g := range strings.SplitSeq(pos, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		f := strings.Split(g, "-")
		if len(f) != 3 {
			return nil, fmt.Errorf("GTID %q: not domain-server-sequence", g)
		}
		domain, err1 := strconv.ParseUint(f[0], 10, 32)
		seq, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("GTID %q: not domain-server-sequence", g)
		}
		m[domain] = seq
	}
	return m, nil
}
