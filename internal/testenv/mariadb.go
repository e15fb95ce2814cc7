package testenv

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDB is a mariadbd owned by one test, which may kill, pause and restart
// it to see how the code under test copes.
type MariaDB struct {
	Addr string // 127.0.0.1:port
	Dir  string // holds data/ (with the socket), mariadbd.log and install.log
	server

	admin *sql.DB // Exec, Var and this package's waits; nil on the shared server
}

// MariaDBOptions configures a dedicated MariaDB. The zero value is the
// server StartMariaDB starts: no binary log, writable.
type MariaDBOptions struct {
	// ServerID is server_id; 0 leaves the server's default (1). Servers that
	// replicate from each other need different ones.
	ServerID int
	// LogBin turns on the binary log with GTIDs, as a primary, or a replica
	// that may be promoted, needs it: log_bin, binlog_format=ROW,
	// log_slave_updates=ON (a promoted replica's binlog holds what it
	// replicated), gtid_strict_mode=ON and sync_binlog=1 (the binlog is
	// flushed before a commit returns, which semi-sync's AFTER_SYNC counts
	// on).
	LogBin bool
	// SemiSync turns on both sides of semi-synchronous replication, so that
	// either side can be promoted: rpl_semi_sync_master_enabled (a commit
	// waits for a replica's acknowledgement, with
	// rpl_semi_sync_master_wait_point=AFTER_SYNC: after the binlog write,
	// before the engine commit) and rpl_semi_sync_slave_enabled (this
	// server acknowledges what it receives). It needs LogBin.
	//
	// A replica must not keep the master side on while it replicates: with
	// log_slave_updates its applier writes its own binlog and waits, for
	// SemiSyncTimeout, for an acknowledgement from replicas of its own,
	// which it has none of (seen: "Waiting for semi-sync ACK from slave",
	// then "Timeout waiting for reply of binlog"). StartReplication turns it
	// off on its replica.
	SemiSync bool
	// SemiSyncTimeout is rpl_semi_sync_master_timeout: how long a commit
	// waits for an acknowledgement before the primary falls back to
	// asynchronous replication. 10 s by default, MariaDB's default.
	SemiSyncTimeout time.Duration
	// ReadOnly sets read_only=ON. Users with the READ ONLY ADMIN privilege,
	// which root holds (ALL PRIVILEGES), write all the same: a test that
	// wants writes refused connects as a user of its own.
	ReadOnly bool
	// ExtraArgs are appended to the mariadbd command line; a later option
	// wins over an earlier one.
	ExtraArgs []string
}

// StartMariaDB starts a dedicated MariaDB for a fault test, which cannot share
// a server it is about to kill. It is stopped on cleanup.
func StartMariaDB(tb testing.TB) *MariaDB {
	tb.Helper()
	return StartMariaDBWith(tb, MariaDBOptions{})
}

// StartMariaDBWith starts a dedicated MariaDB configured by opt. It is
// stopped on cleanup.
func StartMariaDBWith(tb testing.TB, opt MariaDBOptions) *MariaDB {
	tb.Helper()
	return startMariaDBFor(tb, tb.TempDir(), 0, opt, nil)
}

// startMariaDBFor starts a dedicated MariaDB in dir on port (0 for a free
// one), stopped on cleanup; once are options of its first start only, not
// of a Restart.
func startMariaDBFor(tb testing.TB, dir string, port int, opt MariaDBOptions, once []string) *MariaDB {
	tb.Helper()
	if opt.SemiSync && !opt.LogBin {
		tb.Fatal("start mariadb: SemiSync needs LogBin: semi-synchronous replication waits on the binary log")
	}
	d, err := startMariaDB(dir, port, opt, once)
	if err != nil {
		if isUnavailable(err) {
			unavailable(tb, err)
		}
		tb.Fatalf("start mariadb: %v", err)
	}
	tb.Cleanup(d.close)
	if d.admin, err = sql.Open("mysql", d.DSN("")); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = d.admin.Close() })
	return d
}

func startMariaDB(dir string, port int, opt MariaDBOptions, once []string) (*MariaDB, error) {
	bin, err := lookBin("mariadbd")
	if err != nil {
		return nil, fmt.Errorf("%w; install mariadb-server (apt-get install mariadb-server)", err)
	}
	install, err := lookBin("mariadb-install-db")
	if err != nil {
		return nil, err
	}
	if port == 0 {
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	// Temporary files in a directory of its own: servers sharing /tmp have
	// had the installer fail on a temporary table another one removed.
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	// --no-defaults must come first; it keeps the machine's /etc/mysql out.
	common := []string{
		"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--tmpdir=" + tmp, "--skip-name-resolve",
		"--innodb-log-file-size=8M", // the installer's default is 96M, slow to write
	}
	if os.Geteuid() == 0 {
		common = append(common, "--user=root") // mariadbd refuses to run as root otherwise
	}
	// A root that logs in over TCP without a password; the default, "socket",
	// only lets the unix user root in through the socket.
	if err := installMariaDB(dir, install, slices.Concat(common, []string{
		"--auth-root-authentication-method=normal", "--skip-test-db",
	})); err != nil {
		return nil, err
	}
	args := slices.Concat(common, []string{
		"--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
		// Relative to the datadir, where mariadbd runs: an absolute path under
		// a deep temp dir can exceed the 108-byte limit on socket paths.
		"--socket=mysqld.sock",
		"--pid-file=" + filepath.Join(dir, "mariadbd.pid"),
		"--innodb-buffer-pool-size=32M",
		// Commits reach the OS at once, so they survive kill -9 (not a power
		// cut) without an fsync each.
		"--innodb-flush-log-at-trx-commit=2",
		"--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
	}, opt.args())

	d := &MariaDB{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir}
	d.name = "mariadb"
	// A login succeeds only after crash recovery, so a restart after a kill
	// is ready with its data.
	d.run = func() (*proc, error) {
		p, err := startProc(dir, filepath.Join(dir, "mariadbd.log"), bin, slices.Concat(args, once)...)
		once = nil
		if err != nil {
			return nil, err
		}
		db, err := sql.Open("mysql", d.DSN(""))
		if err != nil {
			return nil, err
		}
		defer db.Close()
		if err := p.waitReady(30*time.Second, db.PingContext); err != nil {
			_ = p.stop(syscall.SIGKILL, time.Second)
			return nil, err
		}
		return p, nil
	}
	if d.proc, err = d.run(); err != nil {
		return nil, err
	}
	return d, nil
}

// args are the mariadbd options opt stands for.
func (opt MariaDBOptions) args() []string {
	var a []string
	if opt.ServerID != 0 {
		a = append(a, "--server-id="+strconv.Itoa(opt.ServerID))
	}
	if opt.LogBin {
		// Names relative to the datadir, like the socket's; the relay log's
		// default would carry the host name.
		a = append(a, "--log-bin=binlog", "--relay-log=relay", "--binlog-format=ROW",
			"--log-slave-updates=ON", "--gtid-strict-mode=ON", "--sync-binlog=1")
	} else {
		a = append(a, "--skip-log-bin")
	}
	if opt.SemiSync {
		timeout := cmp.Or(opt.SemiSyncTimeout, 10*time.Second)
		a = append(a, "--rpl-semi-sync-master-enabled=ON", "--rpl-semi-sync-slave-enabled=ON",
			"--rpl-semi-sync-master-wait-point=AFTER_SYNC",
			"--rpl-semi-sync-master-timeout="+strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	if opt.ReadOnly {
		a = append(a, "--read-only=ON")
	}
	return append(a, opt.ExtraArgs...)
}

// installMariaDB creates the system tables. It runs as a proc so that an
// interrupt in the middle also stops it.
func installMariaDB(dir, bin string, args []string) error {
	err := installOnce(dir, bin, args)
	if err != nil {
		// Seen once under heavy load on a shared machine: the installer
		// failed without a word in its log. A second try on a clean datadir
		// costs a second; a flaky suite costs much more.
		_ = os.RemoveAll(filepath.Join(dir, "data"))
		if err2 := installOnce(dir, bin, args); err2 != nil {
			return errors.Join(err, err2)
		}
	}
	return nil
}

func installOnce(dir, bin string, args []string) error {
	log := filepath.Join(dir, "install.log")
	p, err := startProc(dir, log, bin, args...)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		_ = p.stop(syscall.SIGKILL, time.Second)
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("mariadb-install-db: %v\nlog tail:\n%s", p.cmd.ProcessState, tail(log))
	}
	return nil
}

// DSN returns a go-sql-driver DSN for database db ("" for none) as root.
func (d *MariaDB) DSN(db string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = d.Addr
	return withDB(cfg, db)
}

// CreateDatabase creates a fresh database named after the test and returns
// its DSN. It is not dropped: the whole server goes away on cleanup.
func (d *MariaDB) CreateDatabase(tb testing.TB) string {
	tb.Helper()
	name := Prefix(tb)
	if err := createDatabase(d.DSN(""), name); err != nil {
		tb.Fatal(err)
	}
	return d.DSN(name)
}

// Exec runs query as root on a connection of the server's pool (so a
// session setting does not carry over to the next call), and fails the
// test on an error or after 30 s.
func (d *MariaDB) Exec(tb testing.TB, query string, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.exec(ctx, query, args...); err != nil {
		tb.Fatal(err)
	}
}

// Var returns the global status variable name (SHOW GLOBAL STATUS:
// Rpl_semi_sync_master_clients, wsrep_cluster_size) or, when there is no
// status variable of that name, the global system variable
// (gtid_binlog_pos, read_only), as the server prints it: "ON", "OFF", a
// number, a GTID list. The name is case-insensitive. It fails the test when
// neither exists.
func (d *MariaDB) Var(tb testing.TB, name string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := d.value(ctx, name)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

func (d *MariaDB) exec(ctx context.Context, query string, args ...any) error {
	if _, err := d.admin.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("%s on %s: %w", query, d.Addr, err)
	}
	return nil
}

// value reads a status or system variable with SHOW ... WHERE, the name
// passed as an argument, not spliced into the statement; a Galera node
// answers it in any state, non-Primary included.
func (d *MariaDB) value(ctx context.Context, name string) (string, error) {
	for _, show := range []string{"SHOW GLOBAL STATUS", "SHOW GLOBAL VARIABLES"} {
		var n, v sql.NullString
		err := d.admin.QueryRowContext(ctx, show+" WHERE Variable_name = ?", name).Scan(&n, &v)
		switch {
		case err == nil:
			return v.String, nil
		case !errors.Is(err, sql.ErrNoRows):
			return "", fmt.Errorf("%s %s on %s: %w", show, name, d.Addr, err)
		}
	}
	return "", fmt.Errorf("%s: no status or system variable of that name on %s", name, d.Addr)
}

// row runs a query that returns at most one row (SHOW SLAVE STATUS) and
// returns its columns by name; no row gives an empty map.
func (d *MariaDB) row(ctx context.Context, query string) (map[string]string, error) {
	rows, err := d.admin.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", query, d.Addr, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", query, d.Addr, err)
	}
	m := map[string]string{}
	if rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("%s on %s: %w", query, d.Addr, err)
		}
		for i, c := range cols {
			m[c] = vals[i].String
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s on %s: %w", query, d.Addr, err)
	}
	return m, nil
}
