package mq

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"seckill/internal/testenv"
	"seckill/lua"
)

// ackFixture is a stream of n entries with two groups, and the ids in order.
func ackFixture(t *testing.T, n int) (rdb *redis.Client, stream string, ids []string) {
	t.Helper()
	rdb = testenv.Redis(t)
	ctx := context.Background()
	stream, _ = names(t)
	for i := range n {
		id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"n": fmt.Sprint(i)}}).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, g := range []string{"g", "other"} {
		if err := rdb.XGroupCreate(ctx, stream, g, "0").Err(); err != nil {
			t.Fatal(err)
		}
	}
	return rdb, stream, ids
}

// deliver reads the next n entries of the stream for the group.
func deliver(t *testing.T, rdb *redis.Client, stream, group string, n int) {
	t.Helper()
	err := rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{
		Group: group, Consumer: "c", Streams: []string{stream, ">"}, Count: int64(n), Block: -1,
	}).Err()
	if err != nil {
		t.Fatal(err)
	}
}

// ack runs ack.lua for the group on ids.
func ack(t *testing.T, rdb *redis.Client, stream, group string, ids ...string) {
	t.Helper()
	args := []any{group}
	for _, id := range ids {
		args = append(args, id)
	}
	if err := lua.Ack().Run(context.Background(), rdb, []string{stream}, args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// left returns the ids still in the stream.
func left(t *testing.T, rdb *redis.Client, stream string) []string {
	t.Helper()
	es, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

// maxDeleted is the stream's max-deleted-entry-id: the highest id XDEL
// removed ("0-0" when XDEL never removed one; trimming leaves it alone).
func maxDeleted(t *testing.T, rdb *redis.Client, stream string) string {
	t.Helper()
	info, err := rdb.XInfoStream(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	return info.MaxDeletedEntryID
}

// TestAckTrimsBelowOldestPending: acknowledged entries that every group is
// done with go by one trim of the stream's head, not by XDEL one at a
// time (the cheaper way, and Redis records no deleted id for it); entries
// acknowledged above an older pending one go by XDEL. Either way exactly
// the acknowledged entries go: never a pending one, never one a group has
// not been delivered yet, never one another group still holds.
func TestAckTrimsBelowOldestPending(t *testing.T) {
	t.Parallel()
	rdb, stream, ids := ackFixture(t, 10)
	// The other group has been delivered and has acknowledged the first 6.
	deliver(t, rdb, stream, "other", 6)
	if err := rdb.XAck(context.Background(), stream, "other", ids[:6]...).Err(); err != nil {
		t.Fatal(err)
	}
	// g: 0-7 delivered, 8 and 9 not yet.
	deliver(t, rdb, stream, "g", 8)

	// g acknowledges 0-2, its oldest: they go by the trim.
	ack(t, rdb, stream, "g", ids[0], ids[1], ids[2])
	if got := left(t, rdb, stream); !slices.Equal(got, ids[3:]) {
		t.Fatalf("left %v, want %v", got, ids[3:])
	}
	if d := maxDeleted(t, rdb, stream); d != "0-0" {
		t.Fatalf("max deleted id %s: the head went by XDEL, want a trim", d)
	}

	// g acknowledges 5 and 6 while 3 and 4 are pending: they go by XDEL.
	ack(t, rdb, stream, "g", ids[5], ids[6])
	want := []string{ids[3], ids[4], ids[7], ids[8], ids[9]}
	if got := left(t, rdb, stream); !slices.Equal(got, want) {
		t.Fatalf("left %v, want %v", got, want)
	}

	// g acknowledges 3, 4 and 7: g has nothing pending, but the other group
	// has not been delivered 6 onwards, so only up to 5 may be trimmed;
	// 7 goes by XDEL; 8 and 9 (delivered to neither) stay.
	ack(t, rdb, stream, "g", ids[3], ids[4], ids[7])
	if got := left(t, rdb, stream); !slices.Equal(got, ids[8:]) {
		t.Fatalf("left %v, want %v", got, ids[8:])
	}
	if d := maxDeleted(t, rdb, stream); d != ids[7] {
		t.Fatalf("max deleted id %s, want %s (7 by XDEL)", d, ids[7])
	}

	// Both groups take and acknowledge the rest: the stream ends empty.
	deliver(t, rdb, stream, "g", 10)
	deliver(t, rdb, stream, "other", 10)
	if err := rdb.XAck(context.Background(), stream, "other", ids[6:]...).Err(); err != nil {
		t.Fatal(err)
	}
	ack(t, rdb, stream, "g", ids[8], ids[9])
	if got := left(t, rdb, stream); len(got) != 0 {
		t.Fatalf("left %v, want none", got)
	}
}

// TestAckWithoutStream: acknowledging on a stream that is gone (Redis lost
// its data) answers 0 without an error, as XACK and XDEL alone did.
func TestAckWithoutStream(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	stream, _ := names(t)
	n, err := lua.Ack().Run(context.Background(), rdb, []string{stream}, "g", "1-0", "2-0").Int()
	if err != nil || n != 0 {
		t.Fatalf("ack on a missing stream: %d, %v; want 0, nil", n, err)
	}
}

// TestAckKeepsWhatASetBackGroupReadsAgain: a group set back before its
// pending entries (XGROUP SETID) will read the entries below them again:
// an acknowledgement trims none of them, though they were acknowledged
// once.
func TestAckKeepsWhatASetBackGroupReadsAgain(t *testing.T) {
	t.Parallel()
	rdb, stream, ids := ackFixture(t, 5)
	ctx := context.Background()
	if err := rdb.XGroupDestroy(ctx, stream, "other").Err(); err != nil {
		t.Fatal(err)
	}
	deliver(t, rdb, stream, "g", 5)
	if err := rdb.XAck(ctx, stream, "g", ids[:3]...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.XGroupSetID(ctx, stream, "g", "0").Err(); err != nil {
		t.Fatal(err)
	}
	ack(t, rdb, stream, "g", ids[3])
	if got, want := left(t, rdb, stream), []string{ids[0], ids[1], ids[2], ids[4]}; !slices.Equal(got, want) {
		t.Fatalf("left %v, want %v: the entries the group reads again, and the one pending", got, want)
	}
}
