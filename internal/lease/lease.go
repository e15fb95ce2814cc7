// Package lease holds a Redis lease while work goes on: taken with a
// random token, renewed by a watchdog every third of its time to live (as
// Redisson renews its locks), released by compare-and-delete. A holder
// that cannot renew in time, or finds another token in the key, is told
// through its context, whose cause is ErrLost.
//
// A lease only tells the holder when to stop. It is not a guarantee on its
// own: a holder can be paused between a check and a write for longer than
// the lease lives. Every write made under a lease checks a fencing token
// where it lands (see internal/bucket/quiesce.go and lua/reopen.lua).
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/lua"
)

// ErrLost is the cause of a held lease's context when the lease was
// taken by another, expired, or could not be renewed before it would.
var ErrLost = errors.New("lease lost")

// Min is the shortest lease Keep renews: a third of it must cover a
// renewal's round trip.
const Min = time.Second

// Lease is a lease held by this process, kept alive until Release or
// Stop, or until it is lost.
type Lease struct {
	rdb        redis.Scripter
	key, token string
	ttl        time.Duration
	ctx        context.Context
	cancel     context.CancelCauseFunc
	stop       chan struct{}
	stopOnce   sync.Once
	done       chan struct{}
	// base and held say when the last renewal (or the taking) was sent:
	// held is its offset from base, on the monotonic clock.
	base time.Time
	held atomic.Int64
}

// NewToken names one holder.
func NewToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

var (
	renewScript   = lua.RenewLease()
	releaseScript = lua.ReleaseLease()
)

// Take sets key to a new token for ttl if nobody holds it, and keeps it
// (Keep). took is false when another holds it.
func Take(ctx context.Context, rdb redis.UniversalClient, key string, ttl time.Duration) (l *Lease, took bool, err error) {
	token, sent := NewToken(), time.Now()
	took, err = rdb.SetNX(ctx, key, token, max(ttl, Min)).Result()
	if err != nil || !took {
		return nil, false, err
	}
	return Keep(ctx, rdb, key, token, ttl, sent), true, nil
}

// Keep starts renewing a lease that token holds in key (taken by the
// caller, in whatever script took it, sent at sent) every ttl/3, until
// Release, Stop or ctx's end. The lease is assumed held until ttl after
// the taking or the last renewal was sent: a renewal that finds another
// token, or none arriving by then, ends Context with ErrLost.
func Keep(ctx context.Context, rdb redis.Scripter, key, token string, ttl time.Duration, sent time.Time) *Lease {
	ttl = max(ttl, Min)
	lctx, cancel := context.WithCancelCause(ctx)
	l := &Lease{rdb: rdb, key: key, token: token, ttl: ttl, ctx: lctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}), base: time.Now()}
	l.held.Store(int64(sent.Sub(l.base)))
	go l.watch(sent)
	return l
}

// Context ends when the lease is lost (cause ErrLost), stopped or
// released, or the context Keep was given ends. Work done under the lease
// runs in it.
func (l *Lease) Context() context.Context { return l.ctx }

// Token is the holder's token.
func (l *Lease) Token() string { return l.token }

// Err is nil while the lease is held, else why it is not. A lease whose
// time ran out is lost here at once, before its watchdog ticks: a process
// resumed from a pause (SIGSTOP, a stalled VM) runs its work before its
// timers, and must not take a step that failed then for an ordinary one.
func (l *Lease) Err() error {
	if err := context.Cause(l.ctx); err != nil {
		return err
	}
	return l.expired()
}

// expired is ErrLost once the lease's time has run out since the last
// renewal (or the taking) was sent, else nil.
func (l *Lease) expired() error {
	if time.Since(l.base)-time.Duration(l.held.Load()) < l.ttl {
		return nil
	}
	return fmt.Errorf("%s: not renewed within %s: %w", l.key, l.ttl, ErrLost)
}

// watch renews the lease every ttl/3. held is when the last renewal (or
// the taking) was sent: the lease lives at least ttl past it, and is
// taken as lost then, whether or not a renewal is still waiting for its
// answer (a client's read timeout can be longer than the lease).
func (l *Lease) watch(held time.Time) {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		deadline := held.Add(l.ttl)
		sent := time.Now()
		if !sent.Before(deadline) {
			l.cancel(fmt.Errorf("%s: not renewed within %s: %w", l.key, l.ttl, ErrLost))
			return
		}
		switch ok, err := l.renew(deadline); {
		case err != nil:
			l.cancel(err)
			return
		case ok:
			held = sent
			l.held.Store(int64(sent.Sub(l.base)))
		}
		// Not renewed (Redis did not answer): tried again next tick,
		// until the deadline.
	}
}

// renew sends one renewal and waits for its answer until deadline, or
// until Stop. ok is whether it renewed (false, with no error, when Redis
// did not answer: tried again); err is ErrLost when the key holds another
// token or the deadline passed, context.Canceled when Stop was called.
func (l *Lease) renew(deadline time.Time) (ok bool, err error) {
	type answer struct {
		n   int
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		// Ends by the client's own timeouts at the latest.
		rctx, cancel := context.WithDeadline(context.WithoutCancel(l.ctx), deadline)
		defer cancel()
		n, err := renewScript.Run(rctx, l.rdb, []string{l.key}, l.token, l.ttl.Milliseconds()).Int()
		ch <- answer{n, err}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case a := <-ch:
		switch {
		case a.err != nil:
			return false, nil
		case a.n != 1:
			return false, fmt.Errorf("%s: held by another or expired: %w", l.key, ErrLost)
		}
		return true, nil
	case <-timer.C:
		return false, fmt.Errorf("%s: not renewed within %s: %w", l.key, l.ttl, ErrLost)
	case <-l.stop:
		return false, context.Canceled
	}
}

// Stop ends the watchdog and the lease's context, leaving the key to
// expire (or to be dropped by a script that checks the token).
func (l *Lease) Stop() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
	if err := l.expired(); err != nil {
		l.cancel(err) // Err keeps saying it was lost, not stopped
	}
	l.cancel(context.Canceled)
}

// Release stops the watchdog and drops the key if it still holds the
// token: a lease taken over by another is left alone.
func (l *Lease) Release(ctx context.Context) error {
	l.Stop()
	if err := releaseScript.Run(ctx, l.rdb, []string{l.key}, l.token).Err(); err != nil {
		return fmt.Errorf("release %s: %w", l.key, err)
	}
	return nil
}
