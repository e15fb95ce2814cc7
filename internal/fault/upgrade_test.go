package fault

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/auth"
	"seckill/internal/fleet"
	"seckill/internal/testenv"
	schema "seckill/sql"
)

// upgradeSection is the guide's section the upgrade test follows.
const upgradeSection = "## Upgrades and migrations"

// migrateTo applies the migrations up to version by hand and records
// them, as the release that knew no more left the database.
func migrateTo(t *testing.T, g *gorm.DB, version int) {
	t.Helper()
	ms, err := schema.Migrations("mysql")
	if err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if err := g.Exec(q, args...).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("CREATE TABLE schema_migrations (version INT NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL, applied_at DATETIME(3) NOT NULL)")
	for _, m := range ms {
		if m.Version > version {
			break
		}
		var stmt strings.Builder
		for line := range strings.Lines(m.SQL) {
			if l := strings.TrimSpace(line); l == "" || strings.HasPrefix(l, "--") {
				continue
			}
			stmt.WriteString(line)
			if strings.HasSuffix(strings.TrimSpace(line), ";") {
				exec(strings.TrimSuffix(strings.TrimSpace(stmt.String()), ";"))
				stmt.Reset()
			}
		}
		exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, NOW(3))", m.Version, m.Name)
	}
}

// runOnce runs the service binary with the cluster's settings and args
// until it exits (within 30s) and returns its exit code, its stdout and
// all it printed.
func (c *cluster) runOnce(extra map[string]string, args ...string) (code int, stdout, all string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Binary(c.t, "seckill/cmd/api"), args...)
	cmd.Env = os.Environ()
	for k, v := range c.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "SECKILL_ADDR=127.0.0.1:"+testenv.FreePort(c.t))
	for k, v := range extra {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var so bytes.Buffer
	out := &testenv.Buffer{} // written by both of cmd's copying goroutines
	cmd.Stdout, cmd.Stderr = io.MultiWriter(out, &so), out
	err := cmd.Run()
	if ctx.Err() != nil {
		c.t.Fatalf("api %s did not exit within 30s; output:\n%s", strings.Join(args, " "), out.String())
	}
	if err != nil && cmd.ProcessState == nil {
		c.t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), so.String(), out.String()
}

// readyStatus is the instance's /readyz status code, 0 when it does not
// answer.
func (c *cluster) readyStatus(in *instance) int {
	resp, err := c.http.Get(in.base + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// buyers press, each new buyer once, through the instances in rotation,
// until stopped.
type buyers struct {
	c     *cluster
	s     *sale
	vid   int64
	mu    sync.Mutex
	bases []string
	next  int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func (c *cluster) startBuyers(s *sale, vid int64, bases ...string) *buyers {
	b := &buyers{c: c, s: s, vid: vid, bases: bases, next: 100_000, stop: make(chan struct{})}
	for range 4 {
		b.wg.Add(1)
		go b.run()
	}
	return b
}

func (b *buyers) run() {
	defer b.wg.Done()
	for {
		select {
		case <-b.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
		b.mu.Lock()
		u, base := b.next, b.bases[int(b.next)%len(b.bases)]
		b.next++
		b.mu.Unlock()
		b.s.record(u, b.c.do("POST", fmt.Sprintf("%s/api/v1/vouchers/%d/orders", base, b.vid), token(b.c.t, u, auth.RoleUser), nil))
	}
}

// route sends the next purchases to bases.
func (b *buyers) route(bases ...string) {
	b.mu.Lock()
	b.bases = bases
	b.mu.Unlock()
}

// accepted counts the purchases accepted so far.
func (b *buyers) accepted() int {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	return b.s.codes["accepted"]
}

func (b *buyers) halt() { close(b.stop); b.wg.Wait() }

// TestUpgrade follows docs/operating.md's "Upgrades and migrations" on
// real servers, with the binary built from this tree standing in for
// each release (no second version is built):
//
//   - the database of the release before (every migration but the last):
//     api migrate applies the last one and prints it;
//   - a release without a migration, rolled one instance at a time under
//     a sale (SIGTERM, the new process in its place, its /readyz 200,
//     then the next): no accepted order lost, every invariant holds;
//   - a newer release's migration (a row for the next version in
//     schema_migrations): the running instances answer /readyz 503 and
//     log migrations "newer", yet keep selling and writing; this build
//     refuses to start on it, as an API instance or a worker, and its
//     api migrate refuses too, each naming both versions.
func TestUpgrade(t *testing.T) {
	t.Parallel()
	c := newCluster(t, true)
	latest, err := schema.Latest("mysql")
	if err != nil {
		t.Fatal(err)
	}

	// The previous release's database; the guide's block migrates it,
	// "api" being this tree's binary, with the instances' settings.
	blocks := drillBlocks(t, upgradeSection)
	if len(blocks) != 1 || !strings.Contains(blocks[0], "api migrate") {
		t.Fatalf("%s, %q: want one sh block marked <!-- doc-test: drill -->, with api migrate; found %d", guide, upgradeSection, len(blocks))
	}
	migrateTo(t, c.openDB(), latest-1)
	vars := map[string]string{"DOC_TEST_API": testenv.Binary(t, "seckill/cmd/api")}
	for k, v := range c.env {
		vars[k] = v
	}
	block := `api() { "$DOC_TEST_API" "$@"; }` + "\n" + blocks[0]

	// While an instance of the previous release is listed as running,
	// neither api migrate nor a new instance migrates.
	ctx := context.Background()
	if err := c.rdb.HSet(ctx, fleet.Key(c.prefix), "old-host-1", fmt.Sprintf("schema=%d until=%d", latest-1, time.Now().Add(time.Minute).UnixMilli())).Err(); err != nil {
		t.Fatal(err)
	}
	refusal := fmt.Sprintf("migrating the database to schema version %d refused: 1 instance(s) built for an older schema still run: old-host-1 (schema %d)", latest, latest-1)
	if _, err := blockOutput(t.TempDir(), block, vars); err == nil || !strings.Contains(err.Error(), refusal) {
		t.Fatalf("api migrate while an older instance runs: %v; want it to fail saying %q", err, refusal)
	}
	if code, _, out := c.runOnce(nil); code != 1 || !strings.Contains(out, refusal) {
		t.Fatalf("an instance started while an older one runs: exit %d, output:\n%s\nwant exit 1 saying %q", code, tailLines(out, 10), refusal)
	}
	if v, err := schema.Current(ctx, c.openDB()); err != nil || v != latest-1 {
		t.Fatalf("schema version %d (%v) after the refusals; want %d, nothing applied", v, err, latest-1)
	}
	if err := c.rdb.HDel(ctx, fleet.Key(c.prefix), "old-host-1").Err(); err != nil {
		t.Fatal(err)
	}
	stdout := runBlock(t, t.TempDir(), block, vars)
	var migrated struct {
		Applied       []int `json:"applied"`
		SchemaVersion int   `json:"schema_version"`
	}
	if json.Unmarshal([]byte(stdout), &migrated) != nil || !slices.Equal(migrated.Applied, []int{latest}) || migrated.SchemaVersion != latest {
		t.Fatalf("api migrate on the database of version %d printed:\n%s\nwant applied [%d], schema_version %d", latest-1, stdout, latest, latest)
	}

	// A release without a migration, rolled one instance at a time.
	a, b := c.start("a", nil), c.start("b", nil)
	vid := c.createVoucher(a.base, 100_000)
	s := newSale()
	buy := c.startBuyers(s, vid, a.base, b.base)
	testenv.WaitFor(t, 10*time.Second, "purchases accepted", func() bool { return buy.accepted() > 20 })
	rolled := []*instance{}
	for _, old := range []*instance{a, b} {
		if code := old.signal(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("%s exited %d on SIGTERM", old.name, code)
		}
		n := c.start(old.name+"2", nil)
		c.waitReady(n, 20*time.Second)
		rolled = append(rolled, n)
		other := b
		if old == b {
			other = rolled[0]
		}
		buy.route(n.base, other.base)
		before := buy.accepted()
		testenv.WaitFor(t, 10*time.Second, "purchases accepted after "+old.name+" was replaced", func() bool { return buy.accepted() > before+20 })
	}
	buy.halt()
	// The stopped instances took their entries with them.
	if running, err := fleet.Running(ctx, c.rdb, c.prefix, time.Now()); err != nil || len(running) != 2 || len(fleet.Older(running, latest)) != 0 {
		t.Fatalf("running instances after the rolling restart: %+v (%v); want the two new ones, of schema %d", running, err, latest)
	}
	rep := c.quiesce(s, vid, 30*time.Second)
	report(t, "a rolling restart of both instances under a sale", s, rep)

	// A newer release migrates the database.
	a2, b2 := rolled[0], rolled[1]
	if err := c.openDB().Exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, NOW(3))", latest+1, fmt.Sprintf("%04d_next_release.sql", latest+1)).Error; err != nil {
		t.Fatal(err)
	}
	for _, in := range []*instance{a2, b2} {
		testenv.WaitFor(t, 10*time.Second, in.name+" /readyz 503 on the newer schema", func() bool { return c.readyStatus(in) == http.StatusServiceUnavailable })
		says := fmt.Sprintf("database schema version %d, this build's %d", latest+1, latest)
		testenv.WaitFor(t, 5*time.Second, in.name+" logs migrations newer", func() bool {
			return strings.Contains(in.log.String(), `"migrations":"newer"`) && strings.Contains(in.log.String(), says)
		})
	}
	// They keep selling, and their workers writing: readiness takes them
	// out of an orchestrator's rotation, not out of nginx's.
	more := c.press(s, a2.base, vid, 900_001)
	if more.status != http.StatusAccepted {
		t.Fatalf("a purchase through %s on the newer schema: %+v", a2.name, more)
	}
	testenv.WaitFor(t, 10*time.Second, "the order written on the newer schema", func() bool {
		var n int64
		return c.openDB().Raw("SELECT COUNT(*) FROM orders WHERE id = ?", more.order).Scan(&n).Error == nil && n == 1
	})

	// This build, now the old release, refuses to start on it.
	want := fmt.Sprintf("the database has migration %d applied, this build knows migrations up to %d", latest+1, latest)
	for _, run := range []struct {
		what  string
		extra map[string]string
		args  []string
	}{
		{"an API instance", nil, nil},
		{"a worker", map[string]string{"SECKILL_ROLE": "worker"}, nil},
		{"api migrate", nil, []string{"migrate"}},
	} {
		code, _, out := c.runOnce(run.extra, run.args...)
		if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "run that release") {
			t.Errorf("%s on the newer schema: exit %d, output:\n%s\nwant exit 1 saying %q", run.what, code, tailLines(out, 10), want)
		}
	}

	// Undone, the instances are ready again and the sale is whole.
	if err := c.openDB().Exec("DELETE FROM schema_migrations WHERE version = ?", latest+1).Error; err != nil {
		t.Fatal(err)
	}
	c.waitReady(a2, 10*time.Second)
	c.waitReady(b2, 10*time.Second)
	c.quiesce(s, vid, 30*time.Second)
}
