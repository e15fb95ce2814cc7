package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// taken is a lease of Min's life taken on the tests' Redis under a key of
// the test's own: the client, the key and the lease.
func taken(t *testing.T) (*redis.Client, string, *Lease) {
	t.Helper()
	rdb := testenv.Redis(t)
	key := testenv.Prefix(t) + ":lease"
	l, took, err := Take(context.Background(), rdb, key, Min)
	if err != nil || !took {
		t.Fatalf("Take = %v, %v", took, err)
	}
	return rdb, key, l
}

// TestKeepRenews: a lease held three times its time to live is still the
// holder's, its context alive; Release drops it.
func TestKeepRenews(t *testing.T) {
	t.Parallel()
	rdb, key, l := taken(t)
	ctx := context.Background()
	if _, again, err := Take(ctx, rdb, key, Min); err != nil || again {
		t.Fatalf("second Take = %v, %v; want held", again, err)
	}
	began := time.Now()
	testenv.WaitFor(t, 20*time.Second, "three times the lease's life", func() bool {
		if got, _ := rdb.Get(ctx, key).Result(); got != l.Token() || l.Err() != nil {
			t.Fatalf("after %s the lease holds %q (err %v), want the holder's", time.Since(began), got, l.Err())
		}
		return time.Since(began) > 3*Min
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.Exists(ctx, key).Result(); n != 0 {
		t.Error("lease left after Release")
	}
	if !errors.Is(l.Err(), context.Canceled) {
		t.Errorf("Err after Release = %v, want canceled", l.Err())
	}
}

// TestKeepLost: a lease taken by another is not renewed back: the
// holder's context ends with ErrLost within a renewal, and its Release
// leaves the other's lease alone.
func TestKeepLost(t *testing.T) {
	t.Parallel()
	rdb, key, l := taken(t)
	ctx := context.Background()
	if err := rdb.Set(ctx, key, "another", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the holder told", func() bool { return l.Context().Err() != nil })
	if !errors.Is(l.Err(), ErrLost) {
		t.Errorf("cause %v, want ErrLost", l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := rdb.Get(ctx, key).Result(); got != "another" {
		t.Errorf("lease %q after the old holder's Release, want another's", got)
	}
}

// TestKeepUnreachable: a holder whose renewals get no answer (Redis
// paused) is told the lease is lost once its time to live has passed
// since the last renewal it sent, not later.
func TestKeepUnreachable(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client(t)
	ctx := context.Background()
	l, took, err := Take(ctx, rdb, "lease", Min)
	if err != nil || !took {
		t.Fatalf("Take = %v, %v", took, err)
	}
	srv.Pause(t)
	defer srv.Kill(t)
	stopped := time.Now()
	testenv.WaitFor(t, 10*time.Second, "the holder told", func() bool { return l.Context().Err() != nil })
	if !errors.Is(l.Err(), ErrLost) {
		t.Errorf("cause %v, want ErrLost", l.Err())
	}
	// The loss is due at most a lease's life after the pause; the bound
	// leaves room for a loaded machine's scheduling (before, with the
	// client's read timeout in the way, it came 5.3 s after).
	if d := time.Since(stopped); d > 2*Min {
		t.Errorf("told %s after Redis paused, want within about the lease's %s", d, Min)
	}
	l.Stop()
}

// TestErrLostBeforeTheWatchdog: a holder whose lease ran out while it was
// paused (here: kept from a taking sent two lives ago, the key still
// holding its token) knows it is lost at once, before its watchdog's first
// tick, and still after Stop: a step that failed then is taken for a
// lease outlived, not for an ordinary failure.
func TestErrLostBeforeTheWatchdog(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	key, token := testenv.Prefix(t)+":lease", NewToken()
	ctx := context.Background()
	if err := rdb.Set(ctx, key, token, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	l := Keep(ctx, rdb, key, token, Min, time.Now().Add(-2*Min))
	if err := l.Err(); !errors.Is(err, ErrLost) {
		t.Errorf("Err of a lease that ran out = %v, want ErrLost", err)
	}
	l.Stop()
	if err := l.Err(); !errors.Is(err, ErrLost) {
		t.Errorf("Err after Stop = %v, want ErrLost", err)
	}
}
