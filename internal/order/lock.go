package order

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/redis/go-redis/v9"
)

// Locks is the per-buyer lock the worker holds while it writes a buyer's
// order: the one-order-per-user lock of the classic design. It sits in front
// of the database's unique key, which stays the real guarantee (a lock can
// expire under a pause). With several independent Redis nodes it is a
// Redlock: a lock is held when a majority granted it.
type Locks struct {
	rs  *redsync.Redsync
	ttl time.Duration
	log *slog.Logger
}

// NewLocks returns the locks on the given nodes (one, or several
// independent ones). ttl bounds how long a crashed holder blocks a buyer;
// the watchdog extends it while a write runs.
func NewLocks(nodes []redis.UniversalClient, ttl time.Duration, log *slog.Logger) *Locks {
	pools := make([]rsredis.Pool, len(nodes))
	for i, n := range nodes {
		pools[i] = newPipePool(n)
	}
	return &Locks{rs: redsync.New(pools...), ttl: cmp.Or(ttl, 10*time.Second), log: log}
}

// errLockTaken means another worker holds the lock.
var errLockTaken = errors.New("lock held elsewhere")

// tryAll tries each lock once, without waiting, all at once. The value of
// lock i is values[i]: the order it is taken for, so a lock left behind by
// an earlier try of the same order (a batch that failed before its
// release) is taken over instead of waited out. held[i] is nil when key i
// is held for another order. An error means a node failed and no
// conclusion can be drawn; whatever was taken is released.
func (l *Locks) tryAll(ctx context.Context, keys, values []string) ([]*redsync.Mutex, error) {
	held := make([]*redsync.Mutex, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, 128)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			v := values[i]
			mutex := func() *redsync.Mutex {
				return l.rs.NewMutex(k, redsync.WithExpiry(l.ttl), redsync.WithTries(1), redsync.WithFailFast(true),
					redsync.WithValue(v), redsync.WithGenValueFunc(func() (string, error) { return v, nil }))
			}
			m := mutex()
			err := m.TryLockContext(ctx)
			if err != nil && taken(err) {
				// Ours from an earlier try? Extending succeeds only where
				// the value is this order's. (redsync's clean-up after a
				// failed try deletes the keys holding our value, so a
				// second try then succeeds instead.) The second try uses
				// a Mutex of its own: with fail-fast, calls of the first
				// may still be running on the slower nodes.
				if ok, _ := m.ExtendContext(ctx); ok {
					err = nil
				} else {
					m = mutex()
					err = m.TryLockContext(ctx)
				}
			}
			switch {
			case err == nil:
				held[i] = m
			case taken(err):
				errs[i] = errLockTaken
			default:
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, errLockTaken) {
			l.release(ctx, held)
			return nil, fmt.Errorf("take buyer locks: %w", err)
		}
	}
	return held, nil
}

// taken reports a refusal because someone holds the lock, as opposed to a
// node that could not be asked.
func taken(err error) bool {
	var t *redsync.ErrTaken
	var nt *redsync.ErrNodeTaken
	return errors.As(err, &t) || errors.As(err, &nt) || errors.Is(err, redsync.ErrFailed)
}

// watch extends the held locks every ttl/3 until stop is called.
func (l *Locks) watch(ctx context.Context, held []*redsync.Mutex) (stop func()) {
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(l.ttl / 3)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			// All at once, as they were taken: one by one, a batch of
			// hundreds would wait a round trip each and the last could
			// expire before its turn.
			var wg sync.WaitGroup
			for _, m := range held {
				if m == nil {
					continue
				}
				wg.Go(func() {
					if ok, err := m.ExtendContext(wctx); !ok && wctx.Err() == nil {
						// The write goes on: the database's keys keep it
						// correct without the lock.
						l.log.Warn("buyer lock could not be extended", "lock", m.Name(), "err", err)
					}
				})
			}
			wg.Wait()
		}
	}()
	return func() { cancel(); <-done }
}

// release unlocks what is held. A lock that expired and was taken by
// someone else is left alone: redsync deletes only its own value.
func (l *Locks) release(ctx context.Context, held []*redsync.Mutex) {
	var wg sync.WaitGroup
	for _, m := range held {
		if m == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.UnlockContext(ctx); err != nil && !errors.Is(err, redsync.ErrLockAlreadyExpired) {
				l.log.Debug("buyer lock not released; it expires", "lock", m.Name(), "err", err)
			}
		}()
	}
	wg.Wait()
}
