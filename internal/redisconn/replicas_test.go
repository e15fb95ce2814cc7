package redisconn_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/testenv"
)

// calls reads how many times srv has run cmd, as INFO commandstats names
// it ("wait", "cluster|myid").
func calls(t *testing.T, c *redis.Client, cmd string) string {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(l, "cmdstat_"+cmd+":"); ok {
			n, _, _ := strings.Cut(rest, ",")
			return n
		}
	}
	return "calls=0"
}

// TestConfirmAloneMaster: a cluster master that the cluster knows no
// replica of confirms a write alone (counted), without WAIT while it stays
// alone; a server not in a cluster never does (WAIT decides there); a
// master with a replica is confirmed by its acknowledgement, and with its
// replica paused (known to the cluster, so still a replica that could be
// promoted) is confirmed by nothing.
func TestConfirmAloneMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lone := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	rs := redisconn.NewReplicas(redisconn.ClusterPeers(lone.Client(t)))
	confirm := func(c *redis.Client, addr string) redisconn.Confirmation {
		t.Helper()
		conn := c.Conn()
		defer conn.Close()
		if err := conn.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		conf, err := rs.Confirm(ctx, conn, addr, 1, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return conf
	}

	m := lone.MasterOf(t, "k")
	mc := m.Client(t)
	if conf := confirm(mc, m.Addr); !conf.Alone || !conf.OK(1) {
		t.Fatalf("a cluster master with no replica: %+v, want confirmed alone", conf)
	}
	waits, myids := calls(t, mc, "wait"), calls(t, mc, "cluster|myid")
	if conf := confirm(mc, m.Addr); !conf.Alone {
		t.Fatalf("again: %+v, want alone", conf)
	}
	if after := calls(t, mc, "wait"); after != waits {
		t.Errorf("WAIT sent to a master known alone: %s, then %s", waits, after)
	}
	if after := calls(t, mc, "cluster|myid"); after != myids {
		t.Errorf("CLUSTER MYID asked again of a master known alone (one round trip a write is enough): %s, then %s", myids, after)
	}
	if n := rs.AloneWrites(); n != 2 {
		t.Errorf("AloneWrites = %d, want 2", n)
	}

	single := testenv.StartRedis(t, testenv.RedisOptions{})
	if conf := confirm(single.Client(t), single.Addr); conf.Alone || conf.OK(1) {
		t.Errorf("a server not in a cluster, no replica: %+v, want not confirmed", conf)
	}

	paired := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: 1})
	paired.WaitHealthy(t, time.Minute)
	m2 := paired.MasterOf(t, "k")
	replica := paired.ReplicaOf(t, m2)
	testenv.WaitFor(t, 10*time.Second, "the replica's acknowledgement", func() bool {
		conf := confirm(m2.Client(t), m2.Addr)
		return !conf.Alone && conf.Acked == 1
	})
	replica.Pause(t)
	defer replica.Resume(t)
	if conf := confirm(m2.Client(t), m2.Addr); conf.Alone || conf.OK(1) {
		t.Errorf("replica paused: %+v, want not confirmed and not alone", conf)
	}
	if n := rs.AloneWrites(); n != 2 {
		t.Errorf("AloneWrites = %d, want still 2", n)
	}
}

// TestConfirmNil: a nil Replicas only sends WAIT: a master with no
// replica confirms nothing.
func TestConfirmNil(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedis(t, testenv.RedisOptions{})
	conn := master.Client(t).Conn()
	defer conn.Close()
	var rs *redisconn.Replicas
	conf, err := rs.Confirm(context.Background(), conn, master.Addr, 1, 20*time.Millisecond)
	if err != nil || conf.OK(1) || conf.Alone {
		t.Fatalf("nil Replicas: %+v, %v; want short", conf, err)
	}
}

// TestReplicaCountsRemembered: a master's replica count is asked once a
// second (ROLE, on a server not in a cluster, after CLUSTER MYID is
// refused), not at every step of a move; a second later it is asked
// again.
func TestReplicaCountsRemembered(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	c := srv.Client(t)
	rc := redisconn.NewReplicaCounts()
	at := time.Now()
	redisconn.SetCountsClock(rc, func() time.Time { return at })
	count := func() {
		t.Helper()
		conn := c.Conn()
		defer conn.Close()
		if n, err := rc.Count(context.Background(), conn, srv.Addr); err != nil || n != 0 {
			t.Fatalf("Count = %d, %v; want 0 replicas", n, err)
		}
	}
	count()
	roles := calls(t, c, "role")
	if roles != "calls=1" {
		t.Fatalf("ROLE %s after the first count, want calls=1", roles)
	}
	count()
	if got := calls(t, c, "role"); got != roles {
		t.Errorf("ROLE asked again within the second: %s, then %s", roles, got)
	}
	at = at.Add(time.Second)
	count()
	if got := calls(t, c, "role"); got != "calls=2" {
		t.Errorf("ROLE %s a second later, want calls=2", got)
	}
}

// TestAgreedAlone: the vote that a master has no replica, on CLUSTER NODES
// answers as the other masters give them. r1 is a replica promoted after
// its master o1 died; m0 and m2 are the other masters.
func TestAgreedAlone(t *testing.T) {
	t.Parallel()
	const (
		m0       = "m0 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n"
		m2       = "m2 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383\n"
		r1       = "r1 127.0.0.1:7004@17004 master - 0 0 7 connected 5461-10922\n"
		o1Dead   = "o1 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected\n"
		o1Back   = "o1 127.0.0.1:7001@17001 slave r1 0 0 7 connected\n"
		r1Pfail  = "r1 127.0.0.1:7004@17004 master,fail? - 0 0 7 connected 5461-10922\n"
		r1Fail   = "r1 127.0.0.1:7004@17004 master,fail - 0 0 7 disconnected 5461-10922\n"
		r1Bare   = "r1 127.0.0.1:7004@17004 master - 0 0 7 connected\n"
		r1AsRepl = "r1 127.0.0.1:7004@17004 slave o1 0 0 2 connected\n"
		deadRepl = "x1 127.0.0.1:7005@17005 slave,fail r1 0 0 7 disconnected\n"
	)
	alone := m0 + m2 + r1 + o1Dead
	for _, c := range []struct {
		name    string
		id      string
		views   []string
		masters int
		want    bool
	}{
		{"both other masters see it alone", "r1", []string{alone, alone}, 3, true},
		{"one of two other masters answers", "r1", []string{alone}, 3, true},
		{"no other master answers", "r1", nil, 3, false},
		{"its old master came back as its replica", "r1", []string{m0 + m2 + r1 + o1Back, alone}, 3, false},
		{"a replica of it that is down still counts", "r1", []string{alone + deadRepl, alone + deadRepl}, 3, false},
		{"suspected failing", "r1", []string{m0 + m2 + r1Pfail + o1Dead, m0 + m2 + r1Pfail + o1Dead}, 3, false},
		{"failed", "r1", []string{m0 + m2 + r1Fail + o1Dead, m0 + m2 + r1Fail + o1Dead}, 3, false},
		{"serves no slot", "r1", []string{m0 + m2 + r1Bare + o1Dead, m0 + m2 + r1Bare + o1Dead}, 3, false},
		{"the others do not know it", "r1", []string{m0 + m2 + o1Dead, m0 + m2 + o1Dead}, 3, false},
		{"a stale old master: a replica to the others", "o1", []string{m0 + m2 + r1 + o1Back, m0 + m2 + r1 + o1Back}, 3, false},
		{"a stale old master: failed and slotless to the others", "o1", []string{alone, alone}, 3, false},
		{"a stale view of r1 as a replica", "r1", []string{m0 + m2 + r1AsRepl, m0 + m2 + r1AsRepl}, 3, false},
		{"one vote of four others is no majority of five", "r1", []string{alone, m0 + m2 + o1Dead, m0 + m2 + o1Dead, m0 + m2 + o1Dead}, 5, false},
		{"two votes of four others are a majority of five", "r1", []string{alone, alone, m0 + m2 + o1Dead, m0 + m2 + o1Dead}, 5, true},
		{"a cluster of one master", "r1", nil, 1, true},
	} {
		if got := redisconn.Agreed(c.id, c.views, c.masters); got != c.want {
			t.Errorf("%s: Agreed(%s) = %v, want %v", c.name, c.id, got, c.want)
		}
	}
}

// TestConfirmAloneNeedsTheVote: a cluster master that lists no replica of
// itself is not taken for alone when the other masters do not agree (here
// they see it serve no slot, as they would an old master back from a
// restart that still believes it is one); with their votes it is.
func TestConfirmAloneNeedsTheVote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lone := testenv.StartCluster(t, testenv.ClusterOptions{Masters: 3, Replicas: -1})
	m := lone.MasterOf(t, "k")
	mc := m.Client(t)
	id, err := mc.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	views := func(slots string) redisconn.Peers {
		return func(context.Context, string) ([]string, int) {
			line := id + " " + m.Addr + "@1 master - 0 0 1 connected" + slots + "\n"
			return []string{line, line}, 3
		}
	}
	for _, c := range []struct {
		name  string
		peers redisconn.Peers
		alone bool
	}{
		{"the others see it serve no slot", views(""), false},
		{"the others see it serve slots", views(" 0-5460"), true},
		{"no vote can be held", nil, false},
	} {
		rs := redisconn.NewReplicas(c.peers)
		conn := mc.Conn()
		if err := conn.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		conf, err := rs.Confirm(ctx, conn, m.Addr, 1, 50*time.Millisecond)
		_ = conn.Close()
		if err != nil || conf.Alone != c.alone || conf.OK(1) != c.alone {
			t.Errorf("%s: %+v, %v; want alone %v", c.name, conf, err, c.alone)
		}
	}
}
