package failover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"seckill/internal/db"
	"seckill/internal/lease"
	"seckill/internal/voucher"
	"seckill/lua"
)

// Gate is the database pool's side of a failover (db.Primary): it drops
// its connections to a server that no longer takes writes, and lets the
// order writer write once the server it reaches is verified.
type Gate interface {
	Recycle()
	Verify(server string)
}

// WatchObserver hears what the Watcher finds (metrics).
type WatchObserver interface {
	DatabaseSeen(server string, since time.Time, writable, changed bool)
	DatabaseVerified(ok bool)
	DatabaseDown()
	DatabaseRolledBack()
	DatabaseRestored()
}

// WatchConfig tunes a Watcher.
type WatchConfig struct {
	// Every is how often it checks the database; default 1s.
	Every time.Duration
	// HealLease is the heal lease's time to live, renewed while a heal
	// goes on; default 30s. The lease only saves work: a heal is safe to
	// run twice at once (every write goes through a guard).
	HealLease time.Duration
	// Observer hears what it finds; nil hears nothing.
	Observer WatchObserver
}

// Watcher checks, every Every, which database server the pool reaches,
// whether it takes writes, and whether it holds every commit the sale's
// Redis recorded of it (each shard's record, Keys.DBSeen):
//
//	the server does not answer               -> down: nothing else checked
//	it does not take writes                  -> the pool's connections recycled
//	a shard's record names another lineage   -> restored: the shard is rebuilt from the
//	                                            database (its ready marker dropped, its ended
//	                                            orders forgotten), nothing written back
//	the server lacks a GTID a record names   -> rolled back: Heal for those shards, then
//	                                            their records lowered to what it holds
//	otherwise                                -> verified: the order writer may write
//
// Every instance runs one; a heal is done by one at a time (a lease), and
// the others find the records lowered once it is done.
type Watcher struct {
	db     *gorm.DB
	gate   Gate
	rdb    redis.UniversalClient
	keys   voucher.Keys
	healer *Healer
	cfg    WatchConfig
	log    *slog.Logger
	now    func() time.Time
	reset  *redis.Script

	mu     sync.Mutex
	status Status
	// what was last logged, so that a state is logged when it begins
	down, notPrimary, lost bool
}

// Status is what the Watcher last found, for the readiness probe.
type Status struct {
	// Server is the database server the pool reaches (Server.Label),
	// Since when this instance first saw it there.
	Server string    `json:"server,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	// Writable: it takes writes. Verified: it holds every commit the
	// sale's Redis recorded (or what it lacked was written back).
	Writable bool `json:"writable"`
	Verified bool `json:"verified"`
	// Error is why the last check failed, if it did.
	Error string `json:"error,omitempty"`
}

// NewWatcher returns a Watcher; gate may be nil (SQLite), and it owns none
// of its clients.
func NewWatcher(g *gorm.DB, gate Gate, rdb redis.UniversalClient, keys voucher.Keys, healer *Healer, cfg WatchConfig, log *slog.Logger) *Watcher {
	cfg.Every = cmp.Or(cfg.Every, time.Second)
	cfg.HealLease = cmp.Or(cfg.HealLease, 30*time.Second)
	if cfg.Observer == nil {
		cfg.Observer = nopWatchObserver{}
	}
	return &Watcher{db: g, gate: gate, rdb: rdb, keys: keys, healer: healer, cfg: cfg, log: log, now: time.Now, reset: lua.DBReset()}
}

type nopWatchObserver struct{}

func (nopWatchObserver) DatabaseSeen(string, time.Time, bool, bool) {}
func (nopWatchObserver) DatabaseVerified(bool)                      {}
func (nopWatchObserver) DatabaseDown()                              {}
func (nopWatchObserver) DatabaseRolledBack()                        {}
func (nopWatchObserver) DatabaseRestored()                          {}

// Status is what the last check found.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// Run checks at once, then every Every, until ctx is done. A failed check
// is logged when failures begin and tried again at the next tick.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.cfg.Every)
	defer t.Stop()
	for {
		_ = w.Check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Check checks the database once (the table on Watcher).
func (w *Watcher) Check(ctx context.Context) error {
	s, err := db.Describe(ctx, w.db)
	if err != nil {
		w.failed("the database does not answer", &w.down, err)
		w.cfg.Observer.DatabaseDown()
		return err
	}
	w.seen(s)
	if !s.Primary() {
		w.failed("the database address reaches a server that does not take writes; its connections are dropped", &w.notPrimary,
			fmt.Errorf("%s: read_only %v, galera %q", s.Label(), s.ReadOnly, s.GaleraState))
		if w.gate != nil {
			w.gate.Recycle()
		}
		return nil
	}
	w.notPrimary, w.down = false, false
	lineage, err := db.Lineage(ctx, w.db)
	if err != nil {
		w.failed("the database's lineage cannot be read", &w.down, err)
		return err
	}
	lost, restored, err := w.compare(ctx, s, lineage)
	if err != nil {
		w.failed("the sale's records of the database cannot be read", &w.down, err)
		return err
	}
	if len(restored) > 0 {
		w.restore(ctx, s, lineage, restored)
	}
	if len(lost) > 0 && !w.rolledBack(ctx, s, lineage, lost) {
		return nil // not verified: writes wait for the heal
	}
	w.lost = false
	if w.gate != nil {
		w.gate.Verify(s.Label())
	}
	w.mu.Lock()
	w.status.Verified, w.status.Error = true, ""
	w.mu.Unlock()
	w.cfg.Observer.DatabaseVerified(true)
	return nil
}

// seen records the server found, logging a change of server.
func (w *Watcher) seen(s db.Server) {
	w.mu.Lock()
	prev := w.status.Server
	changed := prev != "" && prev != s.Label()
	if prev == "" || changed {
		w.status.Since = w.now().UTC()
	}
	w.status.Server, w.status.Writable = s.Label(), s.Primary()
	if changed || !s.Primary() {
		w.status.Verified = false
	}
	since := w.status.Since
	w.mu.Unlock()
	switch {
	case changed:
		w.log.Warn("database primary changed", "from", prev, "to", s.Label(), "takes_writes", s.Primary(), "gtid_state", s.History.String())
	case prev == "":
		w.log.Info("database server", "server", s.Label(), "takes_writes", s.Primary(), "galera", s.Galera, "gtid_state", s.History.String())
	}
	w.cfg.Observer.DatabaseSeen(s.Label(), since, s.Primary(), changed)
	if changed || !s.Primary() {
		w.cfg.Observer.DatabaseVerified(false)
	}
}

// failed records a failed check, logged when such failures begin.
func (w *Watcher) failed(msg string, logged *bool, err error) {
	w.mu.Lock()
	w.status.Verified, w.status.Error = false, msg+": "+err.Error()
	if msg == "the database does not answer" {
		w.status.Writable = false
	}
	w.mu.Unlock()
	w.cfg.Observer.DatabaseVerified(false)
	if !*logged {
		w.log.Warn(msg, "err", err)
		*logged = true
	}
}

// compare reads every shard's record of the database and returns the
// shards whose record names commits s lacks (with them), and those whose
// record names another lineage (with it). A record with no lineage gets
// the database's. A shard whose record cannot be read is left out: its
// Redis is down, and so are its purchases and its workers' settling.
func (w *Watcher) compare(ctx context.Context, s db.Server, lineage string) (lost map[int][]db.GTID, restored map[int]string, err error) {
	n := w.keys.Shards()
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, n)
	for shard := range n {
		cmds[shard] = pipe.HGetAll(ctx, w.keys.DBSeen(shard))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	lost, restored = map[int][]db.GTID{}, map[int]string{}
	var unset []int
	read := 0
	for shard, c := range cmds {
		rec, err := c.Result()
		if err != nil {
			continue
		}
		read++
		switch l := rec["lineage"]; {
		case l == "":
			unset = append(unset, shard)
		case l != lineage:
			restored[shard] = l
			continue
		}
		if lacks := s.History.Lacks(recorded(rec)); len(lacks) > 0 {
			lost[shard] = lacks
		}
	}
	if read == 0 && n > 0 {
		return nil, nil, cmds[0].Err()
	}
	if len(unset) > 0 {
		pipe := w.rdb.Pipeline()
		for _, shard := range unset {
			pipe.HSetNX(ctx, w.keys.DBSeen(shard), "lineage", lineage)
		}
		_, _ = pipe.Exec(ctx) // set again at the next check if it failed
	}
	return lost, restored, nil
}

// recorded is the history a shard's record names: its g:<origin> fields.
func recorded(rec map[string]string) db.History {
	h := db.History{}
	for f, v := range rec {
		origin, ok := strings.CutPrefix(f, "g:")
		if !ok {
			continue
		}
		if g, err := db.ParseGTID(origin + "-" + v); err == nil {
			h.Add(g)
		}
	}
	return h
}

// rolledBack heals the shards whose records name commits the database
// lacks, under the heal lease, then lowers their records to what it
// holds. It reports whether every such shard is healed: only then may the
// writer write.
func (w *Watcher) rolledBack(ctx context.Context, s db.Server, lineage string, lost map[int][]db.GTID) bool {
	shards := map[int]bool{}
	var lacks []string
	for shard, gs := range lost {
		shards[shard] = true
		for _, g := range gs {
			lacks = append(lacks, fmt.Sprintf("shard %d: %s", shard, g))
		}
	}
	if !w.lost {
		w.log.Error("the database lacks commits the sale's redis saw it make: a failover lost them; writing back what redis still holds, orders wait meanwhile",
			"server", s.Label(), "gtid_state", s.History.String(), "lacks", strings.Join(lacks, ", "))
		w.lost = true
	}
	w.mu.Lock()
	w.status.Verified, w.status.Error = false, "the database lacks commits redis saw it make: healing"
	w.mu.Unlock()
	w.cfg.Observer.DatabaseVerified(false)
	// One instance heals at a time. The lease only saves work: every
	// write of a heal meets a guard (the worker's, the lifecycle's), so
	// two heals at once, after a lease lost to a pause, write nothing
	// twice; none is fenced.
	l, took, err := lease.Take(ctx, w.rdb, healLease(w.keys), w.cfg.HealLease)
	if err != nil || !took {
		return false // another instance heals; its records show when it is done
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = l.Release(rctx)
	}()
	began := w.now()
	rep, err := w.healer.Heal(l.Context(), shards)
	if err != nil {
		w.log.Error("healing the database's loss failed; tried again", "err", err)
		return false
	}
	w.cfg.Observer.DatabaseRolledBack()
	healed := 0
	for shard := range shards {
		if !rep.Healed(shard) {
			continue
		}
		if err := w.lower(ctx, shard, lineage, lineage, s.History); err != nil {
			rep.Failed[shard] = err.Error()
			continue
		}
		healed++
	}
	ends := 0
	for _, ids := range rep.Ends {
		ends += len(ids)
	}
	w.log.Warn("the database's loss is healed", "orders_queued_again", len(rep.Requeued), "ends_written_again", ends,
		"left", len(rep.Left), "shards_healed", healed, "shards_failed", rep.Failed, "took", w.now().Sub(began))
	for _, l := range rep.Left {
		w.log.Warn("heal left an order", "order_id", l.OrderID, "user_id", l.UserID, "voucher_id", l.VoucherID, "why", l.Why)
	}
	return healed == len(shards)
}

// restore rebuilds from the database the shards whose records name another
// lineage: it was restored from a dump, and what Redis holds beyond it is
// what the restore undid on purpose.
func (w *Watcher) restore(ctx context.Context, s db.Server, lineage string, restored map[int]string) {
	w.log.Warn("the database carries another lineage than the sale's redis recorded: it was restored from a dump; the sale's redis is rebuilt from it and nothing is written back",
		"server", s.Label(), "shards", shardsOf(keysSet(restored)))
	vs, err := w.healer.vouchers.Live(ctx, w.now().Add(-Horizon))
	if err != nil {
		w.log.Warn("rebuilding from a restored database: the vouchers cannot be listed; tried again", "err", err)
		return
	}
	for shard, old := range restored {
		// Forget first, then lower: a stop half-way leaves the record as
		// it was, and the next check does it all again.
		if err := w.forget(ctx, shard, vs); err != nil {
			w.log.Warn("rebuilding a shard from a restored database failed; tried again", "shard", shard, "err", err)
			continue
		}
		if err := w.lower(ctx, shard, old, lineage, s.History); err != nil {
			w.log.Warn("rebuilding a shard from a restored database failed; tried again", "shard", shard, "err", err)
			continue
		}
		w.cfg.Observer.DatabaseRestored()
	}
}

// forget drops what a shard's Redis holds beyond a restored database: the
// ended orders it recorded and its ready marker (the warmer then rebuilds
// the shard's stock and buyers from the database, keeping the orders in
// flight).
func (w *Watcher) forget(ctx context.Context, shard int, vs []voucher.Voucher) error {
	pipe := w.rdb.Pipeline()
	for _, v := range vs {
		nb := v.BucketCount()
		for b := range nb {
			if w.keys.BucketShard(v.ID, b, nb) == shard {
				pipe.Del(ctx, w.keys.EndedAt(shard, v.ID))
			}
		}
	}
	pipe.Del(ctx, w.keys.Ready(shard))
	_, err := pipe.Exec(ctx)
	return err
}

// lower runs db_reset.lua on a shard's record: from lineage from to to,
// every origin brought down to what h holds.
func (w *Watcher) lower(ctx context.Context, shard int, from, to string, h db.History) error {
	args := []any{from, to}
	for o, seq := range h {
		args = append(args, o.String(), strconv.FormatUint(seq, 10))
	}
	n, err := w.reset.Run(ctx, w.rdb, []string{w.keys.DBSeen(shard)}, args...).Int()
	switch {
	case err != nil:
		return fmt.Errorf("lower the record of shard %d: %w", shard, err)
	case n < 0:
		return fmt.Errorf("lower the record of shard %d: %w", shard, errBadRecord)
	}
	return nil // 0: another instance lowered it first
}

var errBadRecord = errors.New("the shard's record of the database is not a hash")

func keysSet[V any](m map[int]V) map[int]bool {
	out := make(map[int]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// ErrRestored means the database is of another lineage than the sale's
// Redis recorded: it was restored from a dump, and Redis is rebuilt from
// it (an instance's watcher does that), never the other way round.
var ErrRestored = errors.New("the database was restored from a dump since the sale's redis last saw it: redis is rebuilt from the database (a running instance does it), nothing is written back")

// Repair heals every shard now, whether or not a loss was found ("api
// reconcile --repair"), under the heal lease, and lowers the records of
// the shards it healed to what the database holds. It refuses a database
// that is not a primary, and one restored from a dump (ErrRestored).
func (w *Watcher) Repair(ctx context.Context) (Report, error) {
	s, err := db.Describe(ctx, w.db)
	if err != nil {
		return Report{}, err
	}
	if !s.Primary() {
		return Report{}, fmt.Errorf("%s does not take writes: %w", s.Label(), db.ErrNotPrimary)
	}
	lineage, err := db.Lineage(ctx, w.db)
	if err != nil {
		return Report{}, err
	}
	_, restored, err := w.compare(ctx, s, lineage)
	if err != nil {
		return Report{}, err
	}
	if len(restored) > 0 {
		return Report{}, fmt.Errorf("shards %v: %w", shardsOf(keysSet(restored)), ErrRestored)
	}
	l, took, err := lease.Take(ctx, w.rdb, healLease(w.keys), w.cfg.HealLease)
	if err != nil {
		return Report{}, err
	}
	if !took {
		return Report{}, errors.New("another instance is healing the database now; try again when it is done")
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = l.Release(rctx)
	}()
	rep, err := w.healer.Heal(l.Context(), nil)
	if err != nil {
		return rep, err
	}
	for shard := range w.keys.Shards() {
		if rep.Healed(shard) {
			if err := w.lower(ctx, shard, lineage, lineage, s.History); err != nil {
				rep.Failed[shard] = err.Error()
			}
		}
	}
	return rep, nil
}
