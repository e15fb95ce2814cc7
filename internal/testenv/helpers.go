package testenv

import (
	"bytes"
	"strconv"
	"sync"
	"testing"
)

// FreePort returns a loopback port that was free a moment ago, for a
// process the test starts.
func FreePort(tb testing.TB) string {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return strconv.Itoa(p)
}

// Buffer collects the output of a process or goroutine under test, safe to
// write and read at once. The bytes.Buffer is a named field, not embedded:
// an embedded one's ReadFrom would let os/exec copy around the lock.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
