// Package lua holds the project's Redis scripts, one file per script, each
// with a header that documents its KEYS, ARGV and return values.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed purchase.lua
	purchaseSrc string
	//go:embed load.lua
	loadSrc string
	//go:embed ack.lua
	ackSrc string
	//go:embed retry.lua
	retrySrc string
	//go:embed forward.lua
	forwardSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed replace.lua
	replaceSrc string
	//go:embed reopen.lua
	reopenSrc string
	//go:embed drop_ready.lua
	dropReadySrc string
	//go:embed settle.lua
	settleSrc string
	//go:embed send_code.lua
	sendCodeSrc string
	//go:embed check_code.lua
	checkCodeSrc string
	//go:embed unsend_code.lua
	unsendCodeSrc string
	//go:embed take.lua
	takeSrc string
	//go:embed apply.lua
	applySrc string
	//go:embed resolve.lua
	resolveSrc string
	//go:embed close.lua
	closeSrc string
	//go:embed fence.lua
	fenceSrc string
	//go:embed release_lease.lua
	releaseLeaseSrc string
	//go:embed renew_lease.lua
	renewLeaseSrc string
	//go:embed draw_enter.lua
	drawEnterSrc string
	//go:embed lock_take.lua
	lockTakeSrc string
	//go:embed requeue.lua
	requeueSrc string
	//go:embed db_sync.lua
	dbSyncSrc string
	//go:embed draw_close.lua
	drawCloseSrc string
	//go:embed draw_fence.lua
	drawFenceSrc string
)

// Purchase checks a buyer's eligibility, reserves stock and queues the order.
// go-redis runs it with EVALSHA and falls back to EVAL on NOSCRIPT.
func Purchase() *redis.Script { return redis.NewScript(purchaseSrc) }

// Load writes a voucher's sale state when it is missing.
func Load() *redis.Script { return redis.NewScript(loadSrc) }

// Ack acknowledges and deletes stream entries of a consumer group.
func Ack() *redis.Script { return redis.NewScript(ackSrc) }

// Retry moves a pending stream entry to a delay queue and acknowledges it.
func Retry() *redis.Script { return redis.NewScript(retrySrc) }

// Forward moves due delay-queue members back onto their stream.
func Forward() *redis.Script { return redis.NewScript(forwardSrc) }

// Release gives back the Redis reservation of a dead-lettered order.
func Release() *redis.Script { return redis.NewScript(releaseSrc) }

// SendCode stores a login code (as an HMAC) under the resend and daily
// limits of its phone.
func SendCode() *redis.Script { return redis.NewScript(sendCodeSrc) }

// CheckCode checks and consumes a login code, counting wrong tries.
func CheckCode() *redis.Script { return redis.NewScript(checkCodeSrc) }

// UnsendCode takes back a code the SMS gateway did not deliver: the code,
// its resend wait and its place in the limits.
func UnsendCode() *redis.Script { return redis.NewScript(unsendCodeSrc) }

// Settle makes Redis agree with an order the worker wrote.
func Settle() *redis.Script { return redis.NewScript(settleSrc) }

// Replace overwrites a voucher's state under a shard's rebuild lease.
func Replace() *redis.Script { return redis.NewScript(replaceSrc) }

// Reopen marks a rebuilt shard ready and drops its rebuild lease.
func Reopen() *redis.Script { return redis.NewScript(reopenSrc) }

// DropReady drops a shard's ready marker if it still holds the value read,
// taking the shard's rebuild lease in the same step.
func DropReady() *redis.Script { return redis.NewScript(dropReadySrc) }

// Take takes units out of a voucher's bucket and journals their move to
// another bucket, in one step.
func Take() *redis.Script { return redis.NewScript(takeSrc) }

// Apply adds a journaled move's units to the receiving bucket, once per
// move id, and marks the move's outcome there.
func Apply() *redis.Script { return redis.NewScript(applySrc) }

// Resolve reads a move's outcome on its receiver, refusing the move for
// good when it has none yet.
func Resolve() *redis.Script { return redis.NewScript(resolveSrc) }

// Close drops a move from its donor's journal with its outcome, giving
// the units of a refused move back.
func Close() *redis.Script { return redis.NewScript(closeSrc) }

// Fence sets or lifts a rebuild's fencing token on a bucket.
func Fence() *redis.Script { return redis.NewScript(fenceSrc) }

// ReleaseLease drops a voucher's bucket lease if it still holds a token.
func ReleaseLease() *redis.Script { return redis.NewScript(releaseLeaseSrc) }

// RenewLease extends a lease if it still holds a token.
func RenewLease() *redis.Script { return redis.NewScript(renewLeaseSrc) }

// DrawEnter enters a buyer into a fair voucher's opening draw, once.
func DrawEnter() *redis.Script { return redis.NewScript(drawEnterSrc) }

// LockTake takes a batch's buyer locks on one lock node, each as redsync's
// Mutex takes one; redsync releases and extends them.
func LockTake() *redis.Script { return redis.NewScript(lockTakeSrc) }

// Requeue queues again an order the database lost while Redis still holds
// it, as the purchase queued it, for the worker to write.
func Requeue() *redis.Script { return redis.NewScript(requeueSrc) }

// DBSync brings a shard's record of the database in line with the server
// the database's address reaches.
func DBSync() *redis.Script { return redis.NewScript(dbSyncSrc) }

// DrawClose closes a fair voucher's draw on Redis's clock, before its
// entries are read.
func DrawClose() *redis.Script { return redis.NewScript(drawCloseSrc) }

// DrawFence fences one bucket of a fair voucher for the drawer holding a
// token, which only rises.
func DrawFence() *redis.Script { return redis.NewScript(drawFenceSrc) }
