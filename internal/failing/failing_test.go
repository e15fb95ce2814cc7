package failing

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// TestRoundLogsChangesOnly: a failure is logged when it starts and when
// its cause changes, not per round; its end once; a round cut short by
// the context's end not at all.
func TestRoundLogsChangesOnly(t *testing.T) {
	var buf strings.Builder
	f := Log{Log: slog.New(slog.NewTextHandler(&buf, nil)), What: "warming"}
	ctx := context.Background()
	down, refused := errors.New("connection refused"), errors.New("fence not confirmed")
	for _, err := range []error{nil, down, down, down, refused, refused, nil, nil} {
		f.Round(ctx, err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	f.Round(done, context.Canceled)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{"connection refused", "fence not confirmed", "warming works again"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d: %s, want %q in it", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[0], "warming failed; retrying") {
		t.Errorf("first line %s, want the failure named", lines[0])
	}
}
