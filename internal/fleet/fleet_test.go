package fleet

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"seckill/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestRegistry: a running instance is listed with its schema version at
// once; an entry past its time is not, and is deleted by the reader; the
// instance's entry goes when it stops.
func TestRegistry(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewRegistry(rdb, prefix, "a", 7, slog.New(slog.DiscardHandler)).Run(ctx) }()

	lapsed := value(6, time.Now().Add(-time.Second))
	if err := rdb.HSet(context.Background(), Key(prefix), "killed", lapsed, "bad", "schema=x").Err(); err != nil {
		t.Fatal(err)
	}
	var got []Member
	testenv.WaitFor(t, 5*time.Second, "a listed", func() bool {
		var err error
		got, err = Running(context.Background(), rdb, prefix, time.Now())
		return err == nil && len(got) == 1
	})
	if got[0].Name != "a" || got[0].Schema != 7 || time.Until(got[0].Until) < TTL-2*time.Second {
		t.Fatalf("running: %+v; want a, schema 7, until about %s from now", got, TTL)
	}
	if n, _ := rdb.HLen(context.Background(), Key(prefix)).Result(); n != 1 {
		t.Fatalf("%d entries after a read; want the lapsed and the unreadable ones deleted", n)
	}
	if older := Older(got, 8); len(older) != 1 || len(Older(got, 7)) != 0 {
		t.Fatalf("Older(8) = %v, Older(7) = %v", older, Older(got, 7))
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := rdb.HLen(context.Background(), Key(prefix)).Result(); n != 0 {
		t.Fatalf("%d entries after the instance stopped; want none", n)
	}
}
