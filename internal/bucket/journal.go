package bucket

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"seckill/internal/redisconn"
)

// journalPage is how many fields one HSCAN call asks for.
const journalPage = 100

// journaled is one journal entry as read: parsed, or the reason it could
// not be, with its age by the donor's clock.
type journaled struct {
	id  string
	e   entry
	err error // unparseable: e is empty
	age time.Duration
}

// scanJournal reads a donor shard's journal page by page and calls visit
// for each entry, once the page is read (visit may close entries). Ages
// are measured against the donor master's clock, read once per scan.
func (m *Mover) scanJournal(ctx context.Context, shard int, visit func(j journaled)) error {
	key := journalKey(m.keys, shard)
	master, err := redisconn.MasterFor(ctx, m.rdb, key)
	if err != nil {
		return fmt.Errorf("journal of shard %d: find the master: %w", shard, err)
	}
	now, err := master.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("journal of shard %d: time: %w", shard, err)
	}
	err = m.hscan(ctx, key, func(id, rec string) {
		e, perr := parseEntry(shard, id, rec)
		visit(journaled{id: id, e: e, err: perr, age: now.Sub(time.UnixMilli(e.at))})
	})
	if err != nil {
		return fmt.Errorf("journal of shard %d: scan: %w", shard, err)
	}
	return nil
}

// hscan reads hash key page by page and calls visit for each field, once
// its page is read (visit may write the hash).
func (m *Mover) hscan(ctx context.Context, key string, visit func(field, value string)) error {
	var cursor uint64
	for {
		kv, next, err := m.rdb.HScan(ctx, key, cursor, "", journalPage).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			visit(kv[i], kv[i+1])
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// scanFences reads a shard's fences: voucher id -> its bucket count, from
// the fence's value "<nb>:<token>". A field that does not parse is skipped
// (no script writes one).
func (m *Mover) scanFences(ctx context.Context, shard int) (map[int64]int, error) {
	out := map[int64]int{}
	err := m.hscan(ctx, fencesKey(m.keys, shard), func(field, value string) {
		v, err1 := strconv.ParseInt(field, 10, 64)
		nbs, _, _ := strings.Cut(value, ":")
		nb, err2 := strconv.Atoi(nbs)
		if err1 == nil && err2 == nil && nb >= 2 {
			out[v] = nb
		}
	})
	if err != nil {
		return nil, fmt.Errorf("fences of shard %d: scan: %w", shard, err)
	}
	return out, nil
}
