package fault

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"seckill/internal/auth"
	"seckill/internal/testenv"
	"seckill/internal/verify"
	schema "seckill/sql"
)

// The backup and restore drill runs the commands of docs/operating.md's
// "Backup and restore", read from the guide (its blocks marked
// <!-- doc-test: drill -->), with bash on real servers: what the guide
// says to run is what is tested.
const (
	guide        = "../../docs/operating.md"
	drillSection = "## Backup and restore"
	drillStock   = 60
	drillUsers   = 100_000
)

// drillBlocks reads the sh blocks marked <!-- doc-test: drill --> of the
// guide's section (its heading line, "## ..."), in order.
func drillBlocks(t *testing.T, section string) []string {
	t.Helper()
	b, err := os.ReadFile(guide)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+section+"\n")
	if i < 0 {
		t.Fatalf("%s has no section %q", guide, section)
	}
	text = text[i+1:]
	if j := strings.Index(text[len(section):], "\n## "); j >= 0 {
		text = text[:len(section)+j]
	}
	var blocks []string
	lines := strings.Split(text, "\n")
	for k := 0; k+1 < len(lines); k++ {
		if strings.TrimSpace(lines[k]) != "<!-- doc-test: drill -->" || lines[k+1] != "```sh" {
			continue
		}
		var body []string
		for k += 2; k < len(lines) && lines[k] != "```"; k++ {
			body = append(body, lines[k])
		}
		blocks = append(blocks, strings.Join(body, "\n")+"\n")
	}
	return blocks
}

// backupBlocks are the backup and restore blocks of the guide.
func backupBlocks(t *testing.T) (backup, restore string) {
	t.Helper()
	blocks := drillBlocks(t, drillSection)
	if len(blocks) != 2 || !strings.Contains(blocks[0], "mariadb-dump") || !strings.Contains(blocks[1], "< seckill.sql") {
		t.Fatalf("%s, %q: want two sh blocks marked <!-- doc-test: drill -->, the backup (mariadb-dump) then the restore (< seckill.sql); found %d:\n%s",
			guide, drillSection, len(blocks), strings.Join(blocks, "---\n"))
	}
	return blocks[0], blocks[1]
}

// dbVars are the guide's DB_HOST, DB_PORT, DB_USER and DB_NAME for a
// DSN: the server and database it names.
func dbVars(t *testing.T, dsn string) map[string]string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"DB_HOST": host, "DB_PORT": port, "DB_USER": cfg.User, "DB_NAME": cfg.DBName}
}

// runBlock runs a block of the guide with bash in dir, as a reader would
// (-e: the first failing command fails it), with vars set, and returns
// what it printed.
func runBlock(t *testing.T, dir, block string, vars map[string]string) string {
	t.Helper()
	out, err := blockOutput(dir, block, vars)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// blockOutput is runBlock for any goroutine: it returns the failure.
func blockOutput(dir, block string, vars map[string]string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-euo", "pipefail", "-c", block)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYSQL_") && !strings.HasPrefix(kv, "DB_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("the guide's block failed: %w\nblock:\n%s\nstdout:\n%s\nstderr:\n%s", err, block, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// orderRow is an order as the database holds it.
type orderRow struct {
	user   int64
	status string
}

// ordersIn reads the voucher's orders from the database dsn names.
func ordersIn(t *testing.T, dsn string, voucherID int64) map[int64]orderRow {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SELECT id, user_id, status FROM orders WHERE voucher_id = ?", voucherID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int64]orderRow{}
	for rows.Next() {
		var id int64
		var r orderRow
		if err := rows.Scan(&id, &r.user, &r.status); err != nil {
			t.Fatal(err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// press has buyer u press once through base and records the answer.
func (c *cluster) press(s *sale, base string, voucherID, u int64) answer {
	a := c.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, voucherID), token(c.t, u, auth.RoleUser), nil)
	s.record(u, a)
	return a
}

// cancel has each buyer cancel their order.
func (c *cluster) cancel(base string, buyers map[int64]int64) {
	c.t.Helper()
	for u, id := range buyers {
		if a := c.do("POST", fmt.Sprintf("%s/api/v1/orders/%d/cancel", base, id), token(c.t, u, auth.RoleUser), nil); a.status != http.StatusOK {
			c.t.Fatalf("buyer %d cancels order %d: %+v, want 200", u, id, a)
		}
	}
}

// waitReady waits until the instance's /readyz answers 200.
func (c *cluster) waitReady(in *instance, within time.Duration) {
	c.t.Helper()
	testenv.WaitFor(c.t, within, in.name+" /readyz 200", func() bool {
		resp, err := c.http.Get(in.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// TestBackupRestoreDrill: a priced voucher sells on two instances over
// MariaDB and Redis (some orders paid, some cancelled by their buyers,
// the rest awaiting payment). The guide's backup block dumps the database
// in the middle of the sale, which goes on and sells out; every invariant
// holds. Every instance is stopped and the backup block run again. Then
// MariaDB and Redis are killed and lost: a new MariaDB (a new datadir) and
// an empty Redis take their place. The guide's restore block restores the
// stopped dump: every order, in its state, is back. The database dropped,
// it restores the live dump: the orders written after it are lost (those
// accepted after it returned among them), nothing else; two instances
// started on the new servers rebuild the sale from the database alone,
// answer /readyz 200, every invariant holds with what was restored, Redis
// stock equals the database's, the lost orders' units sell again (one to
// a buyer whose order was lost) and not one more, and a buyer whose order
// was restored is told already_purchased with it.
func TestBackupRestoreDrill(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "mariadb-dump", "mariadb"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found (scripts/deps.sh installs it)", tool)
			}
			t.Skipf("%s not found; scripts/deps.sh installs it", tool)
		}
	}
	backup, restore := backupBlocks(t)
	started := time.Now()

	c := newCluster(t, true)
	c.withLifecycle(2 * time.Minute) // no order expires during the drill
	a, b := c.start("a", nil), c.start("b", nil)
	bases := []string{a.base, b.base}
	vid := c.createPriced(a.base, drillStock)
	s := newSale()

	// Forty buyers at once: a quarter pay, a quarter cancel (their units
	// go back on sale), the rest await payment.
	won := c.stampede(s, bases, vid, 10_000, 40)
	if len(won) != 40 {
		t.Fatalf("%d winners of 40 buyers for %d units; answers %v", len(won), drillStock, s.codes)
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": 40}, 20*time.Second)
	half, _ := split(won)
	payers, cancellers := split(half)
	c.pay(bases, payers)
	c.cancel(b.base, cancellers)

	// The shop's registered buyers: the dump spends a while on their
	// table, after the orders' and before the vouchers', while the sale
	// writes to both. Only a dump in one snapshot holds each order with
	// the stock it took.
	users := time.Now()
	if err := c.openDB().Exec("INSERT INTO users (phone, created_at, last_login_at) SELECT CONCAT('+8613', LPAD(seq, 9, '0')), NOW(3), NOW(3) FROM seq_1_to_" + strconv.Itoa(drillUsers)).Error; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d users inserted in %s", drillUsers, time.Since(users).Round(time.Millisecond))

	// Ten more units sold and written: these are in any dump taken now.
	next := int64(20_000)
	for sold := 0; sold < 10; next++ {
		if c.press(s, bases[next%2], vid, next).status == http.StatusAccepted {
			sold++
		}
	}
	c.waitStates(vid, map[string]int{"awaiting_payment": 40 - len(payers) - len(cancellers) + 10, "paid": len(payers), "cancelled": len(cancellers)}, 20*time.Second)
	before := ordersIn(t, c.dsn, vid)

	// The backup, while buyers keep coming: at most ten more units while
	// it runs, then the rest once it returned.
	liveDir, stoppedDir := t.TempDir(), t.TempDir()
	vars := dbVars(t, c.dsn)
	dumpStart := time.Now()
	dumped := make(chan struct{})
	var dumpErr error
	go func() {
		defer close(dumped)
		_, dumpErr = blockOutput(liveDir, backup, vars)
	}()
	during := 0
	for running := true; running; {
		select {
		case <-dumped:
			running = false
			continue
		case <-time.After(20 * time.Millisecond):
		}
		if during < 10 {
			if c.press(s, bases[next%2], vid, next).status == http.StatusAccepted {
				during++
			}
			next++
		}
	}
	if dumpErr != nil {
		t.Fatal(dumpErr)
	}
	t.Logf("the live dump took %s; %d orders accepted while it ran", time.Since(dumpStart).Round(time.Millisecond), during)
	afterDump := map[int64]bool{}
	for soldOut := false; !soldOut; next++ {
		switch p := c.press(s, bases[next%2], vid, next); {
		case p.status == http.StatusAccepted:
			afterDump[p.order] = true
		case p.code == "sold_out":
			soldOut = true
		}
	}
	if len(afterDump) == 0 {
		t.Fatalf("no order accepted after the dump returned (%d during it)", during)
	}
	rep := c.quiesce(s, vid, 30*time.Second)
	if rep.Live != drillStock || rep.DBStock != 0 {
		t.Fatalf("before the disaster: %s; want %d live orders, none left", rep, drillStock)
	}
	original := ordersIn(t, c.dsn, vid)

	// Every instance stopped, the backup again: nothing moves now.
	for _, in := range []*instance{a, b} {
		if code := in.signal(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("%s exited %d on SIGTERM", in.name, code)
		}
	}
	runBlock(t, stoppedDir, backup, vars)

	// The disaster: the database server and Redis are lost.
	c.maria.Kill(t)
	c.redis.Kill(t)
	fresh := testenv.StartMariaDB(t)
	dsn := fresh.DSN(vars["DB_NAME"])
	freshVars := dbVars(t, dsn)

	// The stopped dump gives back every order, in its state.
	runBlock(t, stoppedDir, restore, freshVars)
	if got := ordersIn(t, dsn, vid); !sameOrders(got, original) {
		t.Fatalf("the stopped dump restored %d orders, not the %d the database held (or not in their states)", len(got), len(original))
	}
	root, err := sql.Open("mysql", fresh.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Exec("DROP DATABASE `" + vars["DB_NAME"] + "`"); err != nil {
		t.Fatal(err)
	}

	// The live dump loses the orders written after it: those accepted
	// after it returned among them, none written before it started.
	out := runBlock(t, liveDir, restore, freshVars)
	if latest, _ := schema.Latest("mysql"); !strings.Contains(out, fmt.Sprintf("schema_version\n%d\n", latest)) {
		t.Fatalf("the restore printed %q; want schema_version %d", out, latest)
	}
	restored := ordersIn(t, dsn, vid)
	lost := map[int64]orderRow{}
	for id, o := range original {
		r, ok := restored[id]
		switch {
		case !ok:
			lost[id] = o
		case r.user != o.user:
			t.Fatalf("order %d restored for user %d, was user %d's", id, r.user, o.user)
		}
	}
	for id := range before {
		if _, ok := restored[id]; !ok {
			t.Fatalf("order %d, written before the dump started, is not restored", id)
		}
	}
	for id := range afterDump {
		if _, ok := restored[id]; ok {
			t.Fatalf("order %d, accepted after the dump returned, is restored", id)
		}
	}
	if len(restored)+len(lost) != len(original) || len(lost) < len(afterDump) {
		t.Fatalf("%d orders restored and %d lost of %d; %d accepted after the dump", len(restored), len(lost), len(original), len(afterDump))
	}

	// The service on the new servers: it rebuilds the sale from the
	// database alone.
	c.maria, c.dsn, c.db = fresh, dsn, nil
	c.redis = testenv.StartRedis(t, testenv.RedisOptions{AppendOnly: true})
	old := c.rdb
	c.rdb = redis.NewClient(&redis.Options{Addr: c.redis.Addr, MaxRetries: 0, DialTimeout: time.Second})
	old.Close()
	c.env = settings(c.redis.URL(), c.dsn)
	c.withLifecycle(2 * time.Minute)
	a2, b2 := c.start("a2", nil), c.start("b2", nil)
	bases = []string{a2.base, b2.base}
	c.waitReady(a2, 20*time.Second)
	c.waitReady(b2, 20*time.Second)
	c.waitOnSale(bases, vid, len(lost), 20*time.Second)

	// What buyers were told, as far as the restored database remembers:
	// the lost orders' buyers hold nothing now.
	s2 := newSale()
	for id, u := range s.accepted {
		if _, ok := restored[id]; ok {
			s2.accepted[id], s2.won[u] = u, true
		}
	}
	for u := range s.refused {
		s2.refused[u] = true
	}
	for u := range s.unsure {
		s2.unsure[u] = true
	}
	rep = c.quiesce(s2, vid, 20*time.Second)
	if rep.RedisStock != int64(rep.DBStock) || rep.DBStock != len(lost) {
		t.Fatalf("after the restore: %s; want Redis's stock = the database's = %d lost orders", rep, len(lost))
	}

	// A buyer whose order was lost buys again; one whose order was
	// restored is told so; new buyers take the rest and no more.
	var lostBuyer, keptBuyer, keptOrder int64
	for _, o := range lost {
		lostBuyer = o.user
	}
	for id, o := range restored {
		if o.status == verify.AwaitingPayment {
			keptBuyer, keptOrder = o.user, id
		}
	}
	if p := c.press(s2, a2.base, vid, lostBuyer); p.status != http.StatusAccepted {
		t.Fatalf("buyer %d, whose order was lost, buys again: %+v, want 202", lostBuyer, p)
	}
	if p := c.press(s2, b2.base, vid, keptBuyer); p.code != "already_purchased" || p.order != keptOrder {
		t.Fatalf("buyer %d, whose order %d was restored, buys again: %+v, want already_purchased with it", keptBuyer, keptOrder, p)
	}
	s2.mu.Lock()
	s2.codes = map[string]int{}
	s2.mu.Unlock()
	newWon := c.stampede(s2, bases, vid, 40_000, len(lost)-1+20)
	if len(newWon) != len(lost)-1 || s2.codes["sold_out"] != 20 {
		t.Fatalf("%d new buyers won the %d units left, %v; want every unit sold and 20 sold_out", len(newWon), len(lost)-1, s2.codes)
	}
	rep = c.quiesce(s2, vid, 30*time.Second)
	if rep.Live != drillStock || rep.DBStock != 0 || rep.RedisStock != 0 || rep.DeadLetters != 0 {
		t.Fatalf("after the restore's sale: %s; want %d live orders, no stock, no dead letters", rep, drillStock)
	}
	report(t, fmt.Sprintf("a live dump mid-sale (%d orders written after it lost, %d of them accepted after it returned), Redis and MariaDB lost, the dump restored into a new MariaDB beside an empty Redis; the stopped dump restored all %d orders; drill took %s",
		len(lost), len(afterDump), len(original), time.Since(started).Round(100*time.Millisecond)), s2, rep)
}

// sameOrders reports whether two readings hold the same orders, each for
// the same buyer in the same state.
func sameOrders(a, b map[int64]orderRow) bool {
	if len(a) != len(b) {
		return false
	}
	for id, o := range a {
		if b[id] != o {
			return false
		}
	}
	return true
}
