package testenv

import (
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
