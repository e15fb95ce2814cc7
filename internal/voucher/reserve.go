package voucher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/redisconn"
	"seckill/lua"
)

// Refusals of a purchase; the HTTP edge turns each into a status and code.
var (
	ErrSoldOut    = errors.New("sold out")
	ErrNotStarted = errors.New("sale not started")
	ErrEnded      = errors.New("sale ended")
	// ErrNotReady means Redis holds no loaded state for the voucher's shard:
	// the purchase fails closed until the state is rebuilt.
	ErrNotReady = errors.New("sale state not ready")
	// ErrNoState means the shard is loaded but this voucher has no state:
	// it is unknown, ended long ago, or its state was not written yet.
	ErrNoState = errors.New("no sale state for voucher")
	// ErrWrongType means a key the purchase writes holds another Redis type
	// than the sale state uses (overwritten by hand, or another program
	// shares the key prefix). The purchase wrote nothing; purchases of the
	// shard or voucher fail closed until an operator removes the key.
	ErrWrongType = errors.New("sale state key of the wrong type")
	// ErrNotReplicated means the purchase was taken on the master, but fewer
	// replicas than asked (WaitReplicas) confirmed it in time: a failover
	// now could lose it, so the buyer cannot be told it was accepted. It is
	// no refusal either: the order may well land.
	ErrNotReplicated = errors.New("purchase not confirmed by replicas")
	// ErrFenced means a drawer's purchase (ReserveAs) carried another
	// fence token than the bucket's: another drawer took the draw over.
	// Nothing was written.
	ErrFenced = errors.New("the draw's buckets are fenced by another drawer")
	// ErrDrawing means the voucher opens with a draw that is not done:
	// only the drawer buys until it is. Nothing was written.
	ErrDrawing = errors.New("the voucher's draw is not done")
)

// PurchasedError means the buyer already holds an order for the voucher.
type PurchasedError struct{ OrderID int64 }

func (e *PurchasedError) Error() string {
	return "already purchased: order " + strconv.FormatInt(e.OrderID, 10)
}

// NotStartedError is ErrNotStarted with how long until the sale begins,
// on Redis's clock, when the purchase script said so (0 when unknown).
type NotStartedError struct{ Until time.Duration }

func (e *NotStartedError) Error() string { return ErrNotStarted.Error() }

// Is makes errors.Is(err, ErrNotStarted) hold.
func (e *NotStartedError) Is(target error) bool { return target == ErrNotStarted }

// Reservation is an accepted purchase.
type Reservation struct {
	OrderID int64
	// Replayed is true when this order id had been accepted by an earlier
	// call (a retry): nothing was reserved again.
	Replayed bool
}

// Reserver runs the purchase script: one Redis round trip per purchase, or
// a share of one when concurrent purchases are coalesced (the default), and
// a second for a taken purchase that waits for replicas (WaitReplicas).
type Reserver struct {
	rdb    redis.Scripter
	keys   Keys
	script *redis.Script

	// With coalescing: the batcher, and each shard's keys that do not
	// depend on the voucher, ready to go into a command's arguments.
	co         *coalescer
	maxBatch   int
	shardArgs  [][3]any // ready, stream, pending
	evalArgs   [3]any   // evalsha, digest, numkeys
	stateTrims bool     // State(id) is Buyers(id) without buyersSuffix

	// With WaitReplicas: the client that finds the voucher's master (rdb
	// itself), how many replicas must confirm a purchase, and how long to
	// wait for them.
	uc      redis.UniversalClient
	acks    int
	ackWait time.Duration
	// replicas, when set, confirms a purchase on a master with no
	// replica by the master alone (redisconn.Replicas).
	replicas *redisconn.Replicas

	// layouts holds the bucket count of each voucher of more than one
	// bucket this instance knows, learnt from the database (Learn) or
	// the purchase script: a map replaced whole when it grows (rarely),
	// so that a purchase reads it with one atomic load and no lock or
	// allocation. borrow moves units into an empty home bucket.
	layouts   atomic.Pointer[map[int64]int]
	layoutsMu sync.Mutex // serialises the replacements
	borrow    Borrower
}

// ReserveOption changes how a Reserver confirms a purchase.
type ReserveOption func(*Reserver)

// WaitReplicas makes a purchase wait, before it is answered, until n
// replicas of the master holding the voucher have its writes, for at most
// timeout; fewer confirmations make Reserve return ErrNotReplicated.
// Replication is asynchronous: without this, a failover loses the
// purchases the master accepted but had not yet sent to its replica. The
// wait is Redis's WAIT, sent after the script on the same connection, in
// its own round trip, and only when the purchase was taken. n = 0 turns it
// off.
//
// The Reserver's client must be a *redis.Client or a *redis.ClusterClient
// (WAIT goes on a connection of the voucher's master), n must not be
// negative, and timeout must be 1ms or more (WAIT reads 0 as "forever"):
// NewReserver panics otherwise, as on any programming error. WAIT's answer
// is awaited for timeout plus 10s, whatever the client's read timeout.
func WaitReplicas(n int, timeout time.Duration) ReserveOption {
	return WaitReplicasOr(n, timeout, nil)
}

// WaitReplicasOr is WaitReplicas with the policy for a master that has no
// replica at all (redisconn.Replicas): its purchases are accepted,
// confirmed by the master alone, and counted by rs, instead of answered
// ErrNotReplicated while the order is on its way to the database.
func WaitReplicasOr(n int, timeout time.Duration, rs *redisconn.Replicas) ReserveOption {
	return func(r *Reserver) {
		if n == 0 {
			r.acks = 0
			return
		}
		if n < 0 || timeout < time.Millisecond {
			panic(fmt.Sprintf("voucher.WaitReplicas(%d, %s): want n >= 0 and a timeout of 1ms or more", n, timeout))
		}
		switch c := r.rdb.(type) {
		case *redis.Client, *redis.ClusterClient:
			r.uc = c.(redis.UniversalClient)
		default:
			panic(fmt.Sprintf("voucher.WaitReplicas: the client is a %T; WAIT needs a *redis.Client or *redis.ClusterClient, to send it on a connection of the voucher's master", r.rdb))
		}
		r.acks, r.ackWait, r.replicas = n, timeout, rs
	}
}

// Coalesce sends the purchase scripts of concurrent buyers to Redis
// together, at most maxBatch in one pipeline (see coalescer): a stampede
// then costs Redis and the instance one read and one write per batch
// instead of per purchase. A purchase never waits for company: when no
// more than a few pipelines are in flight it goes at once, alone. It is on
// by default with maxBatch 128; maxBatch 0 turns it off, leaving one round
// trip per purchase. It is off whatever this says with WaitReplicas (WAIT
// confirms the writes of the one connection it is sent on), and when the
// client cannot pipeline (neither a *redis.Client, *redis.ClusterClient nor
// *redis.Ring).
func Coalesce(maxBatch int) ReserveOption {
	return func(r *Reserver) {
		if maxBatch < 0 {
			panic(fmt.Sprintf("voucher.Coalesce(%d): want maxBatch >= 0", maxBatch))
		}
		r.maxBatch = maxBatch
	}
}

// Lend makes an empty home bucket of a voucher of more than one bucket
// borrow units from the voucher's other buckets (see Reserve).
func Lend(b Borrower) ReserveOption {
	return func(r *Reserver) { r.borrow = b }
}

// coalesceFlights is how many pipelines of one Reserver may be in flight
// at once: enough that a purchase arriving while one is out need not wait
// for it, few enough that a stampede builds batches.
const coalesceFlights = 4

// buyersSuffix is what Keys.Buyers adds to Keys.State.
const buyersSuffix = ":buyers"

// NewReserver returns a Reserver; it does not own rdb.
func NewReserver(rdb redis.Scripter, keys Keys, opts ...ReserveOption) *Reserver {
	r := &Reserver{rdb: rdb, keys: keys, script: lua.Purchase(), maxBatch: 128}
	for _, o := range opts {
		o(r)
	}
	if p, ok := rdb.(pipeliner); ok && r.maxBatch > 0 && r.acks == 0 {
		r.co = &coalescer{rdb: p, script: r.script, maxBatch: r.maxBatch, maxFlights: coalesceFlights}
		r.evalArgs = [3]any{"evalsha", r.script.Hash(), 5}
		r.shardArgs = make([][3]any, keys.Shards())
		for s := range r.shardArgs {
			r.shardArgs[s] = [3]any{keys.Ready(s), keys.Stream(s), keys.Pending(s)}
		}
		r.stateTrims = keys.BuyersAt(0, 1)[:len(keys.BuyersAt(0, 1))-len(buyersSuffix)] == keys.StateAt(0, 1)
	}
	return r
}

// CoalesceStats counts the pipelines the Reserver sent coalesced and the
// purchases they carried (zero when coalescing is off).
func (r *Reserver) CoalesceStats() CoalesceStats {
	if r.co == nil {
		return CoalesceStats{}
	}
	return CoalesceStats{Flushes: r.co.flushes.Load(), Purchases: r.co.purchases.Load()}
}

// Reserve checks the buyer's eligibility and, when eligible, reserves one
// unit and queues the order with the given id. Calling it again with the
// same order id does not reserve twice.
//
// A voucher of more than one bucket is bought in the buyer's home bucket
// (Home). When that bucket is empty, the Borrower (Lend) moves units into
// it from the others, and the purchase runs again: ErrSoldOut then means
// every bucket is empty, ErrInTransit that units are on their way.
// Without a Borrower an empty home bucket answers ErrSoldOut.
func (r *Reserver) Reserve(ctx context.Context, voucherID, userID, orderID int64) (Reservation, error) {
	return r.reserve(ctx, voucherID, userID, orderID, "")
}

// ReserveAs is Reserve for a fair voucher's drawer, which holds the
// draw's fence token: the purchase is refused (ErrFenced) unless every
// bucket it runs on is fenced with it (package draw fences them). It is
// never coalesced.
func (r *Reserver) ReserveAs(ctx context.Context, voucherID, userID, orderID int64, fence string) (Reservation, error) {
	return r.reserve(ctx, voucherID, userID, orderID, fence)
}

func (r *Reserver) reserve(ctx context.Context, voucherID, userID, orderID int64, fence string) (Reservation, error) {
	nb := r.layout(voucherID)
	res, err := r.reserveIn(ctx, voucherID, userID, orderID, nb, fence)
	// decodePurchase returns it as is; a type check, unlike errors.As,
	// costs a purchase no allocation.
	if moved, ok := err.(*LayoutError); ok {
		// This instance had the bucket count wrong (the voucher is new to
		// it): learn it and go to the buyer's home bucket.
		nb = moved.Buckets
		r.learn(voucherID, nb)
		res, err = r.reserveIn(ctx, voucherID, userID, orderID, nb, fence)
	}
	if nb <= 1 || r.borrow == nil || !errors.Is(err, ErrSoldOut) {
		return res, err
	}
	home := Home(userID, nb)
	for range maxBorrows {
		if berr := r.borrow.Borrow(ctx, voucherID, home, nb); berr != nil {
			return Reservation{}, fmt.Errorf("reserve voucher %d in bucket %d: %w", voucherID, home, berr)
		}
		res, err = r.reserveIn(ctx, voucherID, userID, orderID, nb, fence)
		if !errors.Is(err, ErrSoldOut) {
			return res, err
		}
	}
	// Units came and went to other buyers of this bucket each time: the
	// voucher is not sold out, but this buyer did not get one yet.
	return Reservation{}, fmt.Errorf("reserve voucher %d in bucket %d: %w", voucherID, home, ErrInTransit)
}

// maxBorrows bounds the borrows one purchase makes before it answers
// ErrInTransit.
const maxBorrows = 3

// layout is the bucket count this instance knows for a voucher: what the
// database said (Learn) or a purchase script did (LayoutError); 1 until
// either did.
func (r *Reserver) layout(voucherID int64) int {
	if m := r.layouts.Load(); m != nil {
		if nb, ok := (*m)[voucherID]; ok {
			return nb
		}
	}
	return 1
}

// Learn records the bucket count of each voucher of vs with more than one
// (Warmer.Teach hands it the database's live vouchers): a purchase then
// goes to the buyer's home bucket at once, never first to bucket 0 to be
// told the count. A voucher's count is fixed at its creation.
func (r *Reserver) Learn(vs []Voucher) {
	if r == nil {
		return
	}
	r.layoutsMu.Lock()
	defer r.layoutsMu.Unlock()
	var next map[int64]int
	m := r.layouts.Load()
	for _, v := range vs {
		nb := v.BucketCount()
		if nb <= 1 {
			continue
		}
		if m != nil && (*m)[v.ID] == nb {
			continue
		}
		if next == nil {
			next = map[int64]int{}
			if m != nil {
				maps.Copy(next, *m)
			}
		}
		next[v.ID] = nb
	}
	if next != nil {
		r.layouts.Store(&next)
	}
}

// learn records a voucher's bucket count in a new copy of the layouts.
func (r *Reserver) learn(voucherID int64, nb int) {
	r.layoutsMu.Lock()
	defer r.layoutsMu.Unlock()
	next := map[int64]int{}
	if m := r.layouts.Load(); m != nil {
		maps.Copy(next, *m)
	}
	next[voucherID] = nb
	r.layouts.Store(&next)
}

// reserveIn runs the purchase script on the buyer's home bucket of nb,
// with a drawer's fence token when fence is set.
func (r *Reserver) reserveIn(ctx context.Context, voucherID, userID, orderID int64, nb int, fence string) (Reservation, error) {
	bucket := Home(userID, nb)
	shard := r.keys.BucketShard(voucherID, bucket, nb)
	if r.co != nil && fence == "" {
		return r.reserveCoalesced(ctx, shard, voucherID, userID, orderID, bucket, nb)
	}
	keys := []string{
		r.keys.Ready(shard),
		r.keys.StateAt(shard, voucherID),
		r.keys.BuyersAt(shard, voucherID),
		r.keys.Stream(shard),
		r.keys.Pending(shard),
	}
	args := []any{voucherID, userID, orderID}
	if nb > 1 {
		args = append(args, bucket, nb)
	}
	if fence != "" {
		args = append(args, fence)
	}
	if r.acks > 0 {
		return r.reserveAcked(ctx, keys, args...)
	}
	res, err := r.script.Run(ctx, r.rdb, keys, args...).Slice()
	if err != nil {
		return Reservation{}, fmt.Errorf("purchase script: %w", err)
	}
	return decodePurchase(res)
}

// reserveCoalesced sends the purchase through the coalescer. Its command
// is spelled by hand, from arguments built once where they can be: the
// same EVALSHA as Script.Run's, with fewer allocations per purchase.
func (r *Reserver) reserveCoalesced(ctx context.Context, shard int, voucherID, userID, orderID int64, bucket, nb int) (Reservation, error) {
	cl := callPool.Get().(*purchaseCall)
	defer cl.release()
	sa := r.shardArgs[shard]
	buyers := r.keys.BuyersAt(shard, voucherID)
	var state string
	if r.stateTrims {
		state = buyers[:len(buyers)-len(buyersSuffix)]
	} else {
		state = r.keys.StateAt(shard, voucherID)
	}
	a := &cl.args
	a[0], a[1], a[2] = r.evalArgs[0], r.evalArgs[1], r.evalArgs[2]
	a[3], a[4], a[5], a[6], a[7] = sa[0], state, buyers, sa[1], sa[2]
	a[8], a[9], a[10] = voucherID, userID, orderID
	cl.nargs = 11
	if nb > 1 {
		a[11], a[12] = bucket, nb
		cl.nargs = 13
	}
	res, err := r.co.do(ctx, cl)
	if err != nil {
		return Reservation{}, fmt.Errorf("purchase script: %w", err)
	}
	return decodePurchase(res)
}

// reserveAcked runs the purchase script on a connection of the master
// holding the voucher's keys and, when the purchase was taken, WAIT on the
// same connection: WAIT counts the replicas that have every write of the
// connection it is sent on. When the slot has moved (MOVED) or is moving
// (ASK), it follows once to the node named.
//
// WAIT is a second round trip, sent only after an accepted or replayed
// answer, not pipelined behind the script: a refusal wrote nothing, but a
// WAIT sent after it still waits for whatever the connection carried
// before (Redis 7.0 counts there the GETACK of its previous WAIT), so with
// a lagging replica every sold-out answer would take the whole timeout
// and hold a connection for it. Accepted purchases are bounded by the
// stock; refusals are not.
//
// A replayed order was written by an earlier call, perhaps on another
// connection: WAIT confirms this connection's writes only.
func (r *Reserver) reserveAcked(ctx context.Context, keys []string, args ...any) (Reservation, error) {
	c, err := redisconn.MasterFor(ctx, r.uc, keys[1])
	if err != nil {
		return Reservation{}, fmt.Errorf("purchase script: find the master: %w", err)
	}
	conn, addr := c.Conn(), c.Options().Addr
	defer func() { _ = conn.Close() }() // the last one, after a redirection
	res, err := r.runOn(ctx, conn, false, keys, args)
	if to, ask, ok := redirect(err); ok {
		cluster, isCluster := r.uc.(*redis.ClusterClient)
		if !isCluster {
			return Reservation{}, fmt.Errorf("purchase script: %w", err)
		}
		node, ferr := nodeAt(ctx, cluster, to)
		if ferr != nil {
			return Reservation{}, fmt.Errorf("purchase script: %w; follow it: %w", err, ferr)
		}
		_ = conn.Close()
		conn, addr = node.Conn(), node.Options().Addr
		res, err = r.runOn(ctx, conn, ask, keys, args)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("purchase script: %w", err)
	}
	out, err := decodePurchase(res)
	if err != nil {
		return out, err // a refusal: nothing written, nothing to confirm
	}
	conf, err := r.replicas.Confirm(ctx, conn, addr, r.acks, r.ackWait)
	if err != nil {
		return Reservation{}, fmt.Errorf("order %d taken, replicas unknown: wait for replicas: %w", out.OrderID, err)
	}
	if !conf.OK(r.acks) {
		return Reservation{}, fmt.Errorf("order %d confirmed by %d of %d replicas within %s: %w", out.OrderID, conf.Acked, r.acks, r.ackWait, ErrNotReplicated)
	}
	return out, nil
}

// runOn runs the purchase script on conn by digest, after ASKING when
// asking (a slot being moved: ASKING lets one command in); when conn's
// server lacks the script (restarted, failed over or flushed), once more
// with the script's body, which also caches it.
func (r *Reserver) runOn(ctx context.Context, conn *redis.Conn, asking bool, keys []string, args []any) ([]any, error) {
	run := func(body bool) ([]any, error) {
		if asking {
			if err := conn.Do(ctx, "asking").Err(); err != nil {
				return nil, err
			}
		}
		if body {
			return r.script.Eval(ctx, conn, keys, args...).Slice()
		}
		return r.script.EvalSha(ctx, conn, keys, args...).Slice()
	}
	res, err := run(false)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		res, err = run(true)
	}
	return res, err
}

// redirect reads a cluster redirection: the address it names, and whether
// it is ASK (the slot is moving; ask once) rather than MOVED.
func redirect(err error) (addr string, ask, ok bool) {
	if addr, ok := redis.IsMovedError(err); ok {
		return addr, false, true
	}
	if addr, ok := redis.IsAskError(err); ok {
		return addr, true, true
	}
	return "", false, false
}

// nodeAt returns the cluster client's node at addr. Asking for every node
// reloads the client's slot map first, so later purchases go to the new
// owner of a moved slot directly.
func nodeAt(ctx context.Context, cluster *redis.ClusterClient, addr string) (*redis.Client, error) {
	var (
		mu    sync.Mutex
		found *redis.Client
	)
	err := cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, fmt.Errorf("no node at %s in the cluster's map", addr)
	}
	return found, nil
}

// The return codes of purchase.lua, as its header lists them: {code, detail}.
const (
	purchaseAccepted   = 0 // detail: order id; stock reserved, order queued
	purchaseReplayed   = 1 // detail: order id; accepted by an earlier call, nothing written again
	purchaseDuplicate  = 2 // detail: the buyer's existing order id
	purchaseSoldOut    = 3
	purchaseNotStarted = 4  // detail: milliseconds until begin (Redis server time)
	purchaseEnded      = 5  // the sale has ended (Redis server time)
	purchaseNotReady   = 6  // the shard's state is not loaded
	purchaseNoState    = 7  // no state for this voucher
	purchaseWrongType  = 8  // detail: the key of another type; nothing written
	purchaseLayout     = 9  // detail: the voucher's bucket count; nothing written
	purchaseFenced     = 10 // a drawer's fence token is not the bucket's; nothing written
	purchaseDrawing    = 11 // a fair voucher's draw not done, and no fence token; nothing written
)

// LayoutError means the purchase went to a bucket of the wrong layout: the
// voucher has Buckets buckets, not the count the caller used.
type LayoutError struct{ Buckets int }

func (e *LayoutError) Error() string {
	return "purchase sent to the wrong bucket: the voucher has " + strconv.Itoa(e.Buckets) + " buckets"
}

// decodePurchase is the one place that reads purchase.lua's return codes.
func decodePurchase(res []any) (Reservation, error) {
	if len(res) != 2 {
		return Reservation{}, fmt.Errorf("purchase script: %d return values, want 2", len(res))
	}
	code, ok := res[0].(int64)
	if !ok {
		return Reservation{}, fmt.Errorf("purchase script: code is %T", res[0])
	}
	detail, _ := res[1].(string)
	orderID := func() (int64, error) {
		id, err := strconv.ParseInt(detail, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("purchase script: bad order id %q", detail)
		}
		return id, nil
	}
	switch code {
	case purchaseAccepted, purchaseReplayed:
		id, err := orderID()
		if err != nil {
			return Reservation{}, err
		}
		return Reservation{OrderID: id, Replayed: code == purchaseReplayed}, nil
	case purchaseDuplicate:
		id, err := orderID()
		if err != nil {
			return Reservation{}, err
		}
		return Reservation{}, &PurchasedError{OrderID: id}
	case purchaseSoldOut:
		return Reservation{}, ErrSoldOut
	case purchaseNotStarted:
		ms, _ := strconv.ParseInt(detail, 10, 64) // an older script said ""
		return Reservation{}, &NotStartedError{Until: time.Duration(max(ms, 0)) * time.Millisecond}
	case purchaseEnded:
		return Reservation{}, ErrEnded
	case purchaseNotReady:
		return Reservation{}, ErrNotReady
	case purchaseNoState:
		return Reservation{}, ErrNoState
	case purchaseWrongType:
		return Reservation{}, fmt.Errorf("purchase script: key %q: %w", detail, ErrWrongType)
	case purchaseLayout:
		nb, err := strconv.Atoi(detail)
		if err != nil || nb < 1 || nb > MaxBuckets {
			return Reservation{}, fmt.Errorf("purchase script: bad bucket count %q", detail)
		}
		return Reservation{}, &LayoutError{Buckets: nb}
	case purchaseFenced:
		return Reservation{}, ErrFenced
	case purchaseDrawing:
		return Reservation{}, ErrDrawing
	}
	return Reservation{}, fmt.Errorf("purchase script: unknown code %d", code)
}
