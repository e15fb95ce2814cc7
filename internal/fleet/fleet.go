// Package fleet keeps a list of the running instances and the schema
// version each was built for, in Redis, so that a migration can refuse to
// run while an instance built for an older schema still serves.
//
// Each instance writes one field of a hash: its name, and as value the
// schema version it knows and the time until which the entry holds. It
// renews the entry every third of that time and deletes it when it stops;
// an entry past its time (an instance killed) is ignored and pruned by the
// next reader. Instances of releases before this package wrote nothing:
// they are not seen.
package fleet

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/failing"
)

// TTL is how long an entry holds unless renewed.
const TTL = 15 * time.Second

// Key is the hash of the instances under a key prefix.
func Key(prefix string) string { return prefix + ":instances" }

// Member is a running instance as its entry says.
type Member struct {
	Name   string
	Schema int
	Until  time.Time
}

// Registry is this instance's entry. Run writes and renews it.
type Registry struct {
	rdb    redis.UniversalClient
	key    string
	name   string
	schema int
	log    *slog.Logger
}

// NewRegistry is the entry of the instance name, built for schema
// version schema, under the key prefix.
func NewRegistry(rdb redis.UniversalClient, prefix, name string, schema int, log *slog.Logger) *Registry {
	return &Registry{rdb: rdb, key: Key(prefix), name: name, schema: schema, log: log}
}

// Run writes the entry at once and every third of TTL until ctx is done,
// then deletes it. A failed write is logged and tried again next round.
func (r *Registry) Run(ctx context.Context) error {
	t := time.NewTicker(TTL / 3)
	defer t.Stop()
	f := failing.Log{Log: r.log, What: "registering this instance"}
	for {
		f.Round(ctx, r.rdb.HSet(ctx, r.key, r.name, value(r.schema, time.Now().Add(TTL))).Err())
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_ = r.rdb.HDel(dctx, r.key, r.name).Err()
			return nil
		case <-t.C:
		}
	}
}

func value(schema int, until time.Time) string {
	return fmt.Sprintf("schema=%d until=%d", schema, until.UnixMilli())
}

// Running lists the instances under the key prefix whose entries hold at
// now, by name, and deletes the entries that lapsed.
func Running(ctx context.Context, rdb redis.UniversalClient, prefix string, now time.Time) ([]Member, error) {
	key := Key(prefix)
	all, err := rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("read running instances: %w", err)
	}
	var out []Member
	var lapsed []string
	for name, v := range all {
		m, ok := parse(name, v)
		if !ok || !m.Until.After(now) {
			lapsed = append(lapsed, name)
			continue
		}
		out = append(out, m)
	}
	if len(lapsed) > 0 {
		_ = rdb.HDel(ctx, key, lapsed...).Err() // the next reader tries again
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// parse reads an entry's value: "schema=N until=MS".
func parse(name, v string) (Member, bool) {
	m := Member{Name: name}
	var schemaOK, untilOK bool
	for _, f := range strings.Fields(v) {
		k, val, _ := strings.Cut(f, "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			return m, false
		}
		switch k {
		case "schema":
			m.Schema, schemaOK = int(n), true
		case "until":
			m.Until, untilOK = time.UnixMilli(n), true
		}
	}
	return m, schemaOK && untilOK
}

// Older lists the members built for a schema older than version.
func Older(ms []Member, version int) []Member {
	var out []Member
	for _, m := range ms {
		if m.Schema < version {
			out = append(out, m)
		}
	}
	return out
}
