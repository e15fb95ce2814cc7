package redisconn

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestParse(t *testing.T) {
	cases := []struct {
		url     string
		cluster bool
		addrs   []string // cluster seed nodes, or the one server
		err     string
	}{
		{url: "redis://127.0.0.1:6379/0", addrs: []string{"127.0.0.1:6379"}},
		{url: "redis://:pw@10.0.0.1:7000/3", addrs: []string{"10.0.0.1:7000"}},
		{url: "redis-cluster://127.0.0.1:7000", cluster: true, addrs: []string{"127.0.0.1:7000"}},
		{url: "redis-cluster://127.0.0.1:7000/", cluster: true, addrs: []string{"127.0.0.1:7000"}},
		{url: "redis-cluster://127.0.0.1:7000/0?addr=127.0.0.1:7001&addr=127.0.0.1:7002", cluster: true,
			addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}},
		{url: "redis-cluster://127.0.0.1:7000/2", err: "only database 0"},
		{url: "redis-cluster://127.0.0.1:7000?db=1", err: "only database 0"},
		{url: "redis-cluster://u:secret@127.0.0.1:7000?bogus=1", err: "bogus"},
		{url: "http://127.0.0.1:7000", err: "scheme"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			got, err := Parse(c.url)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one saying %q", err, c.err)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.IsCluster() != c.cluster {
				t.Fatalf("cluster %v, want %v", got.IsCluster(), c.cluster)
			}
			var addrs []string
			if got.IsCluster() {
				addrs = got.Cluster.Addrs
			} else {
				addrs = []string{got.Single.Addr}
			}
			if strings.Join(addrs, ",") != strings.Join(c.addrs, ",") {
				t.Fatalf("addrs %v, want %v", addrs, c.addrs)
			}
		})
	}
}

func TestOpenAppliesTuning(t *testing.T) {
	single, err := Open("redis://127.0.0.1:1/0?pool_size=7", Tuning{ReadTimeout: 3e9, PoolSize: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	o := single.(*redis.Client).Options()
	if o.PoolSize != 7 || o.ReadTimeout != 3e9 {
		t.Fatalf("pool %d read timeout %v: the URL's pool size and the tuning's timeout should both hold", o.PoolSize, o.ReadTimeout)
	}
	cl, err := Open("redis-cluster://127.0.0.1:1", Tuning{PoolSize: 9})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if !IsCluster(cl) || IsCluster(single) {
		t.Fatal("IsCluster is wrong")
	}
	if o := cl.(*redis.ClusterClient).Options(); o.PoolSize != 9 || o.ClusterStateReloadInterval != ClusterStateReload {
		t.Fatalf("cluster pool %d, slot map reloaded every %v; want 9 and %v", o.PoolSize, o.ClusterStateReloadInterval, ClusterStateReload)
	}
	if _, err := MasterFor(context.Background(), single, "k"); err != nil {
		t.Fatalf("MasterFor on one server: %v", err)
	}
}
