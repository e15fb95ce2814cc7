package testenv

import (
	"context"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, and fails the test when it does not
// within the deadline: tests wait on conditions, never on sleeps. what
// names the condition in the failure.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// poll runs check until it returns nil, and fails the test with the last
// error when within passes: the error says why the condition does not
// hold, which "not within" alone would not. Each check gets 5 s, so a
// paused server makes it fail, not hang.
func poll(tb testing.TB, within time.Duration, what string, check func(context.Context) error) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := check(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %s: %v", what, within, err)
		}
		time.Sleep(20 * time.Millisecond) // poll interval, not a wait for an event
	}
}
