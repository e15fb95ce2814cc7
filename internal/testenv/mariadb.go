package testenv

import (
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
}

// StartMariaDB starts a dedicated MariaDB for a fault test, which cannot share
// a server it is about to kill. It is stopped on cleanup.
func StartMariaDB(tb testing.TB) *MariaDB {
	tb.Helper()
	d, err := startMariaDB(tb.TempDir())
	if err != nil {
		if isUnavailable(err) {
			unavailable(tb, err)
		}
		tb.Fatalf("start mariadb: %v", err)
	}
	tb.Cleanup(d.close)
	return d
}

func startMariaDB(dir string) (*MariaDB, error) {
	bin, err := lookBin("mariadbd")
	if err != nil {
		return nil, fmt.Errorf("%w; install mariadb-server (apt-get install mariadb-server)", err)
	}
	install, err := lookBin("mariadb-install-db")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
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
		"--skip-log-bin", "--innodb-buffer-pool-size=32M",
		// Commits reach the OS at once, so they survive kill -9 (not a power
		// cut) without an fsync each.
		"--innodb-flush-log-at-trx-commit=2",
		"--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci",
	})

	d := &MariaDB{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir}
	d.name = "mariadb"
	// A login succeeds only after crash recovery, so a restart after a kill
	// is ready with its data.
	d.run = func() (*proc, error) {
		p, err := startProc(dir, filepath.Join(dir, "mariadbd.log"), bin, args...)
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
