package main

import (
	"os"
	"sync"
	"syscall"
)

// Crash points of the fault tests (SECKILL_CRASH_POINT): each stops the
// worker dead at one place, so a test can check what the pipeline recovers
// from there. Never set in production.
const (
	// crashAfterCommit exits the process between the MySQL commit of a
	// batch and its XACK: redelivery must be a no-op.
	crashAfterCommit = "after_commit_before_ack"
	// crashHangAfterRead blocks the worker holding the batch it just read
	// (the test then kills it): another instance must reclaim the batch.
	crashHangAfterRead = "hang_after_read"
	// crashAfterTake and crashAfterApply exit the process in the middle
	// of a transfer of units between a voucher's buckets: after the donor
	// gave them (journaled), and after the receiver took them in (the
	// donor's journal entry still open). The recovery loop of another
	// instance finishes or returns the transfer.
	crashAfterTake  = "after_take_before_apply"
	crashAfterApply = "after_apply_before_close"
	// crashStopAfterBucket stops the process (SIGSTOP, as a pause of the
	// machine would) once, after the first bucket a shard rebuild wrote and
	// before the shard reopens: its leases lapse, another instance's
	// rebuild takes over, and the test resumes it with SIGCONT.
	crashStopAfterBucket = "stop_after_bucket_rebuild"
)

// crashPointValid reports whether p is empty or a known crash point.
func crashPointValid(p string) bool {
	switch p {
	case "", crashAfterCommit, crashHangAfterRead, crashAfterTake, crashAfterApply, crashStopAfterBucket:
		return true
	}
	return false
}

// crashHooks are the hooks a crash point installs in the writer and the
// consumers; nil hooks do nothing.
type crashHooks struct {
	afterCommit func()    // order.WriterConfig.AfterCommit
	afterRead   func(int) // mq.ConsumerConfig.AfterRead
	// afterStep is bucket.Config.AfterStep: told each step of a transfer.
	afterStep func(step string) bool
	// afterBucket is voucher.Warmer.AfterBucket: told each bucket rebuilt.
	afterBucket func(voucherID int64, bucket int)
}

// crashPoint returns the hooks of crash point p (none when p is empty).
func crashPoint(p string) crashHooks {
	switch p {
	case crashAfterCommit:
		return crashHooks{afterCommit: func() { os.Exit(3) }}
	case crashHangAfterRead:
		return crashHooks{afterRead: func(int) { select {} }}
	case crashAfterTake, crashAfterApply:
		step := map[string]string{crashAfterTake: "take", crashAfterApply: "apply"}[p]
		return crashHooks{afterStep: func(s string) bool {
			if s == step {
				os.Exit(3)
			}
			return false
		}}
	case crashStopAfterBucket:
		var once sync.Once
		return crashHooks{afterBucket: func(int64, int) {
			once.Do(func() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) })
		}}
	}
	return crashHooks{}
}
