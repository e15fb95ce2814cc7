package voucher

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"seckill/internal/apierr"
	"seckill/internal/auth"
)

// IDSource makes order ids without a network round trip.
type IDSource interface {
	Next() (int64, error)
}

// Limits on what a voucher may be created with.
const (
	maxTitleLen   = 200
	maxStock      = 10_000_000
	maxFaceValue  = 1_000_000_000 // in cents
	maxCreateBody = 16 << 10
	maxListLimit  = 100
)

// The sale window must fall in this range: dates outside it are typing
// errors, and the database's DATETIME has a range of its own.
var (
	earliestTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
)

// Observer hears how each purchase ended, for metrics: the outcome
// ("accepted" or the answer's error code), the handler's time and the
// purchase script's time (0 when it did not run). It is called once per
// purchase, so it must be cheap and safe for concurrent use.
type Observer interface {
	Purchase(outcome string, took, script time.Duration)
	// AnsweredLocally: the purchase just reported got its answer from the
	// instance's Refusals, without Redis.
	AnsweredLocally(outcome string)
}

type nopObserver struct{}

func (nopObserver) Purchase(string, time.Duration, time.Duration) {}
func (nopObserver) AnsweredLocally(string)                        {}

// HTTP serves the voucher routes.
type HTTP struct {
	store    *Store
	state    *State
	reserver *Reserver
	ids      IDSource
	log      *slog.Logger
	obs      Observer
	refusals *Refusals
	lastWarn atomic.Int64 // unix ns of the last logged Redis failure
	// unpayable, when set, refuses priced vouchers: it says how to turn
	// payments on.
	unpayable string
	draws     Draws
	// drawKey derives fair vouchers' secrets (DrawKey); nil: the secret
	// is kept in the database.
	drawKey []byte
}

// Draws routes the purchases of vouchers that open with a draw (package
// draw).
type Draws interface {
	// Enter enters the buyer into voucher id's draw with ticket when the
	// draw takes entries now, or answers with the ticket the buyer holds;
	// handled is false when the voucher has no draw, or its draw is done:
	// buy as in any sale.
	// pow is the buyer's proof of work (the X-Seckill-Pow header, "" when
	// absent); a draw that asks for one and finds it wrong answers
	// ErrPowRequired.
	Enter(ctx context.Context, voucherID, userID, ticket int64, pow string) (e DrawEntry, handled bool, err error)
}

// PowHeader carries a buyer's proof of work for entering a draw.
const PowHeader = "X-Seckill-Pow"

// ErrPowRequired means the draw asks for a proof of work and the entry
// brought none, or a wrong one: 403 pow_required.
var ErrPowRequired = errors.New("the draw asks for a proof of work")

// MaxPowBits bounds a voucher's pow_bits: 2^24 hashes is seconds on a
// phone already.
const MaxPowBits = 24

// DrawEntry is a buyer's place in a draw: its ticket (a winner's order
// id) and when the draw closes; Closed when the draw no longer takes
// entries and is not done yet (the buyer holds none).
type DrawEntry struct {
	Ticket   int64
	ClosesAt time.Time
	Closed   bool
}

// Draw routes purchases of fair vouchers through d; call it before
// serving.
func (h *HTTP) Draw(d Draws) { h.draws = d }

// NewHTTP returns the voucher handlers.
func NewHTTP(store *Store, state *State, reserver *Reserver, ids IDSource, log *slog.Logger) *HTTP {
	return &HTTP{store: store, state: state, reserver: reserver, ids: ids, log: log, obs: nopObserver{}}
}

// Observe makes o hear every purchase; call it before serving. A nil o
// hears nothing.
func (h *HTTP) Observe(o Observer) {
	if o == nil {
		o = nopObserver{}
	}
	h.obs = o
}

// Refuse makes purchases that r answers locally (see Refusals) skip
// Redis, and teaches r what Redis answers; call it before serving. A nil r
// sends every purchase to Redis.
func (h *HTTP) Refuse(r *Refusals) { h.refusals = r }

// RefusePriced makes Create refuse a voucher with a price (422
// payments_off): payments are off, so every order of it would wait for a
// payment nobody can make, then expire. how says what turns payments on;
// call it before serving.
func (h *HTTP) RefusePriced(how string) { h.unpayable = how }

// View is a voucher as the API shows it.
type View struct {
	ID        int64  `json:"id"`
	Title     string `json:"title"`
	FaceValue int64  `json:"face_value"`
	// Price is what a buyer pays (cents); 0 means nothing to pay.
	Price      int64     `json:"price"`
	TotalStock int       `json:"total_stock"`
	Stock      int64     `json:"stock"`
	BeginAt    time.Time `json:"begin_at"`
	EndAt      time.Time `json:"end_at"`
	// Status is upcoming, on_sale or ended, by this server's clock.
	Status string `json:"status"`
	// StockLive is true when Stock is Redis's live count, false when it is
	// the database's count (Redis state missing or unreachable).
	StockLive bool `json:"stock_live"`
	// Buckets is how many Redis buckets hold the voucher's stock: what
	// "api buckets" lists and the creation asked for.
	Buckets int `json:"buckets"`
	// Draw is set for a voucher that opens with a draw.
	Draw *DrawView `json:"draw,omitempty"`
}

// DrawView is a fair opening as the API shows it: the commitment from the
// start, the proof of work's challenge once entries open, the entry
// list's digest from the close, the secret once the draw is done.
type DrawView struct {
	FairWindowMs int64     `json:"fair_window_ms"`
	ClosesAt     time.Time `json:"closes_at"`
	// Commitment is the SHA-256 of the secret, in hex: stored once at
	// creation, never recomputed.
	Commitment string `json:"commitment"`
	// Status is open (taking entries), drawing (closed, being drawn) or
	// done.
	Status string `json:"status"`
	// Digest is the SHA-256 of the closed entry list (package draw), from
	// the close.
	Digest string     `json:"digest,omitempty"`
	Secret string     `json:"secret,omitempty"`
	DoneAt *time.Time `json:"done_at,omitempty"`
	// PowBits, above 0, is the proof of work an entry takes; Challenge is
	// what it is computed over (DrawChallenge), shown from OpensAt, when
	// entries open: no proof can be made before.
	PowBits   int       `json:"pow_bits"`
	OpensAt   time.Time `json:"opens_at"`
	Challenge string    `json:"challenge,omitempty"`
}

// NewDrawSecret is 32 random bytes, in hex: a draw's salt, or the secret
// of a voucher without a draw key.
func NewDrawSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// DrawSecretOf is the secret of a draw whose salt is salt, under the
// instances' draw key: HMAC-SHA256(key, "seckill draw secret:" + salt),
// in hex. Whoever holds the database holds the salt, not the key.
func DrawSecretOf(key []byte, salt string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("seckill draw secret:" + salt))
	return hex.EncodeToString(m.Sum(nil))
}

// DrawCommitment is the commitment to a draw's secret: its SHA-256, in
// hex.
func DrawCommitment(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Commitment is v's draw commitment: the stored one, or for a voucher
// made before commitments were stored the secret's.
func (v Voucher) Commitment() string {
	if v.DrawCommitment != "" {
		return v.DrawCommitment
	}
	return DrawCommitment(v.DrawSecret)
}

// DrawChallenge is what a proof of work for entering v's draw hashes,
// with the buyer and a nonce: "seckill-draw:<voucher id>:<commitment>",
// then ":<pow nonce>" for a voucher that has one.
func DrawChallenge(v Voucher) string {
	c := "seckill-draw:" + strconv.FormatInt(v.ID, 10) + ":" + v.Commitment()
	if v.DrawPowNonce != "" {
		c += ":" + v.DrawPowNonce
	}
	return c
}

// EntriesOpen is when v's draw takes its first entry: at its creation,
// or with a proof of work at BeginAt, when the challenge is published.
func (v Voucher) EntriesOpen() time.Time {
	if v.PowBits > 0 {
		return v.BeginAt
	}
	return v.CreatedAt
}

// DrawOf is voucher v's draw as the API shows it, nil when it has none.
func DrawOf(v Voucher, now time.Time) *DrawView {
	if !v.Fair() {
		return nil
	}
	d := &DrawView{FairWindowMs: v.FairWindowMs, ClosesAt: v.DrawClose().UTC(), Commitment: v.Commitment(), Status: "open",
		PowBits: v.PowBits, OpensAt: v.EntriesOpen().UTC(), Digest: v.DrawDigest}
	if !now.Before(v.EntriesOpen()) {
		d.Challenge = DrawChallenge(v)
	}
	switch {
	case v.DrawDoneAt != nil:
		d.Status, d.Secret, d.DoneAt = "done", v.DrawSecret, v.DrawDoneAt
	case !now.Before(v.DrawClose()):
		d.Status = "drawing"
	}
	return d
}

func view(v Voucher, live map[int64]int64, now time.Time) View {
	out := View{
		ID: v.ID, Title: v.Title, FaceValue: v.FaceValue, Price: v.Price, TotalStock: v.TotalStock,
		Stock: int64(v.Stock), BeginAt: v.BeginAt.UTC(), EndAt: v.EndAt.UTC(), Status: "on_sale",
		Buckets: v.BucketCount(), Draw: DrawOf(v, now),
	}
	if n, ok := live[v.ID]; ok {
		out.Stock, out.StockLive = max(n, 0), true
	}
	switch {
	case now.Before(v.BeginAt):
		out.Status = "upcoming"
	case !now.Before(v.EndAt):
		out.Status = "ended"
	}
	return out
}

type createRequest struct {
	Title     string     `json:"title"`
	FaceValue *int64     `json:"face_value"`
	Price     int64      `json:"price"`
	Stock     *int       `json:"stock"`
	BeginAt   *time.Time `json:"begin_at"`
	EndAt     *time.Time `json:"end_at"`
	// Buckets is a JSON integer or the string "auto"; absent or null: 1.
	Buckets json.RawMessage `json:"buckets"`
	// FairWindowMs, above 0, opens the sale with a draw (package draw).
	FairWindowMs int64 `json:"fair_window_ms"`
	// PowBits, above 0, makes an entry into the draw cost a proof of work.
	PowBits int `json:"pow_bits"`
}

// buckets is the bucket count the request asks for: 1 when it names none,
// auto for "auto" (Create counts the masters), else its integer, which may
// be out of range (a JSON integer too large for an int comes back as the
// largest int). ok is false for any other JSON value: a fraction, another
// string, a boolean.
func (r createRequest) buckets() (n int, auto, ok bool) {
	raw := strings.TrimSpace(string(r.Buckets))
	switch {
	case raw == "" || raw == "null":
		return 1, false, true
	case strings.HasPrefix(raw, `"`):
		var s string
		if json.Unmarshal(r.Buckets, &s) != nil || s != "auto" {
			return 0, false, false
		}
		return 1, true, true
	}
	n, err := strconv.Atoi(raw)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false, false
	}
	return n, false, true
}

// voucher turns the request into the row to store, normalised first (title
// trimmed, times truncated to the milliseconds the database and the sale
// state keep), then checks what will be stored against shards (the number
// of shards, which bounds buckets). Checking before normalising
// would let through a row the database's CHECK constraints refuse, such as a
// window shorter than a millisecond, and that refusal would answer 503. The
// string is the reason for a 422, or "".
func (r createRequest) voucher(now time.Time, buckets, shards int) (Voucher, string) {
	switch {
	case r.FaceValue == nil:
		return Voucher{}, "face_value (in cents) is required"
	case r.Stock == nil:
		return Voucher{}, "stock is required"
	case r.BeginAt == nil || r.EndAt == nil:
		return Voucher{}, "begin_at and end_at are required (RFC 3339)"
	}
	v := Voucher{
		Title: strings.TrimSpace(r.Title), FaceValue: *r.FaceValue, Price: r.Price, TotalStock: *r.Stock,
		BeginAt: r.BeginAt.Truncate(time.Millisecond).UTC(), EndAt: r.EndAt.Truncate(time.Millisecond).UTC(),
		Buckets: buckets, FairWindowMs: r.FairWindowMs, PowBits: r.PowBits,
	}
	return v, v.check(now, shards)
}

// check is every rule a new voucher must meet, on the values as stored. It
// covers the vouchers table's CHECK constraints (face_value >= 0,
// 0 <= price <= face_value, 0 <= stock <= total_stock, begin_at < end_at)
// and its column limits; and buckets from 1 to MaxBuckets, at most one per
// shard of the shards there are.
func (v Voucher) check(now time.Time, shards int) string {
	switch {
	case v.Title == "":
		return "title is required"
	case utf8.RuneCountInString(v.Title) > maxTitleLen:
		return "title is longer than " + strconv.Itoa(maxTitleLen) + " characters"
	case v.FaceValue < 0 || v.FaceValue > maxFaceValue:
		return "face_value (in cents) must be between 0 and " + strconv.Itoa(maxFaceValue)
	case v.Price < 0 || v.Price > v.FaceValue:
		return "price (in cents) must be between 0 and face_value"
	case v.TotalStock <= 0 || v.TotalStock > maxStock:
		return "stock must be between 1 and " + strconv.Itoa(maxStock)
	case v.BeginAt.Before(earliestTime) || !v.EndAt.Before(latestTime):
		return "begin_at and end_at must fall in the years 2000 to 2099"
	case !v.BeginAt.Before(v.EndAt):
		return "begin_at must be before end_at (times are kept to the millisecond)"
	case !v.EndAt.After(now):
		return "end_at must be in the future"
	case v.FairWindowMs < 0 || !v.DrawClose().Before(v.EndAt):
		return "fair_window_ms must be 0 (no draw) or a window that closes before end_at"
	case v.PowBits < 0 || v.PowBits > MaxPowBits:
		return "pow_bits must be between 0 and " + strconv.Itoa(MaxPowBits)
	case v.PowBits > 0 && !v.Fair():
		return "pow_bits asks a proof of work for entering a draw: it needs fair_window_ms"
	case v.Buckets < 1 || v.Buckets > min(MaxBuckets, shards):
		return fmt.Sprintf(`buckets must be between 1 and %d (at most one bucket per shard, and SECKILL_SHARDS is %d; never more than %d), `+
			`or "auto" for one per Redis master`, min(MaxBuckets, shards), shards, MaxBuckets)
	}
	return ""
}

// Create puts a voucher on sale: the database row, then its Redis state.
// Everything is checked, and "buckets": "auto" resolved, before the row
// is written.
func (h *HTTP) Create(c *gin.Context) {
	var req createRequest
	if !apierr.DecodeJSON(c, maxCreateBody, &req) {
		return
	}
	buckets, auto, ok := req.buckets()
	if !ok {
		apierr.BadRequest(c, `buckets must be an integer or "auto"`)
		return
	}
	now := time.Now()
	v, msg := req.voucher(now, buckets, h.state.keys.Shards())
	if msg != "" {
		apierr.Abort(c, http.StatusUnprocessableEntity, "invalid_voucher", msg)
		return
	}
	if v.Price > 0 && h.unpayable != "" {
		apierr.Abort(c, http.StatusUnprocessableEntity, "payments_off",
			"payments are off, so nobody could pay for a priced voucher: "+h.unpayable+"; or create it with price 0")
		return
	}
	ctx := c.Request.Context()
	if auto {
		n, err := h.bucketsPerMaster(ctx)
		if err != nil {
			h.log.Error("count the redis masters for buckets auto failed", "err", err)
			apierr.Unavailable(c, "unavailable", `the Redis masters could not be counted for buckets "auto"; try again, or give buckets as a number`)
			return
		}
		v.Buckets = n
	}
	if v.Fair() {
		if err := h.seal(&v); err != nil {
			h.log.Error("draw secret failed", "err", err)
			apierr.Unavailable(c, "unavailable", "the voucher could not be stored; try again")
			return
		}
	}
	if err := h.store.Create(ctx, &v); err != nil {
		h.log.Error("create voucher failed", "err", err)
		apierr.Unavailable(c, "unavailable", "the voucher could not be stored; try again")
		return
	}
	h.reserver.Learn([]Voucher{v})
	// The row is committed; the state write must not be lost to a client
	// that hangs up, and the warmer repairs it if it fails.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	_, err := h.state.Load(sctx, v, nil)
	if err != nil {
		h.log.Warn("voucher stored but its Redis state was not written; the warmer retries", "voucher_id", v.ID, "err", err)
	}
	live := map[int64]int64{}
	if err == nil {
		live[v.ID] = int64(v.Stock)
	}
	c.JSON(http.StatusCreated, gin.H{"voucher": view(v, live, now), "redis_ready": err == nil})
}

// seal gives a fair voucher its draw: a salt, from which the instances'
// draw key derives the secret, the secret's commitment, stored once, and
// a proof of work's nonce. Without a draw key (DrawKey not called) the
// secret is made and kept in the database, as before keys existed.
func (h *HTTP) seal(v *Voucher) error {
	salt, err := NewDrawSecret()
	if err != nil {
		return err
	}
	if v.PowBits > 0 {
		if v.DrawPowNonce, err = NewDrawSecret(); err != nil {
			return err
		}
	}
	if h.drawKey == nil {
		v.DrawSecret = salt
		return nil
	}
	v.DrawSalt = salt
	v.DrawCommitment = DrawCommitment(DrawSecretOf(h.drawKey, salt))
	return nil
}

// DrawKey sets the key fair vouchers' secrets are derived from (the
// instances hold it, the database never does). Call it before serving.
func (h *HTTP) DrawKey(key []byte) { h.drawKey = key }

// bucketsPerMaster is what "buckets": "auto" means: one bucket per Redis
// master serving the shards, at most one per shard; 1 on a single server.
// It reads the slot map of the State's Redis.
func (h *HTTP) bucketsPerMaster(ctx context.Context) (int, error) {
	keys := h.state.keys
	places, err := keys.Placement(ctx, h.state.rdb)
	if err != nil {
		return 0, fmt.Errorf("buckets auto: %w", err)
	}
	masters := map[string]bool{}
	for _, p := range places {
		if p.Master != "" {
			masters[p.Master] = true
		}
	}
	return min(max(len(masters), 1), keys.Shards(), MaxBuckets), nil
}

// List shows vouchers, newest first, with live stock.
func (h *HTTP) List(c *gin.Context) {
	limit, before := 20, int64(0)
	if s := c.Query("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			apierr.BadRequest(c, "limit must be between 1 and "+strconv.Itoa(maxListLimit))
			return
		}
		limit = n
	}
	if s := c.Query("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			apierr.BadRequest(c, "before must be a positive voucher id")
			return
		}
		before = n
	}
	ctx := c.Request.Context()
	vs, err := h.store.List(ctx, limit, before)
	if err != nil {
		h.log.Error("list vouchers failed", "err", err)
		apierr.Unavailable(c, "unavailable", "vouchers cannot be listed right now")
		return
	}
	live, err := h.state.StocksOf(ctx, vs)
	if err != nil {
		h.warnRedis("read live stock failed", err)
	}
	now := time.Now()
	out := make([]View, len(vs))
	for i, v := range vs {
		out[i] = view(v, live, now)
	}
	c.JSON(http.StatusOK, gin.H{"vouchers": out})
}

// Show shows one voucher with live stock.
func (h *HTTP) Show(c *gin.Context) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return
	}
	ctx := c.Request.Context()
	v, err := h.store.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		apierr.Abort(c, http.StatusNotFound, "voucher_not_found", "no voucher has this id")
		return
	}
	if err != nil {
		h.log.Error("show voucher failed", "voucher_id", id, "err", err)
		apierr.Unavailable(c, "unavailable", "the voucher cannot be read right now")
		return
	}
	live, err := h.state.StocksOf(ctx, []Voucher{v})
	if err != nil {
		h.warnRedis("read live stock failed", err)
	}
	c.JSON(http.StatusOK, view(v, live, time.Now()))
}

type purchaseResponse struct {
	OrderID int64  `json:"order_id,string"`
	Status  string `json:"status"`
}

// Purchase runs the purchase script for the caller: one Redis round trip,
// or none when the instance's Refusals answer it.
func (h *HTTP) Purchase(c *gin.Context) {
	start := time.Now()
	outcome, script, local := h.purchase(c)
	h.obs.Purchase(outcome, time.Since(start), script)
	if local {
		h.obs.AnsweredLocally(outcome)
	}
}

// purchase answers the purchase and reports its outcome (the answer's code,
// or "accepted"), how long the script took, and whether the answer was
// local (no script ran).
func (h *HTTP) purchase(c *gin.Context) (outcome string, script time.Duration, local bool) {
	id, ok := apierr.PathID(c, "id")
	if !ok {
		return "bad_request", 0, false
	}
	buyer := auth.From(c)
	if err := h.refusals.Lookup(id, buyer.UserID); err != nil {
		return h.answer(c, id, 0, err), 0, true
	}
	orderID, err := h.ids.Next()
	if err != nil {
		h.warnRedis("no order id", err)
		pause(c, "unavailable", "purchases are paused; try again shortly")
		return "unavailable", 0, false
	}
	if h.draws != nil {
		if outcome, handled := h.enter(c, id, buyer.UserID, orderID); handled {
			return outcome, 0, false
		}
	}
	mark := h.refusals.Mark()
	began := time.Now()
	res, err := h.reserver.Reserve(c.Request.Context(), id, buyer.UserID, orderID)
	script = time.Since(began)
	h.refusals.Learn(mark, id, buyer.UserID, res, err)
	if err == nil {
		writeWithID(c, http.StatusAccepted, acceptedHead, res.OrderID, acceptedTail)
		return "accepted", script, false
	}
	return h.answer(c, id, orderID, err), script, false
}

// enter answers a purchase of a voucher whose draw takes entries (202
// entered, with the ticket), or is being drawn (503 drawing); handled is
// false when the purchase goes to the script as in any sale.
func (h *HTTP) enter(c *gin.Context, id, user, ticket int64) (outcome string, handled bool) {
	e, handled, err := h.draws.Enter(c.Request.Context(), id, user, ticket, c.GetHeader(PowHeader))
	switch {
	case errors.Is(err, ErrNotReplicated):
		// Pressing again answers the entry if it was made, and waits for
		// the replicas again.
		h.warnRedis("draw entry not confirmed by replicas", err)
		pause(c, "not_replicated", "your entry may or may not have been taken: Redis did not confirm it in time; press again")
		return "not_replicated", true
	case errors.Is(err, ErrNotStarted):
		apierr.Abort(c, http.StatusForbidden, "not_started",
			"this draw takes entries from its opening (opens_at), when the challenge of its proof of work is published")
		return "not_started", true
	case errors.Is(err, ErrPowRequired):
		apierr.Abort(c, http.StatusForbidden, "pow_required",
			"entering this draw takes a proof of work: the "+PowHeader+" header, a nonce whose SHA-256 with the draw's challenge and your user id starts with pow_bits zero bits")
		return "pow_required", true
	case err != nil:
		h.warnRedis("draw entry failed", err)
		pause(c, "unavailable", "purchases are unavailable; try again shortly")
		return "unavailable", true
	case !handled:
		return "", false
	case e.Closed:
		pause(c, "drawing", "the draw closed and is being drawn; its result comes in a moment")
		return "drawing", true
	}
	c.JSON(http.StatusAccepted, gin.H{"order_id": strconv.FormatInt(e.Ticket, 10), "status": "entered",
		"ticket": strconv.FormatInt(e.Ticket, 10), "draw_closes_at": e.ClosesAt.UTC()})
	return "entered", true
}

// pause answers 503 with code and message and Retry-After: 1. Every 503
// of a purchase is a pause (a bucket's master failing over, a rebuild,
// units moving, the database away): the buyer may press again in a
// second, and well-behaved clients wait that long.
func pause(c *gin.Context, code, message string) {
	c.Header("Retry-After", "1")
	apierr.Unavailable(c, code, message)
}

// answer answers a purchase of voucher id that Reserve (or the Refusals:
// orderID 0) refused with err, and returns the answer's code. orderID is
// the id the purchase was tried with.
func (h *HTTP) answer(c *gin.Context, id, orderID int64, err error) string {
	var held *PurchasedError
	switch {
	case errors.Is(err, ErrInTransit):
		// Checked first: units are still somewhere, so never sold_out.
		pause(c, "busy", "units of this voucher are moving between its buckets; try again in a second")
		return "busy"
	case errors.Is(err, ErrSoldOut):
		c.Abort()
		writeAnswer(c, http.StatusConflict, soldOutAnswer)
		return "sold_out"
	case errors.As(err, &held):
		c.Abort()
		if held.OrderID == 0 { // omitted from the body: encode it as it is
			c.JSON(http.StatusConflict, apierr.Body{Code: "already_purchased", Message: "you already hold an order for this voucher"})
		} else {
			writeWithID(c, http.StatusConflict, heldHead, held.OrderID, heldTail)
		}
		return "already_purchased"
	case errors.Is(err, ErrNotStarted):
		c.Abort()
		writeAnswer(c, http.StatusForbidden, notStartedAnswer)
		return "not_started"
	case errors.Is(err, ErrEnded):
		c.Abort()
		writeAnswer(c, http.StatusForbidden, endedAnswer)
		return "ended"
	case errors.Is(err, ErrDrawing):
		pause(c, "drawing", "the draw closed and is being drawn; its result comes in a moment")
		return "drawing"
	case errors.Is(err, ErrNotReady):
		pause(c, "not_ready", "the sale is being prepared; try again shortly")
		return "not_ready"
	case errors.Is(err, ErrNoState):
		return h.explainNoState(c, id)
	case errors.Is(err, ErrNotReplicated):
		// The order may be taken and may land; only its copy on a replica is
		// unconfirmed. A new request gets a new order id, so it cannot take a
		// second unit: it answers already_purchased with the order if the
		// first was taken, and buys if a failover lost it.
		// The answer names the order: GET /api/v1/orders/{order_id} shows it
		// if it was taken (pending, then written), and 404 if a failover
		// lost it, and the buyer may buy again.
		h.warnRedis("purchase not confirmed by replicas", err)
		c.Header("Retry-After", "1")
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, apierr.Body{Code: "not_replicated", OrderID: orderID,
			Message: "your purchase may or may not have been taken: Redis did not confirm it in time. " +
				"Look up order_id shortly; buying again answers already_purchased with it if it was taken"})
		return "not_replicated"
	case errors.Is(err, ErrWrongType):
		// Not an outage: Redis answers, but a key is damaged and stays so
		// until an operator removes it. Nothing was reserved.
		h.logThrottled(slog.LevelError, "purchase refused: a sale state key has the wrong type", err)
		pause(c, "unavailable", "purchases are unavailable; try again shortly")
		return "unavailable"
	default:
		h.warnRedis("purchase failed", err)
		pause(c, "unavailable", "purchases are unavailable; try again shortly")
		return "unavailable"
	}
}

// explainNoState answers a purchase of a voucher Redis knows nothing about,
// from the database: unknown, ended, or state not loaded yet. It returns
// the answer's code.
func (h *HTTP) explainNoState(c *gin.Context, id int64) string {
	v, err := h.store.Get(c.Request.Context(), id)
	switch {
	case errors.Is(err, ErrNotFound):
		apierr.Abort(c, http.StatusNotFound, "voucher_not_found", "no voucher has this id")
		return "voucher_not_found"
	case err != nil:
		h.log.Error("look up voucher failed", "voucher_id", id, "err", err)
		pause(c, "unavailable", "purchases are unavailable; try again shortly")
		return "unavailable"
	case !time.Now().Before(v.EndAt):
		apierr.Abort(c, http.StatusForbidden, "ended", "the sale has ended")
		return "ended"
	default:
		pause(c, "not_ready", "the sale is being prepared; try again shortly")
		return "not_ready"
	}
}

// warnRedis logs a Redis failure at most once a second: during an outage
// every request fails the same way, and one line says it.
func (h *HTTP) warnRedis(msg string, err error) { h.logThrottled(slog.LevelWarn, msg, err) }

// logThrottled logs at most one line a second, whatever the message.
func (h *HTTP) logThrottled(level slog.Level, msg string, err error) {
	now := time.Now().UnixNano()
	last := h.lastWarn.Load()
	if now-last < int64(time.Second) || !h.lastWarn.CompareAndSwap(last, now) {
		return
	}
	h.log.Log(context.Background(), level, msg, "err", err)
}
