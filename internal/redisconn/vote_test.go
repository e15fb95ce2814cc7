package redisconn

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"seckill/internal/testenv"
)

// TestConcurrentWritesShareOneVote: 200 writes that find a lone master's
// vote stale at once ask the other masters once between them, and all get
// its answer; a write for another master votes on its own.
func TestConcurrentWritesShareOneVote(t *testing.T) {
	const writes = 200
	var asked atomic.Int64
	release := make(chan struct{})
	r := NewReplicas(func(ctx context.Context, addr string) ([]string, int) {
		asked.Add(1)
		if addr == "a:1" {
			<-release
		}
		return nil, 1 // a lone master: its own vote is the majority
	})
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		yes   atomic.Int64
	)
	for range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if r.agreed(context.Background(), "a:1", "node-a") {
				yes.Add(1)
			}
		}()
	}
	close(start)
	testenv.WaitFor(t, 30*time.Second, "every write waiting on the one vote", func() bool {
		return r.asking.Load() == writes
	})
	if !r.agreed(context.Background(), "b:1", "node-b") {
		t.Error("another master's vote waited for a:1's or lost")
	}
	close(release)
	wg.Wait()
	if n := asked.Load(); n != 2 {
		t.Errorf("%d votes asked, want one for a:1 and one for b:1", n)
	}
	if n := yes.Load(); n != writes {
		t.Errorf("%d of %d writes heard the vote agree", n, writes)
	}
}
