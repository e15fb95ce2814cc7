package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// ClusterOptions configures a dedicated Redis Cluster.
type ClusterOptions struct {
	// Masters is the number of masters, 3 by default; redis-cli creates no
	// cluster with fewer.
	Masters int
	// Replicas is the number of replicas per master, 1 by default; a
	// negative number means none.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a node may not answer
	// before it is flagged failing, and its replica takes over. 1s by
	// default, so a failover takes a few seconds, not the minute of a
	// production setting.
	NodeTimeout time.Duration
	// AppendOnly turns on the AOF with an fsync per write on every node.
	AppendOnly bool
	// ExtraArgs are appended to every redis-server command line.
	ExtraArgs []string
}

// Cluster is a Redis Cluster owned by one test, which may kill, pause,
// restart nodes and move slots to see how the code under test copes.
type Cluster struct {
	nodes []*ClusterNode
}

// ClusterNode is one redis-server of a Cluster. Its RedisServer gives Addr,
// Dir, Kill, Stop, Pause, Resume, Restart, URL and a client of this node
// alone. A restarted node keeps its port and nodes.conf, so it rejoins as
// the same node.
type ClusterNode struct {
	*RedisServer
	ID string // cluster node id

	paused atomic.Bool   // a paused node answers nothing: waits leave it out
	admin  *redis.Client // commands of this package; never retries in a poll
}

// Pause sends SIGSTOP, like RedisServer.Pause; the cluster's waits then
// leave the node out, as the other nodes will once node timeout passes.
func (n *ClusterNode) Pause(tb testing.TB) {
	tb.Helper()
	n.paused.Store(true)
	n.RedisServer.Pause(tb)
}

// Resume sends SIGCONT, undoing Pause.
func (n *ClusterNode) Resume(tb testing.TB) {
	tb.Helper()
	n.RedisServer.Resume(tb)
	n.paused.Store(false)
}

// Restart stops the node if it still runs and starts it again on its port,
// directory and nodes.conf: it rejoins as the same node, as a replica if
// another node took its slots meanwhile.
func (n *ClusterNode) Restart(tb testing.TB) {
	tb.Helper()
	n.RedisServer.Restart(tb)
	n.paused.Store(false)
}

// live reports whether the node runs and is not paused.
func (n *ClusterNode) live() bool {
	if n.paused.Load() {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return !n.proc.exited()
}

// StartCluster starts a Redis Cluster of opt.Masters masters with
// opt.Replicas replicas each, every node on free loopback ports with a
// directory of its own, and waits until it is healthy (see WaitHealthy).
// Every node is killed on cleanup.
func StartCluster(tb testing.TB, opt ClusterOptions) *Cluster {
	tb.Helper()
	opt.Masters = cmp.Or(opt.Masters, 3)
	switch {
	case opt.Replicas == 0:
		opt.Replicas = 1
	case opt.Replicas < 0:
		opt.Replicas = 0
	}
	opt.NodeTimeout = cmp.Or(opt.NodeTimeout, time.Second)
	if opt.Masters < 3 {
		tb.Fatalf("start redis cluster: %d masters; a cluster needs at least 3", opt.Masters)
	}
	server, err := lookBin("redis-server")
	if err != nil {
		unavailable(tb, fmt.Errorf("%w; install redis-server (apt-get install redis-server)", err))
	}
	cli, err := lookBin("redis-cli")
	if err != nil {
		unavailable(tb, fmt.Errorf("%w; install redis-tools (apt-get install redis-tools)", err))
	}

	c := &Cluster{}
	for range opt.Masters * (1 + opt.Replicas) {
		n, err := startClusterNode(tb, server, opt)
		if err != nil {
			tb.Fatalf("start redis cluster: %v", err)
		}
		c.nodes = append(c.nodes, n)
	}

	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(opt.Replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(tb, time.Minute)

	masters := c.Masters(tb)
	if len(masters) != opt.Masters {
		tb.Fatalf("start redis cluster: %d masters, want %d", len(masters), opt.Masters)
	}
	return c
}

// startClusterNode starts one node and learns its id. The cluster bus port
// is chosen too: the default, port+10000, may lie past 65535.
func startClusterNode(tb testing.TB, bin string, opt ClusterOptions) (*ClusterNode, error) {
	tb.Helper()
	dir := tb.TempDir()
	var err error
	for range 3 { // a bus port may be taken between freePort and the start
		var bus int
		if bus, err = freePort(); err != nil {
			return nil, err
		}
		args := []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", strconv.FormatInt(opt.NodeTimeout.Milliseconds(), 10),
			// A replica takes over however long ago it last heard from its
			// master: with a short node timeout the default factor could
			// leave a slot range without a master.
			"--cluster-replica-validity-factor", "0",
			// The master streams its snapshot to a new replica at once,
			// instead of waiting 5s for more replicas to share it.
			"--repl-diskless-sync-delay", "0",
			// As the shipped configurations: the masters left serve their
			// slots while one is down.
			"--cluster-require-full-coverage", "no",
		}
		var s *RedisServer
		if s, err = startRedis(bin, dir, RedisOptions{AppendOnly: opt.AppendOnly, ExtraArgs: append(args, opt.ExtraArgs...)}); err != nil {
			continue
		}
		tb.Cleanup(s.close)
		n := &ClusterNode{RedisServer: s}
		n.admin = redis.NewClient(&redis.Options{
			Addr: s.Addr, MaxRetries: -1,
			DialTimeout: time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		})
		tb.Cleanup(func() { _ = n.admin.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if n.ID, err = n.admin.Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
			return nil, fmt.Errorf("cluster myid of %s: %w", s.Addr, err)
		}
		return n, nil
	}
	return nil, err
}

// URL returns the cluster's redis-cluster:// URL, naming every node.
func (c *Cluster) URL() string {
	var b strings.Builder
	b.WriteString("redis-cluster://" + c.nodes[0].Addr)
	sep := "?"
	for _, n := range c.nodes[1:] {
		b.WriteString(sep + "addr=" + n.Addr)
		sep = "&"
	}
	return b.String()
}

// Nodes returns every node, live or not, in start order.
func (c *Cluster) Nodes() []*ClusterNode { return slices.Clone(c.nodes) }

// Client returns a new cluster client seeded with every node, closed on
// cleanup. It reloads the slot map every second it is used: go-redis
// reloads on a MOVED reply, but not when a dead master refuses the
// connection, and would keep calling it for a minute after a failover.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: time.Second})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// live returns the nodes that run and are not paused.
func (c *Cluster) live() []*ClusterNode {
	var out []*ClusterNode
	for _, n := range c.nodes {
		if n.live() {
			out = append(out, n)
		}
	}
	return out
}

// KeySlot returns the hash slot of key, as a live node computes it.
func (c *Cluster) KeySlot(tb testing.TB, key string) int {
	tb.Helper()
	var err error
	for _, n := range c.live() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var slot int64
		slot, err = n.admin.ClusterKeySlot(ctx, key).Result()
		cancel()
		if err == nil {
			return int(slot)
		}
	}
	tb.Fatalf("cluster keyslot %q: no live node answered: %v", key, err)
	return 0
}

// MasterOf returns the node serving key's slot now.
func (c *Cluster) MasterOf(tb testing.TB, key string) *ClusterNode {
	tb.Helper()
	return c.masterOfSlot(tb, c.KeySlot(tb, key))
}

// masterOfSlot returns the one live node that claims slot as its own. It
// waits a little for a single claimant: a master coming back from a
// restart claims its old slots until it learns that another took them.
func (c *Cluster) masterOfSlot(tb testing.TB, slot int) *ClusterNode {
	tb.Helper()
	var owner *ClusterNode
	poll(tb, 30*time.Second, fmt.Sprintf("one master serving slot %d", slot), func(ctx context.Context) error {
		var claim []*ClusterNode
		for _, n := range c.live() {
			v, err := n.slotView(ctx)
			if err != nil {
				return err
			}
			if v[slot] == n.ID {
				claim = append(claim, n)
			}
		}
		if len(claim) != 1 {
			return fmt.Errorf("%d live nodes claim slot %d", len(claim), slot)
		}
		owner = claim[0]
		return nil
	})
	return owner
}

// Masters returns the live nodes that are masters now.
func (c *Cluster) Masters(tb testing.TB) []*ClusterNode {
	tb.Helper()
	var out []*ClusterNode
	for _, n := range c.live() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := n.replication(ctx)
		cancel()
		if err != nil {
			tb.Fatalf("role of %s: %v", n.Addr, err)
		}
		if r["role"] == "master" {
			out = append(out, n)
		}
	}
	return out
}

// WaitHealthy waits until every live node reports cluster_state:ok with
// all slots served, all live nodes agree who serves each slot and see each
// other without a failure flag, and every live replica's link to its
// master is up. Use it after a failover, a restart or a resume.
func (c *Cluster) WaitHealthy(tb testing.TB, within time.Duration) {
	tb.Helper()
	poll(tb, within, "redis cluster healthy", func(ctx context.Context) error {
		if err := c.agreed(ctx, nil); err != nil {
			return err
		}
		for _, n := range c.live() {
			if err := n.sees(ctx, c.live()); err != nil {
				return err
			}
			r, err := n.replication(ctx)
			if err != nil {
				return err
			}
			if r["role"] != "master" && r["master_link_status"] != "up" {
				return fmt.Errorf("replica %s: master_link_status:%s", n.Addr, r["master_link_status"])
			}
		}
		return nil
	})
}

// WaitFailover waits until other nodes serve every slot killed served, as
// every live node sees it, and cluster_state is ok on all of them. killed
// may be dead or paused.
func (c *Cluster) WaitFailover(tb testing.TB, killed *ClusterNode, within time.Duration) {
	tb.Helper()
	poll(tb, within, "failover of "+killed.Addr, func(ctx context.Context) error {
		return c.agreed(ctx, killed)
	})
}

// agreed checks that every live node reports cluster_state:ok with all
// slots ok, and that all hold the same owner for every slot, a live node
// other than not.
func (c *Cluster) agreed(ctx context.Context, not *ClusterNode) error {
	live := c.live()
	if len(live) == 0 {
		return errors.New("no live node")
	}
	isLive := map[string]bool{}
	for _, n := range live {
		isLive[n.ID] = true
	}
	var first *[clusterSlots]string
	for _, n := range live {
		info, err := n.clusterInfo(ctx)
		if err != nil {
			return err
		}
		if info["cluster_state"] != "ok" || info["cluster_slots_ok"] != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("%s: cluster_state:%s cluster_slots_ok:%s", n.Addr, info["cluster_state"], info["cluster_slots_ok"])
		}
		v, err := n.slotView(ctx)
		if err != nil {
			return err
		}
		for slot, id := range v {
			switch {
			case !isLive[id]:
				return fmt.Errorf("%s: slot %d served by %q, no live node", n.Addr, slot, id)
			case not != nil && id == not.ID:
				return fmt.Errorf("%s: slot %d still served by %s", n.Addr, slot, not.Addr)
			case first != nil && first[slot] != id:
				return fmt.Errorf("%s: slot %d served by %s, %s says %s", n.Addr, slot, id, live[0].Addr, first[slot])
			}
		}
		if first == nil {
			first = v
		}
	}
	return nil
}

// slotView returns who serves each slot as n sees it: a node id, or "".
func (n *ClusterNode) slotView(ctx context.Context) (*[clusterSlots]string, error) {
	ranges, err := n.admin.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster slots on %s: %w", n.Addr, err)
	}
	var v [clusterSlots]string
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= clusterSlots {
			return nil, fmt.Errorf("cluster slots on %s: bad range %+v", n.Addr, r)
		}
		for s := r.Start; s <= r.End; s++ {
			v[s] = r.Nodes[0].ID
		}
	}
	return &v, nil
}

// sees checks that n knows every node of others, connected and not flagged
// failing.
func (n *ClusterNode) sees(ctx context.Context, others []*ClusterNode) error {
	out, err := n.admin.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Errorf("cluster nodes on %s: %w", n.Addr, err)
	}
	state := map[string]string{} // id -> flags and link state
	for line := range strings.Lines(out) {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot> ...
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		state[f[0]] = f[2] + " " + f[7]
	}
	for _, o := range others {
		st, ok := state[o.ID]
		switch {
		case !ok:
			return fmt.Errorf("%s does not know %s", n.Addr, o.Addr)
		case strings.Contains(st, "fail") || strings.Contains(st, "handshake") || strings.Contains(st, "noaddr"):
			return fmt.Errorf("%s sees %s as %s", n.Addr, o.Addr, st)
		case !strings.HasSuffix(st, " connected"):
			return fmt.Errorf("%s sees %s %s", n.Addr, o.Addr, st)
		}
	}
	return nil
}

func (n *ClusterNode) clusterInfo(ctx context.Context) (map[string]string, error) {
	s, err := n.admin.ClusterInfo(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster info on %s: %w", n.Addr, err)
	}
	return infoFields(s), nil
}

func (n *ClusterNode) replication(ctx context.Context) (map[string]string, error) {
	s, err := n.admin.Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("info replication on %s: %w", n.Addr, err)
	}
	return infoFields(s), nil
}

// infoFields reads the key:value lines of INFO or CLUSTER INFO.
func infoFields(s string) map[string]string {
	m := map[string]string{}
	for line := range strings.Lines(s) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// MigrateSlot moves slot and its keys to the master to, as a resharding
// does.
func (c *Cluster) MigrateSlot(tb testing.TB, slot int, to *ClusterNode) {
	tb.Helper()
	c.BeginMigrate(tb, slot, to).Finish(tb)
}

// Migration is a slot half moved: its master serves the keys it still
// holds and redirects clients (ASK) to the importing node for the others.
type Migration struct {
	c        *Cluster
	Slot     int
	From, To *ClusterNode
}

// BeginMigrate marks slot importing on to and migrating on its master, and
// moves no key yet.
func (c *Cluster) BeginMigrate(tb testing.TB, slot int, to *ClusterNode) *Migration {
	tb.Helper()
	from := c.masterOfSlot(tb, slot)
	if from == to {
		tb.Fatalf("migrate slot %d: %s serves it already", slot, to.Addr)
	}
	m := &Migration{c: c, Slot: slot, From: from, To: to}
	m.do(tb, to, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID)
	m.do(tb, from, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID)
	return m
}

// MoveKeys moves one batch of at most batch keys of the slot and returns
// how many it moved; 0 means none is left on the old master.
func (m *Migration) MoveKeys(tb testing.TB, batch int) int {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keys, err := m.From.admin.ClusterGetKeysInSlot(ctx, m.Slot, batch).Result()
	if err != nil {
		tb.Fatalf("migrate slot %d: getkeysinslot on %s: %v", m.Slot, m.From.Addr, err)
	}
	if len(keys) == 0 {
		return 0
	}
	host, port, _ := strings.Cut(m.To.Addr, ":")
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	m.do(tb, m.From, args...) // NOKEY, when they all expired meanwhile, is no error
	return len(keys)
}

// Finish moves the keys left and gives the slot to the new master: on it
// first, then on the old one and the other masters, and waits until every
// live node agrees.
func (m *Migration) Finish(tb testing.TB) {
	tb.Helper()
	for m.MoveKeys(tb, 100) > 0 {
	}
	m.do(tb, m.To, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.To.ID)
	m.do(tb, m.From, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.To.ID)
	for _, n := range m.c.Masters(tb) {
		if n != m.To && n != m.From {
			m.do(tb, n, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.To.ID)
		}
	}
	poll(tb, 30*time.Second, fmt.Sprintf("every node sees slot %d on %s", m.Slot, m.To.Addr), func(ctx context.Context) error {
		for _, n := range m.c.live() {
			v, err := n.slotView(ctx)
			if err != nil {
				return err
			}
			if v[m.Slot] != m.To.ID {
				return fmt.Errorf("%s: slot %d served by %q", n.Addr, m.Slot, v[m.Slot])
			}
		}
		return nil
	})
}

func (m *Migration) do(tb testing.TB, n *ClusterNode, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.admin.Do(ctx, args...).Err(); err != nil {
		tb.Fatalf("migrate slot %d: %v on %s: %v", m.Slot, args, n.Addr, err)
	}
}

// ReplicaOf returns the node replicating master (INFO replication of each
// node); the test fails when none does.
func (c *Cluster) ReplicaOf(tb testing.TB, master *ClusterNode) *ClusterNode {
	tb.Helper()
	_, port, _ := strings.Cut(master.Addr, ":")
	for _, n := range c.Nodes() {
		info, err := n.Client(tb).Info(context.Background(), "replication").Result()
		if err != nil {
			tb.Fatalf("info replication on %s: %v", n.Addr, err)
		}
		if strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r\n") {
			return n
		}
	}
	tb.Fatalf("no replica of %s", master.Addr)
	return nil
}
