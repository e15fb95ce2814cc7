package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// galeraProvider is where Debian's galera-4 package puts the provider.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// galeraTimeouts shorten how long the group waits before it drops a node
// that stopped answering (killed, paused, cut off). Measured on a 2-core
// machine, from kill -9 to WaitSize seeing the two others Synced at size
// 2: 5.0 to 6.2 s with Galera's defaults (evs.suspect_timeout, 5 s, plus
// the view change), 1.8 to 2.0 s with these (suspect_timeout 1.5 s; 1 s,
// tried by hand, gave 1.1 s). A node merely silent for longer than the suspect timeout
// (a starved CPU) is dropped too, and rejoins by IST: much shorter would
// make flaky tests.
//
//	evs.suspect_timeout        PT5S   -> PT1.5S  silence before a node is suspected; all others suspecting it drop it
//	evs.inactive_timeout       PT15S  -> PT3S    silence before a node is dropped whatever the others say
//	evs.install_timeout        PT7.5S -> PT3S    how long a view installation may take
//	evs.keepalive_period       PT1S   -> PT0.3S  an idle node's heartbeat, several per suspect timeout
//	evs.inactive_check_period  PT0.5S -> PT0.3S  how often silence is checked
//	evs.join_retrans_period    PT1S   -> PT0.3S  resend of join messages while a new view forms
const galeraTimeouts = "evs.suspect_timeout=PT1.5S;evs.inactive_timeout=PT3S;evs.install_timeout=PT3S;" +
	"evs.keepalive_period=PT0.3S;evs.inactive_check_period=PT0.3S;evs.join_retrans_period=PT0.3S"

// Galera is a MariaDB Galera cluster on loopback owned by one test, which
// may kill, pause and restart its nodes. A restarted node rejoins the
// cluster (by state transfer, as a killed node has no saved position);
// WaitSize waits for it.
type Galera struct {
	Nodes []*MariaDB
}

// StartGalera starts a cluster of n nodes and returns once every node
// reports wsrep_local_state_comment = Synced in a primary component of n.
// Node 0 bootstraps the cluster (--wsrep-new-cluster, on its first start
// only); the others join one at a time, each receiving a state snapshot
// from a synced node. Every node is killed on cleanup.
//
// The snapshot is taken by mysqldump into the joiner's SQL port
// (wsrep_sst_method=mysqldump, as root without a password): rsync, the
// default, fails when mariadbd runs as root, since its rsync daemon drops
// to nobody and cannot write the data directory.
func StartGalera(tb testing.TB, n int) *Galera {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("start galera: %d nodes", n)
	}
	if _, err := os.Stat(galeraProvider); err != nil {
		unavailable(tb, fmt.Errorf("%w: %v; install galera-4 (apt-get install galera-4)", errUnavailable, err))
	}
	for _, bin := range []string{"wsrep_sst_mysqldump", "mariadb", "mariadb-dump"} {
		if _, err := lookBin(bin); err != nil {
			unavailable(tb, fmt.Errorf("%w; the mysqldump state transfer runs it (apt-get install mariadb-server mariadb-client)", err))
		}
	}
	// A node can fail to start when a port chosen for it was taken by a
	// parallel test meanwhile (the ports are chosen before the first node
	// starts, the last node starts seconds later): the whole cluster is
	// started again on new ports, once.
	var errs []error
	for range 2 {
		g, err := startGalera(tb, n)
		if err == nil {
			return g
		}
		errs = append(errs, err)
	}
	tb.Fatalf("start galera: %v", errors.Join(errs...))
	return nil
}

// startGalera starts n nodes on fresh ports and waits until they are one
// cluster; a node that does not start stops the others it started and is
// the error.
func startGalera(tb testing.TB, n int) (*Galera, error) {
	tb.Helper()
	// Every node's ports are chosen first: each names all the others.
	type ports struct{ sql, group, ist int }
	p := make([]ports, n)
	taken := map[int]bool{}
	for i := range p {
		for _, port := range []*int{&p[i].sql, &p[i].group, &p[i].ist} {
			for *port == 0 || taken[*port] {
				var err error
				if *port, err = freePort(); err != nil {
					return nil, err
				}
			}
			taken[*port] = true
		}
	}
	peers := make([]string, n)
	for i := range p {
		peers[i] = "127.0.0.1:" + strconv.Itoa(p[i].group)
	}

	g := &Galera{}
	for i := range p {
		addr := "127.0.0.1:" + strconv.Itoa(p[i].sql)
		provider := fmt.Sprintf("base_port=%d;gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;"+
			"gcache.size=16M;%s", p[i].group, p[i].group, p[i].ist, galeraTimeouts)
		opt := MariaDBOptions{ExtraArgs: []string{
			"--wsrep-on=ON", "--wsrep-provider=" + galeraProvider,
			"--wsrep-cluster-name=testenv-" + strconv.Itoa(p[0].group), // no two live clusters share it
			"--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
			"--wsrep-node-name=node" + strconv.Itoa(i),
			"--wsrep-node-address=127.0.0.1",
			"--wsrep-node-incoming-address=" + addr,
			"--wsrep-provider-options=" + provider,
			"--wsrep-sst-method=mysqldump", "--wsrep-sst-auth=root:", "--wsrep-sst-receive-address=" + addr,
			// What Galera requires of the server.
			"--binlog-format=ROW", "--default-storage-engine=InnoDB", "--innodb-autoinc-lock-mode=2",
		}}
		var once []string
		if i == 0 {
			once = []string{"--wsrep-new-cluster"}
		}
		d, err := startMariaDB(tb.TempDir(), p[i].sql, opt, once)
		if err != nil {
			for _, started := range g.Nodes {
				started.close()
			}
			if isUnavailable(err) {
				unavailable(tb, err)
			}
			return nil, fmt.Errorf("node %d: %w", i, err)
		}
		tb.Cleanup(d.close)
		if d.admin, err = sql.Open("mysql", d.DSN("")); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = d.admin.Close() })
		g.Nodes = append(g.Nodes, d)
		// mariadbd answers a ping before the joiner has its snapshot: wait
		// for Synced before the next one joins, one transfer at a time. A
		// joiner whose state transfer failed exits: the cluster is
		// started again.
		if err := waitSynced(d, i+1, time.Minute); err != nil {
			for _, started := range g.Nodes {
				started.close()
			}
			return nil, fmt.Errorf("node %d (%s): %w", i, d.Addr, err)
		}
	}
	g.WaitSize(tb, n, time.Minute)
	return g, nil
}

// waitSynced waits until d is Synced in a primary component of n nodes;
// an error when its process exits first (with its log's tail) or when
// within passes.
func waitSynced(d *MariaDB, n int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := nodeSynced(ctx, d, n)
		cancel()
		if err == nil {
			return nil
		}
		d.mu.Lock()
		p := d.proc
		d.mu.Unlock()
		if p.exited() {
			return fmt.Errorf("exited before it synced (%v)\nlog tail:\n%s", p.cmd.ProcessState, tail(p.log))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not synced within %s: %w\nlog tail:\n%s", within, err, tail(p.log))
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not a wait for an event
	}
}

// WaitSize waits until every live node (not killed, not paused) is Synced
// in a primary component of n nodes: after a kill, the survivors have
// dropped the dead node; after a restart, the node is back.
func (g *Galera) WaitSize(tb testing.TB, n int, within time.Duration) {
	tb.Helper()
	poll(tb, within, fmt.Sprintf("every live galera node synced in a primary component of %d", n), func(ctx context.Context) error {
		live := 0
		for _, d := range g.Nodes {
			if !d.live() {
				continue
			}
			live++
			if err := nodeSynced(ctx, d, n); err != nil {
				return err
			}
		}
		if live == 0 {
			return fmt.Errorf("no live node")
		}
		return nil
	})
}

// nodeSynced checks that d is ready for clients, Synced, and in a primary
// component of n nodes.
func nodeSynced(ctx context.Context, d *MariaDB, n int) error {
	for _, want := range [][2]string{
		{"wsrep_cluster_status", "Primary"},
		{"wsrep_cluster_size", strconv.Itoa(n)},
		{"wsrep_local_state_comment", "Synced"},
		{"wsrep_ready", "ON"},
	} {
		v, err := d.value(ctx, want[0])
		if err != nil {
			return err
		}
		if v != want[1] {
			return fmt.Errorf("%s: %s = %s, want %s", d.Addr, want[0], v, want[1])
		}
	}
	return nil
}
