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

// waits reads how many WAIT commands srv has run (INFO commandstats).
func waits(t *testing.T, c *redis.Client) string {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\n") {
		if strings.HasPrefix(l, "cmdstat_wait:") {
			calls, _, _ := strings.Cut(strings.TrimPrefix(l, "cmdstat_wait:"), ",")
			return calls
		}
	}
	return "calls=0"
}

// TestConfirmAloneMaster: a master with no replica confirms a write
// alone (counted), and for a second after is not sent WAIT at all; once
// a replica is attached, WAIT is asked again and the replica's
// acknowledgement confirms; a replica that is attached but silent
// (paused) confirms nothing, and the master is not taken as alone.
func TestConfirmAloneMaster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := testenv.StartRedis(t, testenv.RedisOptions{})
	c := master.Client(t)
	rs := redisconn.NewReplicas()
	confirm := func() redisconn.Confirmation {
		t.Helper()
		conn := c.Conn()
		defer conn.Close()
		if err := conn.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		conf, err := rs.Confirm(ctx, conn, master.Addr, 1, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		return conf
	}
	if conf := confirm(); !conf.Alone || !conf.OK(1) {
		t.Fatalf("no replica: %+v, want confirmed alone", conf)
	}
	before := waits(t, c)
	if conf := confirm(); !conf.Alone {
		t.Fatalf("again: %+v, want alone", conf)
	}
	if after := waits(t, c); after != before {
		t.Errorf("WAIT sent to a master known alone: %s, then %s", before, after)
	}
	if n := rs.AloneWrites(); n != 2 {
		t.Errorf("AloneWrites = %d, want 2", n)
	}

	host, port, _ := strings.Cut(master.Addr, ":")
	replica := testenv.StartRedis(t, testenv.RedisOptions{ExtraArgs: []string{"--replicaof", host, port}})
	rc := replica.Client(t)
	testenv.WaitFor(t, 20*time.Second, "the replica's link up", func() bool {
		info, _ := rc.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	testenv.WaitFor(t, 5*time.Second, "a replica's acknowledgement", func() bool {
		conf := confirm()
		return !conf.Alone && conf.Acked == 1 && conf.OK(1)
	})
	replica.Pause(t)
	defer replica.Resume(t)
	if conf := confirm(); conf.Alone || conf.OK(1) {
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
