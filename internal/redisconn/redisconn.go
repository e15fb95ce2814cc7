// Package redisconn opens the Redis the sale runs on from one URL: a single
// server (redis://, rediss://, unix://) or a Redis Cluster
// (redis-cluster://, rediss-cluster://, seed nodes as the host and addr=
// parameters). Everything that talks to the sale's Redis opens it here, so
// the service, its subcommands and the load tools read the same setting
// the same way.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redact"
)

// Cluster URL schemes. The rest of such a URL is what go-redis's
// ParseClusterURL reads: redis-cluster://[user:pass@]host:port[?addr=host:port&...].
const (
	schemeCluster    = "redis-cluster"
	schemeClusterTLS = "rediss-cluster"
)

// Target is a parsed Redis URL: exactly one of Single and Cluster is set.
type Target struct {
	Single  *redis.Options
	Cluster *redis.ClusterOptions
}

// IsCluster reports whether the target is a Redis Cluster.
func (t Target) IsCluster() bool { return t.Cluster != nil }

// Parse reads a Redis URL. On a cluster only database 0 exists: a URL that
// names another is refused.
func Parse(raw string) (Target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, redact.URLError(fmt.Errorf("parse redis url: %w", err), raw)
	}
	switch u.Scheme {
	case schemeCluster, schemeClusterTLS:
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			return Target{}, fmt.Errorf("redis cluster url names database %s: a Redis Cluster has only database 0", db)
		}
		if u.Query().Has("db") {
			return Target{}, errors.New("redis cluster url sets db: a Redis Cluster has only database 0")
		}
		u.Path = ""
		u.Scheme = strings.TrimSuffix(u.Scheme, "-cluster")
		opts, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return Target{}, redact.URLError(err, raw)
		}
		return Target{Cluster: opts}, nil
	default:
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return Target{}, redact.URLError(err, raw)
		}
		return Target{Single: opts}, nil
	}
}

// ClusterStateReload is how old a cluster client's slot map may get
// before a command reloads it (CLUSTER SLOTS in the background).
const ClusterStateReload = time.Second

// Tuning is what the caller sets on top of the URL; zero fields keep
// go-redis's defaults (or the URL's).
type Tuning struct {
	DialTimeout, ReadTimeout, WriteTimeout, PoolTimeout time.Duration
	PoolSize, MinIdleConns                              int
	// MaxRetries < 0 disables retries.
	MaxRetries int
	// DialAttempts is how many times one connection is dialed before its
	// dial fails (go-redis's DialerRetries: 5 by default, 100ms apart, so
	// a command to a dead server waits 400ms per try before its error).
	DialAttempts int
}

// Open connects to the target with the tuning applied. It does not dial:
// the first command does.
func (t Target) Open(tn Tuning) redis.UniversalClient {
	if t.Cluster != nil {
		o := *t.Cluster
		tn.apply(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.PoolSize, &o.MinIdleConns, &o.MaxRetries, &o.DialerRetries)
		// go-redis reloads its slot map on MOVED, or when it is older
		// than this when a command is sent (default a minute). A master
		// that died refuses connections instead of answering MOVED, so
		// after a failover the client would keep sending that master's
		// slots to it for up to the default: reload every second.
		if o.ClusterStateReloadInterval == 0 {
			o.ClusterStateReloadInterval = ClusterStateReload
		}
		return redis.NewClusterClient(&o)
	}
	o := *t.Single
	tn.apply(&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.PoolSize, &o.MinIdleConns, &o.MaxRetries, &o.DialerRetries)
	return redis.NewClient(&o)
}

// apply sets the options' fields to the tuning's, where the tuning sets
// them (is not zero).
func (tn Tuning) apply(dial, read, write, pool *time.Duration, size, idle, retries, dials *int) {
	for _, d := range []struct {
		dst *time.Duration
		v   time.Duration
	}{{dial, tn.DialTimeout}, {read, tn.ReadTimeout}, {write, tn.WriteTimeout}, {pool, tn.PoolTimeout}} {
		if d.v != 0 {
			*d.dst = d.v
		}
	}
	for _, n := range []struct {
		dst *int
		v   int
	}{{size, tn.PoolSize}, {idle, tn.MinIdleConns}, {retries, tn.MaxRetries}, {dials, tn.DialAttempts}} {
		if n.v != 0 {
			*n.dst = n.v
		}
	}
}

// Open parses raw and connects with the tuning applied.
func Open(raw string, tn Tuning) (redis.UniversalClient, error) {
	t, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	return t.Open(tn), nil
}

// IsCluster reports whether rdb talks to a Redis Cluster.
func IsCluster(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.ClusterClient)
	return ok
}

// MasterFor returns the client of the server that holds key: on a cluster
// the master serving key's slot (from the client's slot map), else the one
// server.
func MasterFor(ctx context.Context, rdb redis.UniversalClient, key string) (*redis.Client, error) {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("redis client %T has no master for a key", rdb)
}

// ForEachMaster calls fn for every master: on a cluster each master the
// client's slot map knows, at once, else the one server.
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("redis client %T has no masters", rdb)
}
