package mq

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"seckill/internal/testenv"
	"seckill/lua"
)

// TestRedisErrorCodes: Redis's answers are recognised by their code, also
// when wrapped, as the consumer's reads and batches wrap them, and when a
// script passes one on; an error that only mentions the code is not one.
func TestRedisErrorCodes(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	stream, key := names(t)

	pendingErr := rdb.XPending(ctx, stream, "g").Err()
	scriptErr := lua.Retry().Run(ctx, rdb, []string{stream, key}, "g", "1-1", 1, "{}", "c").Err()
	xinfoErr := rdb.XInfoGroups(ctx, stream).Err()
	if err := EnsureGroup(ctx, rdb, stream, "g"); err != nil {
		t.Fatal(err)
	}
	busyErr := rdb.XGroupCreate(ctx, stream, "g", "0").Err()
	if err := rdb.Set(ctx, key+":string", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	wrongTypeErr := rdb.XInfoGroups(ctx, key+":string").Err()

	for _, c := range []struct {
		name           string
		err            error
		noGroup, noKey bool
		busy           bool
	}{
		{"XPENDING without a stream", pendingErr, true, false, false},
		{"wrapped twice", fmt.Errorf("handle batch of 1: %w", fmt.Errorf("read %s: %w", stream, pendingErr)), true, false, false},
		{"raised in a script", scriptErr, true, false, false},
		{"raised in a script, wrapped", fmt.Errorf("delay 1 entries: %w", scriptErr), true, false, false},
		{"XINFO without a stream", xinfoErr, false, true, false},
		{"XINFO without a stream, wrapped", fmt.Errorf("groups of %s: %w", stream, xinfoErr), false, true, false},
		{"group created twice", fmt.Errorf("create: %w", busyErr), false, false, true},
		{"XINFO on a string", wrongTypeErr, false, false, false},
		{"only mentions NOGROUP", errors.New("NOGROUP no such key"), false, false, false},
		{"nil", nil, false, false, false},
	} {
		if got := IsNoGroup(c.err); got != c.noGroup {
			t.Errorf("%s: IsNoGroup(%v) = %v, want %v", c.name, c.err, got, c.noGroup)
		}
		if got := IsNoStream(c.err); got != c.noKey {
			t.Errorf("%s: IsNoStream(%v) = %v, want %v", c.name, c.err, got, c.noKey)
		}
		if got := isBusyGroup(c.err); got != c.busy {
			t.Errorf("%s: isBusyGroup(%v) = %v, want %v", c.name, c.err, got, c.busy)
		}
	}
}
