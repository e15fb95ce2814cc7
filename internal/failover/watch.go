package failover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
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
// its connections to a server that is no longer the one to write to, and
// is verified for the server the watcher checked.
type Gate interface {
	Recycle()
	Verify(server string)
	Verified() bool
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

// verdict is what a check finds of one shard's record of the database,
// compared with the server the pool reaches; judge chooses it.
type verdict uint8

const (
	recordHeld     verdict = iota // the server holds every commit the record names
	recordLost                    // it lacks some: a failover lost them
	recordMoved                   // it is another server than the record's, and holds them all
	recordForeign                 // it holds none of an origin the record names
	recordRestored                // the record names another lineage
	recordUnread                  // the record cannot be read (its Redis is down)
)

// judge is the one place a shard's record is judged (rec: its fields, nil
// when it could not be read; s: the server; lineage: the database's):
//
//	record unreadable                               -> unread    (left for the next check)
//	record of another lineage                       -> restored  (rebuild the shard from the
//	                                                              database; write nothing back)
//	the server holds none of a recorded origin      -> foreign   (not a failover of this database:
//	                                                              a restore without its lineage step,
//	                                                              RESET MASTER; wait for an operator)
//	the server lacks a recorded commit              -> lost      (heal, then set the record)
//	the record names another server                 -> moved     (heal: what it lost may be ends
//	                                                              no commit of the record names)
//	otherwise                                       -> held      (raise the record to the server's history)
//
// On Galera nothing is compared: every node holds every commit, and the
// record names the cluster, not a node.
func judge(rec map[string]string, s db.Server, lineage string) (verdict, []db.GTID) {
	if rec == nil {
		return recordUnread, nil
	}
	if l := rec["lineage"]; l != "" && l != lineage {
		return recordRestored, nil
	}
	var lacks []db.GTID
	if !s.Galera {
		lacks = s.History.Lacks(recorded(rec))
	}
	for _, g := range lacks {
		if s.History[db.Origin{Domain: g.Domain, Server: g.Server}] == 0 {
			return recordForeign, lacks
		}
	}
	switch {
	case len(lacks) > 0:
		return recordLost, lacks
	case rec["server"] != "" && rec["server"] != s.Identity():
		return recordMoved, nil
	}
	return recordHeld, nil
}

// recorded is the history a shard's record names: its g:<origin> fields.
func recorded(rec map[string]string) db.History {
	h := db.History{}
	for f, v := range rec {
		if origin, ok := strings.CutPrefix(f, "g:"); ok {
			if g, err := db.ParseGTID(origin + "-" + v); err == nil {
				h.Add(g)
			}
		}
	}
	return h
}

// Watcher checks, every Every, which database server the pool reaches,
// whether it takes writes, and whether it holds every commit the sale's
// Redis recorded of it (each shard's record, Keys.DBSeen; judge says
// what each is found to be): a server that does not take writes has its
// connections recycled; a shard whose record finds a loss, or another
// server than it last verified, is healed (under a lease, by one instance
// at a time) and its record set to what the server holds; a restored
// database rebuilds the shard. Ready says, per shard, whether the order
// writer may write: the pool verified for the server, and the shard
// holding nothing unhealed.
type Watcher struct {
	db     *gorm.DB
	gate   Gate
	rdb    redis.UniversalClient
	keys   voucher.Keys
	state  *voucher.State
	healer *Healer
	cfg    WatchConfig
	log    *slog.Logger
	now    func() time.Time
	sync   *redis.Script

	mu     sync.Mutex
	status Status
	// unhealed are the shards found lacking what Redis saw (or foreign)
	// and not yet healed: their writes wait.
	unhealed map[int]bool
	// what was last logged, so that a state is logged when it begins
	down, notPrimary, lost bool
	// betweenReads, when set (tests), runs between a check's reading of
	// the records and of the server.
	betweenReads func()
}

// Status is what the Watcher last found, for the readiness probe.
type Status struct {
	// Server is the database server the pool reaches (Server.Label),
	// Since when this instance first saw it there.
	Server string    `json:"server,omitempty"`
	Since  time.Time `json:"since,omitzero"`
	// Writable: it takes writes. Verified: the order writer may write to
	// it (it holds every commit the sale's Redis recorded, or what it
	// lacked was written back); Unhealed lists the shards whose writes
	// still wait.
	Writable bool  `json:"writable"`
	Verified bool  `json:"verified"`
	Unhealed []int `json:"unhealed_shards,omitempty"`
	// Error is why the last check failed, if it did.
	Error string `json:"error,omitempty"`
	// identity is the server's Identity: what a change of server is.
	identity string
}

// NewWatcher returns a Watcher; gate may be nil (SQLite), and it owns none
// of its clients.
func NewWatcher(g *gorm.DB, gate Gate, rdb redis.UniversalClient, keys voucher.Keys, healer *Healer, cfg WatchConfig, log *slog.Logger) *Watcher {
	cfg.Every = cmp.Or(cfg.Every, time.Second)
	cfg.HealLease = cmp.Or(cfg.HealLease, 30*time.Second)
	if cfg.Observer == nil {
		cfg.Observer = nopWatchObserver{}
	}
	return &Watcher{db: g, gate: gate, rdb: rdb, keys: keys, state: voucher.NewState(rdb, keys), healer: healer, cfg: cfg,
		log: log, now: time.Now, sync: lua.DBSync(), unhealed: map[int]bool{}}
}

type nopWatchObserver struct{}

func (nopWatchObserver) DatabaseSeen(string, time.Time, bool, bool) {}
func (nopWatchObserver) DatabaseVerified(bool)                      {}
func (nopWatchObserver) DatabaseDown()                              {}
func (nopWatchObserver) DatabaseRolledBack()                        {}
func (nopWatchObserver) DatabaseRestored()                          {}

// Status is what the last check found, and whether the writers may write
// now.
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.status
	st.Verified = w.verified()
	st.Unhealed = slices.Sorted(maps.Keys(w.unhealed))
	return st
}

// verified is the pool's side: the gate verified for the server it
// reaches (always, without a gate). mu held.
func (w *Watcher) verified() bool { return w.gate == nil || w.gate.Verified() }

// Ready reports whether the order writer may write orders of shard: the
// pool verified for the server it reaches, and the shard holding nothing
// the server lost that is not written back yet.
func (w *Watcher) Ready(shard int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.verified() && !w.unhealed[shard]
}

// AllReady reports whether every shard is Ready: what a move of a written
// order (a payment, a cancellation) waits for.
func (w *Watcher) AllReady() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.verified() && len(w.unhealed) == 0
}

// Run checks at once, then every Every, until ctx is done.
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

// Check checks the database once. The shards' records are read before
// the server is described: a batch committed in between is then held by
// the server described, never taken for a loss.
func (w *Watcher) Check(ctx context.Context) error {
	recs := w.records(ctx)
	if w.betweenReads != nil {
		w.betweenReads()
	}
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
	by := map[verdict]map[int][]db.GTID{}
	for shard, rec := range recs {
		v, lacks := judge(rec, s, lineage)
		if by[v] == nil {
			by[v] = map[int][]db.GTID{}
		}
		by[v][shard] = lacks
	}
	w.mu.Lock()
	for _, v := range []verdict{recordLost, recordMoved, recordForeign} {
		for shard := range by[v] {
			w.unhealed[shard] = true
		}
	}
	w.mu.Unlock()
	// The pool is verified for this server: the shards above wait for
	// their heal, the others write.
	if w.gate != nil {
		w.gate.Verify(s.Identity())
	}
	for shard := range by[recordHeld] {
		// Held: a shard an operator repaired since is free again.
		if w.syncRecord(ctx, shard, recs[shard]["lineage"], lineage, s, "raise") {
			w.mu.Lock()
			delete(w.unhealed, shard)
			w.mu.Unlock()
		}
	}
	if len(by[recordRestored]) > 0 {
		w.restore(ctx, s, lineage, by[recordRestored], recs)
	}
	if len(by[recordForeign]) > 0 {
		w.foreign(s, by[recordForeign])
	}
	if len(by[recordLost])+len(by[recordMoved]) > 0 {
		w.heal(ctx, s, lineage, by[recordLost], by[recordMoved], recs)
	}
	w.mu.Lock()
	if len(w.unhealed) == 0 {
		w.lost = false
	}
	w.status.Error = ""
	ready := w.verified() && len(w.unhealed) == 0
	w.mu.Unlock()
	w.cfg.Observer.DatabaseVerified(ready)
	return nil
}

// records reads every shard's record of the database; a shard whose
// record cannot be read (its Redis is down, and so are its purchases and
// its workers' settling) is nil.
func (w *Watcher) records(ctx context.Context) []map[string]string {
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, w.keys.Shards())
	for shard := range cmds {
		cmds[shard] = pipe.HGetAll(ctx, w.keys.DBSeen(shard))
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	out := make([]map[string]string, len(cmds))
	for shard, c := range cmds {
		if rec, err := c.Result(); err == nil {
			out[shard] = rec
		}
	}
	return out
}

// seen records the server found, logging a change of server and dropping
// the pool's connections made before it (they may reach the old server).
func (w *Watcher) seen(s db.Server) {
	w.mu.Lock()
	prev, prevID := w.status.Server, w.status.identity
	changed := prevID != "" && prevID != s.Identity()
	if prevID == "" || changed {
		w.status.Since = w.now().UTC()
	}
	w.status.Server, w.status.identity, w.status.Writable = s.Label(), s.Identity(), s.Primary()
	since := w.status.Since
	w.mu.Unlock()
	switch {
	case changed:
		w.log.Warn("database primary changed", "from", prev, "to", s.Label(), "takes_writes", s.Primary(), "gtid_state", s.History.String())
		if w.gate != nil {
			w.gate.Recycle()
		}
	case prevID == "":
		w.log.Info("database server", "server", s.Label(), "takes_writes", s.Primary(), "galera", s.Galera, "gtid_state", s.History.String())
	}
	w.cfg.Observer.DatabaseSeen(s.Label(), since, s.Primary(), changed)
}

// failed records a failed check, logged when such failures begin.
func (w *Watcher) failed(msg string, logged *bool, err error) {
	w.mu.Lock()
	w.status.Error = msg + ": " + err.Error()
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

// heal writes back what the server lost in the shards that lack commits
// (lost) and in those whose record names another server (moved), under
// the heal lease, then sets their records to what the server holds and
// lets their writes go.
func (w *Watcher) heal(ctx context.Context, s db.Server, lineage string, lost, moved map[int][]db.GTID, recs []map[string]string) {
	if len(lost) > 0 && !w.lost {
		var lacks []string
		for _, shard := range slices.Sorted(maps.Keys(lost)) {
			for _, g := range lost[shard] {
				lacks = append(lacks, fmt.Sprintf("shard %d: %s", shard, g))
			}
		}
		w.log.Error("the database lacks commits the sale's redis saw it make: a failover lost them; writing back what redis still holds, orders wait meanwhile",
			"server", s.Label(), "gtid_state", s.History.String(), "lacks", strings.Join(lacks, ", "))
		w.lost = true
	}
	// One instance heals at a time. The lease only saves work: every
	// write of a heal meets a guard (the worker's, the lifecycle's), so
	// two heals at once, after a lease lost to a pause, write nothing
	// twice; none is fenced.
	l, took, err := lease.Take(ctx, w.rdb, healLease(w.keys), w.cfg.HealLease)
	if err != nil || !took {
		return // another instance heals; the records show when it is done
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = l.Release(rctx)
	}()
	shards := map[int]bool{}
	for shard := range lost {
		shards[shard] = true
	}
	for shard := range moved {
		shards[shard] = true
	}
	began := w.now()
	rep, err := w.healer.Heal(l.Context(), shards)
	if err != nil {
		w.log.Error("healing the database's loss failed; tried again", "err", err)
		return
	}
	if len(lost) > 0 {
		w.cfg.Observer.DatabaseRolledBack()
	}
	healed := 0
	for shard := range shards {
		if rep.Healed(shard) && w.syncRecord(ctx, shard, recs[shard]["lineage"], lineage, s, "set") {
			healed++
			w.mu.Lock()
			delete(w.unhealed, shard)
			w.mu.Unlock()
		}
	}
	ends := 0
	for _, ids := range rep.Ends {
		ends += len(ids)
	}
	w.log.Warn("the database's loss is healed", "server", s.Label(), "orders_queued_again", len(rep.Requeued), "ends_written_again", ends,
		"left", len(rep.Left), "shards_healed", healed, "shards_not_ready", rep.NotReady, "shards_failed", rep.Failed, "took", w.now().Sub(began))
	for _, o := range rep.Left {
		w.log.Warn("heal left an order", "order_id", o.OrderID, "user_id", o.UserID, "voucher_id", o.VoucherID, "why", o.Why)
	}
}

// foreign logs the shards whose records name commits of an origin the
// server holds none of: not a failover of this database (a replica holds
// its primary's commits up to where it stopped), but a restore that did
// not make a new lineage, or a binary log reset. Nothing is written back
// and their writes wait until an operator decides: api reconcile
// --repair (it was a failover: write back) or a new lineage (it was a
// restore: rebuild from the database).
func (w *Watcher) foreign(s db.Server, shards map[int][]db.GTID) {
	if w.lost {
		return
	}
	w.lost = true
	w.log.Error("the database holds none of the commits of an origin the sale's redis saw it make: not a failover of this database; nothing is written back and orders wait. "+
		"A failover: run api reconcile --repair. A restore: give the database a new lineage (docs/operating.md, Backup and restore)",
		"server", s.Label(), "gtid_state", s.History.String(), "shards", slices.Sorted(maps.Keys(shards)))
}

// restore rebuilds from the database the shards whose records name
// another lineage: it was restored from a dump, and what Redis holds
// beyond it is what the restore undid on purpose.
func (w *Watcher) restore(ctx context.Context, s db.Server, lineage string, restored map[int][]db.GTID, recs []map[string]string) {
	w.log.Warn("the database carries another lineage than the sale's redis recorded: it was restored from a dump; the sale's redis is rebuilt from it and nothing is written back",
		"server", s.Label(), "shards", slices.Sorted(maps.Keys(restored)))
	vs, err := w.healer.vouchers.Live(ctx, w.now().Add(-Horizon))
	if err != nil {
		w.log.Warn("rebuilding from a restored database: the vouchers cannot be listed; tried again", "err", err)
		return
	}
	for shard := range restored {
		// Forget first, then set the record: a stop half-way leaves the
		// record as it was, and the next check does it all again.
		if err := w.state.ForgetShard(ctx, shard, vs); err != nil {
			w.log.Warn("rebuilding a shard from a restored database failed; tried again", "shard", shard, "err", err)
			continue
		}
		if w.syncRecord(ctx, shard, recs[shard]["lineage"], lineage, s, "set") {
			w.mu.Lock()
			delete(w.unhealed, shard)
			w.mu.Unlock()
			w.cfg.Observer.DatabaseRestored()
		}
	}
}

// syncRecord runs db_sync.lua on a shard's record read with lineage from:
// mode raise or set, to lineage to and server s. It reports whether the
// record is in line (synced now, or by another instance first).
func (w *Watcher) syncRecord(ctx context.Context, shard int, from, to string, s db.Server, mode string) bool {
	args := []any{from, to, s.Identity(), mode}
	for o, seq := range s.History {
		args = append(args, o.String(), strconv.FormatUint(seq, 10))
	}
	n, err := w.sync.Run(ctx, w.rdb, []string{w.keys.DBSeen(shard)}, args...).Int()
	switch {
	case err != nil:
		w.log.Warn("the shard's record of the database cannot be written; tried again", "shard", shard, "err", err)
		return false
	case n < 0:
		w.log.Warn("the shard's record of the database is not a hash; left as it is", "shard", shard, "key", w.keys.DBSeen(shard))
		return false
	}
	return true // 0: another instance synced it first
}

// ErrRestored means the database is of another lineage than the sale's
// Redis recorded: it was restored from a dump, and Redis is rebuilt from
// it (an instance's watcher does that), never the other way round.
var ErrRestored = errors.New("the database was restored from a dump since the sale's redis last saw it: redis is rebuilt from the database (a running instance does it), nothing is written back")

// Repair heals every shard now, whether or not a loss was found ("api
// reconcile --repair"), under the heal lease, and sets the records of the
// shards it healed to what the database holds. It refuses a database that
// is not a primary, and one restored from a dump (ErrRestored).
func (w *Watcher) Repair(ctx context.Context) (Report, error) {
	recs := w.records(ctx)
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
	var restored []int
	for shard, rec := range recs {
		if v, _ := judge(rec, s, lineage); v == recordRestored {
			restored = append(restored, shard)
		}
	}
	if len(restored) > 0 {
		return Report{}, fmt.Errorf("shards %v: %w", restored, ErrRestored)
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
	for shard, rec := range recs {
		if rec != nil && rep.Healed(shard) && !w.syncRecord(ctx, shard, rec["lineage"], lineage, s, "set") {
			rep.Failed[shard] = "its record of the database cannot be written"
		}
	}
	return rep, nil
}
