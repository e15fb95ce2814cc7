//go:build linux

package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"seckill/internal/testenv"
)

// TestClusterOnReplicatedDatabase: scripts/cluster-up.sh with
// SECKILL_CLUSTER_DB=semisync starts a primary and a replica, each the
// process its pidfile names, the replica read-only and connected
// semi-synchronously by GTID; the instances and cluster.env get one DSN
// naming both. A sale through nginx lands on both servers; a second sale
// has the primary killed -9 and the replica promoted (cluster-up.sh
// db-failover) while it runs; a third runs on the promoted server alone.
// Every sale's check holds against the server that is primary after it,
// which holds the earlier sales' orders too; scripts/cluster-down.sh then
// leaves no process and no mariadbd on the cluster's data.
//
// The sales after the failover need an instance that moves to the first
// server of its DSN that takes writes.
func TestClusterOnReplicatedDatabase(t *testing.T) {
	began := time.Now()
	c := startCluster(t,
		"SECKILL_CLUSTER_DB=semisync",
		"SECKILL_NGINX_PURCHASE_RATE=1000000r/s", "SECKILL_NGINX_PURCHASE_BURST=1000000", "SECKILL_RATE_LIMIT=off",
		"SECKILL_WORKER_BLOCK=100ms",
	)
	up := time.Since(began)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, replica := c.dbPorts[0], c.dbPorts[1]
	dsn := func(port string) string { return "root@tcp(127.0.0.1:" + port + ")/seckill" }

	if want := "root@tcp(127.0.0.1:" + primary + ",127.0.0.1:" + replica + ")/seckill"; c.env["SECKILL_MYSQL_DSN"] != want {
		t.Errorf("cluster.env's SECKILL_MYSQL_DSN %q, want %q", c.env["SECKILL_MYSQL_DSN"], want)
	}

	// Each server runs under its recorded pid, the primary writable with
	// its replica connected semi-synchronously, the replica read-only and
	// replicating by GTID.
	dbs := map[string]*sql.DB{}
	for i, port := range c.dbPorts {
		db := openServer(t, port)
		dbs[port] = db
		name := fmt.Sprintf("mariadb-%d", i+1)
		var pidFile string
		if err := db.QueryRowContext(ctx, "SELECT @@pid_file").Scan(&pidFile); err != nil {
			t.Fatalf("%s on %s: %v", name, port, err)
		}
		b, err := os.ReadFile(pidFile)
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(c.pid(t, name)) {
			t.Errorf("%s: the server on port %s has pid %q (%v), its pidfile says %d", name, port, b, err, c.pid(t, name))
		}
	}
	if ro := globalVar(ctx, t, dbs[primary], "read_only"); ro != "0" {
		t.Errorf("the primary's read_only is %s", ro)
	}
	if ro := globalVar(ctx, t, dbs[replica], "read_only"); ro != "1" {
		t.Errorf("the replica's read_only is %s", ro)
	}
	if n := statusVar(ctx, t, dbs[primary], "Rpl_semi_sync_master_clients"); n != "1" {
		t.Errorf("the primary has %s semi-synchronous replicas, want 1", n)
	}
	status := slaveStatus(ctx, t, dbs[replica])
	if status["Slave_IO_Running"] != "Yes" || status["Slave_SQL_Running"] != "Yes" || status["Using_Gtid"] != "Slave_Pos" ||
		status["Master_Port"] != primary {
		t.Errorf("the replica's slave status: %v", status)
	}
	dbStatus(ctx, t, c, map[string]string{primary: "primary", replica: "replica"})

	// A sale on the primary; the replica catches up with all of it.
	first := sale(ctx, t, c, "before the failover", dsn(primary), nil, nil)
	waitReplicated(ctx, t, dbs[primary], dbs[replica])
	if got := countOrders(ctx, t, dbs[replica], first); got != 100 {
		t.Errorf("the replica holds %d orders of voucher %d, the primary 100", got, first)
	}

	// A sale with the primary killed -9 and the replica promoted while it
	// runs.
	var failover time.Duration
	promoted := make(chan error, 1)
	second := sale(ctx, t, c, "with db-failover midway", dsn(replica), func() {
		start := time.Now()
		out, err := c.script(ctx, "cluster-up.sh", "db-failover")
		failover = time.Since(start)
		t.Logf("cluster-up.sh db-failover (%s):\n%s", failover.Round(time.Millisecond), out)
		if err == nil && !strings.Contains(string(out), "primary: server 2 on 127.0.0.1:"+replica+" ") {
			err = fmt.Errorf("db-failover does not name server 2 on %s as the primary", replica)
		}
		promoted <- err
	}, promoted)
	if processRuns(c.pid(t, "mariadb-1")) {
		t.Errorf("the old primary (pid %d) still runs after db-failover", c.pid(t, "mariadb-1"))
	}
	if ro := globalVar(ctx, t, dbs[replica], "read_only"); ro != "0" {
		t.Errorf("the promoted server's read_only is %s", ro)
	}
	if st := slaveStatus(ctx, t, dbs[replica]); len(st) != 0 {
		t.Errorf("the promoted server still replicates: %v", st)
	}
	// The units sold after the failover were written on the promoted
	// server: its binary log ends with its own transactions.
	if pos := globalVar(ctx, t, dbs[replica], "gtid_binlog_pos"); !strings.HasPrefix(pos, "0-2-") {
		t.Errorf("the promoted server's gtid_binlog_pos is %s: it wrote none of the sale's orders itself", pos)
	}
	dbStatus(ctx, t, c, map[string]string{primary: "", replica: "primary"})

	// A sale on the promoted server alone, which holds every sale's orders.
	third := sale(ctx, t, c, "after the failover", dsn(replica), nil, nil)
	for _, v := range []int64{first, second, third} {
		if got := countOrders(ctx, t, dbs[replica], v); got != 100 {
			t.Errorf("the promoted server holds %d orders of voucher %d, want 100", got, v)
		}
	}

	// cluster-down.sh stops every process cluster-up.sh recorded, and no
	// mariadbd runs on the cluster's data.
	pidfiles, err := filepath.Glob(filepath.Join(c.dir, "run", "*.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, f := range pidfiles {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		pids[name] = c.pid(t, name)
	}
	if out, err := c.script(ctx, "cluster-down.sh"); err != nil {
		t.Fatalf("cluster-down.sh: %v\n%s", err, out)
	}
	for name, pid := range pids {
		if processRuns(pid) {
			t.Errorf("%s (pid %d) still runs after cluster-down.sh", name, pid)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, "run", "*.pid")); len(left) != 0 {
		t.Errorf("pidfiles left after cluster-down.sh: %v", left)
	}
	if left := mariadbdOn(t, c.dir); len(left) != 0 {
		t.Errorf("mariadbd still runs on %s after cluster-down.sh: pids %v", c.dir, left)
	}
	t.Logf("cluster-up.sh %s, db-failover %s, whole test %s", up.Round(time.Millisecond), failover.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// sale sells a voucher of 100 units to 300 buyers (400 purchases, 100 a
// second: the units last about a second) through nginx and checks the
// pipeline against the database server checkDSN; with midway, it runs
// after 50 purchases, about 40 units sold, and the check waits for a
// value on done. It returns the voucher's id.
func sale(ctx context.Context, t *testing.T, c *cluster, what, checkDSN string, midway func(), done <-chan error) int64 {
	t.Helper()
	var out testenv.Buffer
	summary := filepath.Join(t.TempDir(), "summary.json")
	cfg, opts, err := parseRun([]string{
		"--users", "300", "--requests", "400", "--stock", "100", "-c", "16", "--rate", "100",
		"--mysql", checkDSN, "--drain-timeout", "60s", "--json", summary,
	}, func(k string) string { return c.env[k] }, &out)
	if err != nil {
		t.Fatal(err)
	}
	if midway != nil {
		cfg.MidwayAfter = 50
		cfg.Midway = midway
		cfg.Fired = func() {
			if err := <-done; err != nil {
				t.Errorf("sale %s: %v", what, err)
			}
		}
	}
	err = execute(ctx, cfg, opts, &out)
	t.Logf("sale %s:\n%s", what, out.String())
	if err != nil {
		t.Fatalf("sale %s: %v", what, err)
	}
	s := readSummary(t, summary)
	if s.Check == nil || !s.Check.OK || s.Check.Orders != 100 || s.Outcomes["202 accepted"] != 100 {
		t.Fatalf("sale %s: check %+v, answers %v", what, s.Check, s.Outcomes)
	}
	return s.VoucherID
}

// script runs one of the cluster's scripts on its state dir.
func (c *cluster) script(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join("..", "scripts", name), args...)
	cmd.Env = append(os.Environ(), "SECKILL_CLUSTER_DIR="+c.dir)
	return cmd.CombinedOutput()
}

// dbStatus runs cluster-up.sh db-status and checks each server's role:
// "primary" or "replica", alive; "" for a server that is down.
func dbStatus(ctx context.Context, t *testing.T, c *cluster, roles map[string]string) {
	t.Helper()
	out, err := c.script(ctx, "cluster-up.sh", "db-status")
	if err != nil {
		t.Fatalf("db-status: %v\n%s", err, out)
	}
	t.Logf("db-status:\n%s", out)
	for port, role := range roles {
		want := `(?m)^` + port + `\s+\d+\s+no\s+-`
		if role != "" {
			want = `(?m)^` + port + `\s+\d+\s+yes\s+` + role + `\s`
		}
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("db-status does not show the server on %s as %q", port, role)
		}
	}
}

// openServer opens the database server on port, no database chosen.
func openServer(t *testing.T, port string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:"+port+")/?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func globalVar(ctx context.Context, t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL."+name).Scan(&v); err != nil {
		t.Fatalf("@@%s: %v", name, err)
	}
	return v
}

func statusVar(ctx context.Context, t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var k, v string
	if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&k, &v); err != nil {
		t.Fatalf("status %s: %v", name, err)
	}
	return v
}

// slaveStatus is SHOW SLAVE STATUS as column -> value; empty when the
// server replicates from no one.
func slaveStatus(ctx context.Context, t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	if rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, c := range cols {
			out[c] = vals[i].String
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitReplicated waits until the replica has applied everything the
// primary has in its binary log.
func waitReplicated(ctx context.Context, t *testing.T, primary, replica *sql.DB) {
	t.Helper()
	pos := globalVar(ctx, t, primary, "gtid_binlog_pos")
	var r int
	if err := replica.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 30)", pos).Scan(&r); err != nil || r != 0 {
		t.Fatalf("the replica did not apply the primary's %s within 30s: %d, %v", pos, r, err)
	}
}

func countOrders(ctx context.Context, t *testing.T, db *sql.DB, voucher int64) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM seckill.orders WHERE voucher_id = ?", voucher).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// mariadbdOn lists the pids of the mariadbd processes whose datadir is
// under dir.
func mariadbdOn(t *testing.T, dir string) []int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) != "mariadbd" {
			continue
		}
		for _, a := range args[1:] {
			if strings.HasPrefix(a, "--datadir="+dir+string(filepath.Separator)) {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}
