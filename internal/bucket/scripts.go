package bucket

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/internal/voucher"
	"seckill/lua"
)

// Errors of the scripts' refusals; each script's answers are decoded in
// one function below.
var (
	// ErrEmpty: the donor bucket has no stock to give.
	ErrEmpty = errors.New("bucket stock is 0")
	// ErrFenced: the donor bucket refuses moves out (a rebuild holds it).
	ErrFenced = errors.New("bucket is fenced")
	// ErrNotReady: the bucket's shard is not ready (lost or rebuilding).
	ErrNotReady = errors.New("bucket shard not ready")
	// ErrNoState: the bucket has no state with the fields moves need.
	ErrNoState = errors.New("bucket has no state")
	// ErrWrongType: a key holds another type than the script reads.
	ErrWrongType = errors.New("key holds another type")
	// ErrNotReplicated: fewer replicas than WaitReplicas confirmed a step
	// in time; the move stops there and the Recoverer finishes it.
	ErrNotReplicated = errors.New("step not confirmed by enough replicas")
	// ErrStopped: the AfterStep hook stopped a move, as a crash would.
	ErrStopped = errors.New("move stopped after a step")
	// ErrLeaseHeld: another instance quiesces the voucher; try next round.
	ErrLeaseHeld = voucher.ErrHeld
	// ErrFenceLost: a bucket's fence holds another rebuild's token (this
	// one stalled past its lease and was taken over) or none.
	ErrFenceLost = fmt.Errorf("bucket fence held by another rebuild: %w", voucher.ErrTakenOver)
)

// Outcomes of a move on its receiver, as its mark spells them.
const (
	outcomeApplied = "applied"
	outcomeRefused = "refused"
)

// scripts are the move's Lua scripts.
type scripts struct {
	take, apply, resolve, close, fence, releaseLease *redis.Script
}

func newScripts() scripts {
	return scripts{lua.Take(), lua.Apply(), lua.Resolve(), lua.Close(), lua.Fence(), lua.ReleaseLease()}
}

// runner runs a script on the master of its first key and, when asked to
// confirm a step, sends WAIT on the same connection, which counts the
// replicas holding that connection's writes: for every replica the master
// has, and at least the replicas wanted (SECKILL_REDIS_WAIT_REPLICAS). A
// step a failover could lose is never built on: without that, a donor
// failing over after a take whose receiver applied it would come back
// with the units and sell them a second time. Every replica, not n of
// them: the cluster may promote any one, the one that missed the take
// too (a purchase may settle for n: a lost purchase is healed or dead
// lettered, a unit in two buckets is sold twice). A step replayed (an
// apply or resolve that finds its mark) writes nothing, and its WAIT still
// covers the mark's first write: Redis takes the offset WAIT waits for at
// the connection's last command, a read too (TestReplayedStepConfirmsItsMark).
type runner struct {
	rdb      redis.UniversalClient
	replics  int
	timeout  time.Duration
	replicas *redisconn.Replicas // a master with none confirms alone
	// counts tells how many replicas each master has, when replics is 0.
	counts *redisconn.ReplicaCounts
}

// run returns the script's reply; with ack and replicas wanted, an
// error wrapping ErrNotReplicated as well when WAIT falls short.
func (r runner) run(ctx context.Context, s *redis.Script, ack bool, keys []string, args ...any) (any, error) {
	if !ack {
		return s.Run(ctx, r.rdb, keys, args...).Result()
	}
	c, err := redisconn.MasterFor(ctx, r.rdb, keys[0])
	if err != nil {
		return nil, fmt.Errorf("find the master of %s: %w", keys[0], err)
	}
	conn := c.Conn()
	defer func() { _ = conn.Close() }()
	res, err := s.EvalSha(ctx, conn, keys, args...).Result()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		res, err = s.Eval(ctx, conn, keys, args...).Result()
	}
	if err != nil {
		return nil, err
	}
	has, err := r.counts.Count(ctx, conn, c.Options().Addr)
	if err != nil {
		return res, fmt.Errorf("count the replicas: %w", err)
	}
	want, rs := max(r.replics, has), r.replicas
	switch {
	case want == 0:
		return res, nil // nothing can take this master's place
	case has > 0:
		rs = nil // every replica known: none to confirm alone for
	}
	conf, err := rs.Confirm(ctx, conn, c.Options().Addr, want, r.timeout)
	if err != nil {
		return res, fmt.Errorf("wait for replicas: %w", err)
	}
	if !conf.OK(want) {
		return res, fmt.Errorf("%d of %d replicas within %s: %w", conf.Acked, want, r.timeout, ErrNotReplicated)
	}
	return res, nil
}

// reply splits a script's {code, detail?} answer.
func reply(res any) (code int64, detail string, err error) {
	a, ok := res.([]any)
	if !ok || len(a) == 0 {
		return 0, "", fmt.Errorf("unexpected script reply %v", res)
	}
	if code, ok = a[0].(int64); !ok {
		return 0, "", fmt.Errorf("unexpected script reply %v", res)
	}
	if len(a) > 1 {
		detail, _ = a[1].(string)
	}
	return code, detail, nil
}

// refusal is the error of the codes every script shares.
func refusal(code int64, detail string) error {
	switch code {
	case 6:
		return ErrNotReady
	case 7:
		return ErrNoState
	case 8:
		return fmt.Errorf("%s: %w", detail, ErrWrongType)
	}
	return fmt.Errorf("unknown script answer %d %q", code, detail)
}

// decodeTake reads take.lua's answer: the move's journal record, and
// whether this call took the units (false: journaled before).
func decodeTake(res any) (record string, now bool, err error) {
	code, detail, err := reply(res)
	switch {
	case err != nil:
		return "", false, err
	case code == 0 || code == 1:
		return detail, code == 0, nil
	case code == 2:
		return "", false, ErrEmpty
	case code == 3:
		return "", false, ErrFenced
	}
	return "", false, refusal(code, detail)
}

// decodeApply reads apply.lua's answer: the move's outcome on the
// receiver ("applied" or "refused"), now or before.
func decodeApply(res any) (outcome string, err error) {
	code, detail, err := reply(res)
	switch {
	case err != nil:
		return "", err
	case code == 0:
		return outcomeApplied, nil
	case code == 1 && (detail == outcomeApplied || detail == outcomeRefused):
		return detail, nil
	case code == 4:
		return outcomeRefused, nil
	case code == 1:
		return "", fmt.Errorf("move mark %q: %w", detail, ErrWrongType)
	}
	return "", refusal(code, detail)
}

// decodeResolve reads resolve.lua's answer: the move's settled outcome.
func decodeResolve(res any) (outcome string, err error) {
	code, detail, err := reply(res)
	switch {
	case err != nil:
		return "", err
	case (code == 0 || code == 1) && (detail == outcomeApplied || detail == outcomeRefused):
		return detail, nil
	case code == 0 || code == 1:
		return "", fmt.Errorf("move mark %q: %w", detail, ErrWrongType)
	}
	return "", refusal(code, detail)
}

// closed is what close.lua did with a journal entry.
type closed int

const (
	closedNow    closed = iota // closed with the outcome given
	closedBefore               // no such entry: closed by someone else
	forgotten                  // donor not ready: dropped, state untouched
)

// decodeClose reads close.lua's answer.
func decodeClose(res any) (closed, error) {
	code, detail, err := reply(res)
	switch {
	case err != nil:
		return 0, err
	case code == 0:
		return closedNow, nil
	case code == 1:
		return closedBefore, nil
	case code == 2:
		return forgotten, nil
	}
	return 0, refusal(code, detail)
}

// decodeFence reads fence.lua's answer: whether the fence held (lift)
// or was written (set) with the caller's value, and the other value
// found (set: the one overwritten; lift: the one there, "" none).
func decodeFence(res any) (held bool, other string, err error) {
	code, detail, err := reply(res)
	switch {
	case err != nil:
		return false, "", err
	case code == 1:
		return true, "", nil
	case code == 2:
		return true, detail, nil
	case code == 0:
		return false, detail, nil
	}
	return false, "", refusal(code, detail)
}
