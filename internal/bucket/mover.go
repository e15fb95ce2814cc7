// Package bucket moves stock units between the buckets of a hot voucher
// (issue #21): each bucket is a hash on its own shard, so on a Redis
// Cluster on its own master, and no script can touch two of them. A unit
// that moves is never in two buckets and never in none: the donor
// journals the move in the step that takes the units, the receiver
// applies a move id once, and a Recoverer finishes or returns every
// journaled move whose mover died.
//
// The protocol, for a move t of k units from donor bucket d to receiver
// bucket r (keys in keys.go; every step is one script, atomic on its
// master):
//
//	step          | written where                 | a crash right after leaves      | repaired by
//	--------------+-------------------------------+---------------------------------+------------------------------
//	T1 take       | d: stock-=k alloc-=k out+=k,  | k units in d's journal (in      | Recoverer (entry older than
//	(take.lua)    | journal[t]=v:r:k:nb:at        | transit), nowhere else          | StaleAfter): resolve on r
//	              |                               |                                 | writes "refused"; close on d
//	              |                               |                                 | gives the k back to d
//	WAIT n (1)    | (d's replicas)                | as T1; short of n: the mover    | as T1; a failover that lost
//	              |                               | closes it refused at once (T3)  | T1 lost that close with it
//	T2 apply      | r: stock+=k alloc+=k,         | k units in r, t still in d's    | Recoverer: resolve on r reads
//	(apply.lua)   | mark[t]="applied" PX MarkTTL  | journal (out still counts them) | "applied"; close on d: out-=k
//	              | (too old: mark "refused" only)| ("refused": k still in transit) | ("refused": k back to d)
//	WAIT n        | (r's replicas)                | as T2; short of n: stops here   | as T2
//	T3 close      | d: out-=k (refused: stock+=k  | nothing in transit              | -
//	(close.lua)   | alloc+=k too), journal[t] del |                                 |
//	resolve       | r: mark[t]="refused" if none  | t's outcome final: a late apply | close on d with the mark
//	(resolve.lua) | (a tombstone)                 | of t is refused                 |
//	close, d not  | d: journal[t] del only        | d's alloc short of r's receipt  | d's rebuild (Quiesce) counts
//	ready, or no  |                               | or of a refused return          | alloc from the other buckets
//	state (left   |                               |                                 | (its load, for one left out)
//	out: DropAt)  |                               |                                 |
//	(t older than | no tombstone: the Recoverer   | r's mark may have expired: the  | - (a move never applied loses
//	MarkTTL/2)    | closes t with r's mark, or as | outcome read, never written     | its k units, logged: never
//	              | applied when it is gone       |                                 | made twice)
//
// (1) n is every replica the master has, at least SECKILL_REDIS_WAIT_REPLICAS
// (runner in scripts.go): a take the donor's failover lost while its
// receiver applied it would put its units in two buckets, and the cluster
// may promote any replica. A replayed apply or resolve writes nothing; its
// WAIT, on the same connection, waits for the offset at that read, so for
// the mark's first write too.
//
// Conservation, over a voucher's ready buckets: sum(alloc) + units taken
// and not applied = total. sum(out) counts the journaled moves, applied
// or not, so sum(alloc) + sum(out) = total holds once every applied move
// is closed (the tests check it with the journals empty).
//
// An apply is refused when the take is older than ApplyWindow by the
// receiver's clock, so a rebuild that fenced every bucket and waited the
// window out knows that no move it did not see can still arrive. The
// window is read on two clocks (the donor's at the take, the receiver's
// at the apply): the masters' clocks must agree to well within it (NTP).
package bucket

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"seckill/internal/lease"
	"seckill/internal/redisconn"
	"seckill/internal/voucher"
)

// Config tunes the moves; zero fields take the defaults.
type Config struct {
	// WaitReplicas is the least replicas WAIT asks for after a take, an
	// apply and a resolve; every replica the master has is asked for
	// (none: no WAIT), so that no failover loses a step a later one
	// builds on.
	WaitReplicas int
	// WaitTimeout bounds each WAIT (default 100ms).
	WaitTimeout time.Duration
	// Replicas, when set, lets a master with no replica at all confirm a
	// step alone (redisconn.Replicas): a failover cannot lose it, and the
	// units of a bucket whose replica took over move again.
	Replicas *redisconn.Replicas
	// StaleAfter is how old a journaled move must be before the
	// Recoverer finishes it (default 3s): a live mover finishes in
	// milliseconds.
	StaleAfter time.Duration
	// ApplyWindow is how old a take may be when it is applied (default
	// 2s); a rebuild waits it out with the voucher's buckets fenced.
	ApplyWindow time.Duration
	// BorrowMax bounds the units one Borrow moves (default 256).
	BorrowMax int
	// MarkTTL is how long a receiver keeps a move's mark (default 1h).
	MarkTTL time.Duration
	// LeaseTTL is the voucher's lease a Quiesce holds, renewed every
	// third of it while the rebuild goes on (default 30s, at least
	// lease.Min). Fences have no time to live (quiesce.go).
	LeaseTTL time.Duration
	// Paused, when set, hears how long each Quiesce kept the voucher's
	// other buckets fenced (from the first fence set to the last of theirs
	// lifted): a dry bucket cannot borrow meanwhile.
	Paused func(time.Duration)
	// AfterStep, when set, is called after the steps "take" and "apply"
	// of a Move; true stops the move there, as a crash would (tests).
	AfterStep func(step string) bool
}

func (c Config) withDefaults() Config {
	c.WaitTimeout = cmp.Or(c.WaitTimeout, 100*time.Millisecond)
	c.StaleAfter = cmp.Or(c.StaleAfter, 3*time.Second)
	c.ApplyWindow = cmp.Or(c.ApplyWindow, 2*time.Second)
	c.BorrowMax = cmp.Or(c.BorrowMax, 256)
	c.MarkTTL = cmp.Or(c.MarkTTL, time.Hour)
	c.LeaseTTL = max(cmp.Or(c.LeaseTTL, 30*time.Second), lease.Min)
	return c
}

// Stats counts closed moves.
type Stats struct {
	Applied  int64 // moves closed as applied
	Returned int64 // moves closed as refused: units back to the donor
	Units    int64 // units of the applied moves
}

type stats struct{ applied, returned, units atomic.Int64 }

func (s *stats) get() Stats {
	return Stats{s.applied.Load(), s.returned.Load(), s.units.Load()}
}

// Mover moves units between the buckets of a voucher. It is a
// voucher.Borrower and a voucher.Quiescer.
type Mover struct {
	rdb   redis.UniversalClient
	keys  voucher.Keys
	cfg   Config
	log   *slog.Logger
	s     scripts
	r     runner
	group singleflight.Group
	stats stats
}

// NewMover returns a Mover on rdb, with keys spelled by keys.
func NewMover(rdb redis.UniversalClient, keys voucher.Keys, cfg Config, log *slog.Logger) *Mover {
	cfg = cfg.withDefaults()
	return &Mover{
		rdb: rdb, keys: keys, cfg: cfg, log: log, s: newScripts(),
		r: runner{rdb: rdb, replics: cfg.WaitReplicas, timeout: cfg.WaitTimeout, replicas: cfg.Replicas,
			counts: redisconn.NewReplicaCounts()},
	}
}

// Stats counts the moves this Mover's Move calls closed.
func (m *Mover) Stats() Stats { return m.stats.get() }

// entry is a journaled move, as its donor's journal holds it.
type entry struct {
	id    string
	donor int // the donor's shard: the journal's
	v     int64
	to    int // the receiving bucket
	units int
	nb    int
	at    int64 // ms, the donor's clock at the take
}

// parseEntry reads the journal record "<v>:<to>:<k>:<nb>:<at ms>".
func parseEntry(donor int, id, rec string) (entry, error) {
	f := strings.Split(rec, ":")
	if len(f) != 5 {
		return entry{}, fmt.Errorf("journal entry %s %q: not v:to:k:nb:at", id, rec)
	}
	var n [5]int64
	for i, s := range f {
		var err error
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return entry{}, fmt.Errorf("journal entry %s %q: %w", id, rec, err)
		}
	}
	e := entry{id: id, donor: donor, v: n[0], to: int(n[1]), units: int(n[2]), nb: int(n[3]), at: n[4]}
	if e.units <= 0 || e.nb < 2 || e.to < 0 || e.to >= e.nb {
		return entry{}, fmt.Errorf("journal entry %s %q: out of range", id, rec)
	}
	return e, nil
}

// receiver is the shard of the entry's receiving bucket.
func (m *Mover) receiver(e entry) int { return m.keys.BucketShard(e.v, e.to, e.nb) }

// Move moves up to k units of voucher v from bucket from to bucket to
// (of nb): T1, WAIT, T2, WAIT, T3 of the table above. It returns the
// units the receiver got: k or less (the donor's stock), or 0 when the
// apply was refused and the units went back. An error after T1 leaves
// the move in the journal, for the Recoverer.
func (m *Mover) Move(ctx context.Context, v int64, from, to, k, nb int) (int, error) {
	if nb < 2 || from == to || from < 0 || to < 0 || from >= nb || to >= nb || k <= 0 {
		return 0, fmt.Errorf("move voucher %d: %d units from bucket %d to %d of %d: out of range", v, k, from, to, nb)
	}
	e, err := m.take(ctx, lease.NewToken(), v, from, to, k, nb)
	if err != nil && e.id != "" {
		// Journaled but not confirmed by the donor's replicas: the move
		// goes no further, so its units go back now (no apply will come:
		// only this call applies it) rather than wait StaleAfter in
		// transit. A failover that loses the take loses this close too.
		cctx, cancel := cleanup(ctx)
		defer cancel()
		if cerr := m.close(cctx, e, outcomeRefused, &m.stats); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("move voucher %d from bucket %d to %d: take: %w", v, from, to, err)
	}
	if m.stopAfter("take") {
		return 0, fmt.Errorf("move %s: %w: take", e.id, ErrStopped)
	}
	outcome, err := m.applyOrResolve(ctx, e)
	if err != nil {
		return 0, fmt.Errorf("move %s of voucher %d to bucket %d: %w", e.id, v, to, err)
	}
	if m.stopAfter("apply") {
		return 0, fmt.Errorf("move %s: %w: apply", e.id, ErrStopped)
	}
	if err := m.close(ctx, e, outcome, &m.stats); err != nil {
		return 0, fmt.Errorf("move %s of voucher %d: %w", e.id, v, err)
	}
	if outcome != outcomeApplied {
		return 0, nil
	}
	return e.units, nil
}

// cleanup is the context of a step that must run even when ctx has ended
// (giving units back, lifting fences), bounded on its own.
func cleanup(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
}

func (m *Mover) stopAfter(step string) bool { return m.cfg.AfterStep != nil && m.cfg.AfterStep(step) }

// take is T1 on the donor, confirmed by WAIT: the move's journal entry,
// also with the error when the take was journaled but not confirmed.
func (m *Mover) take(ctx context.Context, id string, v int64, from, to, k, nb int) (entry, error) {
	d := m.keys.BucketShard(v, from, nb)
	keys := []string{m.keys.Ready(d), m.keys.StateAt(d, v), journalKey(m.keys, d), fencesKey(m.keys, d)}
	res, err := m.r.run(ctx, m.s.take, true, keys, id, k, v, to, nb)
	if res == nil && err != nil {
		return entry{}, err
	}
	rec, _, derr := decodeTake(res)
	if derr != nil {
		return entry{}, derr
	}
	e, perr := parseEntry(d, id, rec)
	if perr != nil {
		return entry{}, perr
	}
	if err != nil {
		return e, fmt.Errorf("move %s journaled: %w", id, err)
	}
	return e, nil
}

// applyOrResolve is T2 on the receiver, confirmed by WAIT: the move's
// outcome. A receiver that cannot take the units (not ready, no state)
// has the move refused for good by resolve instead, so the close gives
// them back at once.
func (m *Mover) applyOrResolve(ctx context.Context, e entry) (string, error) {
	r := m.receiver(e)
	keys := []string{m.keys.Ready(r), m.keys.StateAt(r, e.v), markKey(m.keys, r, e.id)}
	res, err := m.r.run(ctx, m.s.apply, true, keys,
		e.units, e.at, m.cfg.ApplyWindow.Milliseconds(), m.cfg.MarkTTL.Milliseconds())
	if res == nil && err != nil {
		return "", fmt.Errorf("apply: %w", err)
	}
	outcome, derr := decodeApply(res)
	switch {
	case derr == nil && err != nil:
		return "", fmt.Errorf("apply %s: %w", outcome, err)
	case derr == nil:
		return outcome, nil
	case errors.Is(derr, ErrNotReady) || errors.Is(derr, ErrNoState):
		return m.resolve(ctx, e)
	}
	return "", fmt.Errorf("apply: %w", derr)
}

// resolve settles the move's outcome on the receiver, confirmed by WAIT:
// the mark, or a "refused" tombstone written now.
func (m *Mover) resolve(ctx context.Context, e entry) (string, error) {
	key := markKey(m.keys, m.receiver(e), e.id)
	res, err := m.r.run(ctx, m.s.resolve, true, []string{key}, m.cfg.MarkTTL.Milliseconds())
	if res == nil && err != nil {
		return "", fmt.Errorf("resolve: %w", err)
	}
	outcome, derr := decodeResolve(res)
	if derr != nil {
		return "", fmt.Errorf("resolve: %w", derr)
	}
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", outcome, err)
	}
	return outcome, nil
}

// close is T3 on the donor: the entry dropped with its outcome, counted
// in st when this call closed it.
func (m *Mover) close(ctx context.Context, e entry, outcome string, st *stats) error {
	keys := []string{m.keys.Ready(e.donor), m.keys.StateAt(e.donor, e.v), journalKey(m.keys, e.donor)}
	res, err := m.r.run(ctx, m.s.close, false, keys, e.id, outcome)
	if err != nil {
		return fmt.Errorf("close %s: %w", outcome, err)
	}
	c, err := decodeClose(res)
	if err != nil {
		return fmt.Errorf("close %s: %w", outcome, err)
	}
	if c == forgotten {
		m.log.Warn("move closed on a donor not ready: its rebuild counts the units",
			"move", e.id, "voucher", e.v, "donor_shard", e.donor, "outcome", outcome, "units", e.units)
	}
	if c == closedNow || c == forgotten {
		st.count(outcome, e.units)
	}
	return nil
}

func (s *stats) count(outcome string, units int) {
	if outcome == outcomeApplied {
		s.applied.Add(1)
		s.units.Add(int64(units))
		return
	}
	s.returned.Add(1)
}

// settle finishes a journaled move whose mover may be gone: resolve on
// the receiver, WAIT, close on the donor with the outcome.
//
// A move older than half of MarkTTL may have outlived its mark (the
// receiver down for that long, say): a resolve could then refuse an
// applied move and give its units back twice. Its outcome is read, never
// written: the mark if it is still there, else "applied". No apply of it
// can land any more (it is far past ApplyWindow), so whether or not it was
// applied, closing it as applied can lose its units, never make them
// twice; a loss is logged with its units, for an operator to add them
// back (reconcile's "alloc" line shows it).
func (m *Mover) settle(ctx context.Context, j journaled, st *stats) (outcome string, err error) {
	if j.age <= m.cfg.MarkTTL/2 {
		outcome, err := m.resolve(ctx, j.e)
		if err != nil {
			return "", err
		}
		return outcome, m.close(ctx, j.e, outcome, st)
	}
	mark, err := m.rdb.Get(ctx, markKey(m.keys, m.receiver(j.e), j.id)).Result()
	switch {
	case errors.Is(err, redis.Nil):
		mark = outcomeApplied
		m.log.Warn("move older than its mark closed as applied: if it never was, its units are lost",
			"move", j.id, "voucher", j.e.v, "to_bucket", j.e.to, "units", j.e.units, "age", j.age)
	case err != nil:
		return "", fmt.Errorf("move %s, %s old: read its mark: %w", j.id, j.age, err)
	case mark != outcomeApplied && mark != outcomeRefused:
		return "", fmt.Errorf("move %s mark %q: %w", j.id, mark, ErrWrongType)
	}
	return mark, m.close(ctx, j.e, mark, st)
}
