// Package auth issues and checks the bearer tokens that carry a caller's
// identity: an HS256 JWT with the user id, a role and an expiry, and for an
// admin token the version of its user's admin tokens it was minted at (a
// revocation raises the version: Versions, Guard). The user id of a request
// comes only from its token.
package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Roles a token can carry.
const (
	RoleUser  = "user"
	RoleAdmin = "admin"
)

const issuer = "seckill"

// MinSecretLen is the shortest HS256 secret accepted; shorter ones can be
// brute-forced offline from any token.
const MinSecretLen = 32

// ErrInvalidToken is returned for every token that must be refused: missing,
// malformed, expired, forged, signed with another algorithm.
var ErrInvalidToken = errors.New("invalid token")

// Identity is who a request acts for.
type Identity struct {
	UserID int64
	Role   string
	// Version is an admin token's version: its user's admin token version
	// when it was minted (the "ver" claim; 0 when it has none). Guard
	// refuses the token once its user's version is higher.
	Version int64
}

// Admin reports whether the identity may run admin operations.
func (id Identity) Admin() bool { return id.Role == RoleAdmin }

// Signer mints and verifies tokens with one shared secret.
type Signer struct {
	secret []byte
	parser *jwt.Parser
	// check validates claims exactly as parser does; head is the header
	// segment every token of Mint starts with; macs holds macStates keyed
	// with secret. Together they are the fast path of verify.
	check *jwt.Validator
	head  string
	macs  sync.Pool
	// seen caches tokens already verified, until they expire: in a flash
	// sale one buyer sends the same token many times, and verifying it
	// (base64, HMAC, JSON) is a third of a purchase's CPU. At maxSeen
	// tokens it starts over.
	seen atomic.Pointer[seenSet]
	// now is the clock every expiry is read against (Mint, verify and
	// the cache alike); time.Now unless WithClock says otherwise.
	now func() time.Time
	// adminTTL, when set, is the longest lifetime of an admin token: Mint
	// refuses a longer one and verify refuses one minted longer.
	adminTTL time.Duration
}

// SignerOption adjusts a Signer made by NewSigner.
type SignerOption func(*Signer)

// WithClock makes the Signer read the time from now instead of time.Now:
// tokens it mints start at now(), and a token, cached or not, is refused
// once now() passes its expiry. Tests use it to step over an expiry
// without waiting for one.
func WithClock(now func() time.Time) SignerOption {
	return func(s *Signer) { s.now = now }
}

// WithAdminMaxTTL caps the lifetime of admin tokens at d: Mint refuses to
// make a longer one (ErrAdminTTL), and a token that says it lives longer
// (its expiry minus its issue time; no issue time counts as longer) is
// refused as invalid, whoever minted it, those minted before the cap
// included. Lifetimes are whole seconds in a token: a second over d is
// allowed for the rounding.
func WithAdminMaxTTL(d time.Duration) SignerOption {
	return func(s *Signer) { s.adminTTL = d }
}

// ErrAdminTTL is Mint's refusal of an admin token longer than the cap.
var ErrAdminTTL = errors.New("admin token lifetime above the cap")

// maxSeen bounds the verified-token cache (about 250 bytes an entry).
const maxSeen = 1 << 16

// seenShards spreads the verified-token cache over locks.
const seenShards = 32

// maxSeenLen is the longest token the cache keeps; a longer one (no token
// of Mint is) is verified every time.
const maxSeenLen = 512

// seenSet is the verified-token cache. A token is keyed by the start of
// its signature, the text after its last dot: HMAC output, spread evenly.
// The entry holds the whole token, and a token is answered from the cache
// only when it is that token, byte for byte: a verified token's signature
// pasted onto another header or payload is verified in full, and refused;
// two tokens whose signatures start alike only take each other's place.
//
// Nothing in its entries is a pointer: the tokens' bytes are copied into a
// slab per shard and the entries say where, so the garbage collector
// neither scans the cache nor keeps the requests' header strings alive.
// In a sale where nearly every buyer is new (the first presses), a cache
// of strings and times held up to 65,536 request headers and their
// entries, marked at every collection (loadtest/README.md, "wrk and
// bench").
type seenSet struct {
	n      atomic.Int64
	shards [seenShards]seenShard
}

type seenShard struct {
	sync.Mutex
	m    map[seenKey]verified
	text [][]byte // the tokens of m, one after another, in chunks of seenChunk
}

// seenChunk is the size of a slab chunk: a token never spans two, and a
// full chunk is never copied into a larger one (that was as many bytes
// again of garbage per new token).
const seenChunk = 16 << 10

// seenKey is the cache's key for a token: the start of its signature.
type seenKey [16]byte

// verified is a cached token: where its text is in the shard's slab (at
// counts bytes from the start of the first chunk), the identity it
// carries and its expiry (time.Unix(expSec, expNsec)).
type verified struct {
	at, n   uint32
	uid     int64
	ver     int64
	expSec  int64
	expNsec int32
	admin   bool
}

// tokenOf returns the text of e.
func (sh *seenShard) tokenOf(e verified) []byte {
	chunk, off := e.at/seenChunk, e.at%seenChunk
	return sh.text[chunk][off : off+e.n]
}

func (v verified) identity() Identity {
	if v.admin {
		return Identity{UserID: v.uid, Role: RoleAdmin, Version: v.ver}
	}
	return Identity{UserID: v.uid, Role: RoleUser, Version: v.ver}
}

func newSeenSet() *seenSet {
	set := &seenSet{}
	for i := range set.shards {
		set.shards[i].m = map[seenKey]verified{}
	}
	return set
}

func (set *seenSet) shard(key *seenKey) *seenShard {
	return &set.shards[(uint(key[0])*31+uint(key[1]))%seenShards]
}

// keyOf returns the cache's key for token.
func keyOf(token string) seenKey {
	var k seenKey
	copy(k[:], token[strings.LastIndexByte(token, '.')+1:])
	return k
}

// lookup returns the identity of token when the shard holds it, verified
// and not expired at now; an expired entry is dropped.
func (sh *seenShard) lookup(key *seenKey, token string, now time.Time) (Identity, bool) {
	sh.Lock()
	defer sh.Unlock()
	e, ok := sh.m[*key]
	if !ok || string(sh.tokenOf(e)) != token {
		return Identity{}, false
	}
	if !now.Before(time.Unix(e.expSec, int64(e.expNsec))) {
		delete(sh.m, *key)
		return Identity{}, false
	}
	return e.identity(), true
}

// store keeps a verified token: its text at the end of the slab.
func (sh *seenShard) store(key *seenKey, token string, id Identity, exp time.Time) {
	sh.Lock()
	defer sh.Unlock()
	last := len(sh.text) - 1
	if last < 0 || len(sh.text[last])+len(token) > seenChunk {
		sh.text = append(sh.text, make([]byte, 0, seenChunk))
		last++
	}
	at := last*seenChunk + len(sh.text[last])
	sh.text[last] = append(sh.text[last], token...)
	sh.m[*key] = verified{at: uint32(at), n: uint32(len(token)), uid: id.UserID, ver: id.Version,
		expSec: exp.Unix(), expNsec: int32(exp.Nanosecond()), admin: id.Role == RoleAdmin}
}

// NewSigner returns a Signer; the secret must be at least MinSecretLen bytes.
func NewSigner(secret []byte, options ...SignerOption) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("token secret: need at least %d bytes, got %d", MinSecretLen, len(secret))
	}
	s := &Signer{secret: secret, now: time.Now}
	for _, o := range options {
		o(s)
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(issuer),
		jwt.WithLeeway(5 * time.Second),
		jwt.WithTimeFunc(s.now),
	}
	s.parser, s.check = jwt.NewParser(opts...), jwt.NewValidator(opts...)
	s.macs.New = func() any { return &macState{mac: hmac.New(sha256.New, s.secret)} }
	// The header Mint writes: the library's, encoded as the library does.
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{}).SignedString(secret)
	if err != nil {
		return nil, fmt.Errorf("token secret: %w", err)
	}
	s.head, _, _ = strings.Cut(tok, ".")
	return s, nil
}

type claims struct {
	Role string `json:"role"`
	// Ver is the admin token's version (Identity.Version); left out when
	// 0, so tokens of version 0 are written as before versions existed.
	Ver int64 `json:"ver,omitempty"`
	jwt.RegisteredClaims
}

// MaxAdminTTL is the cap on admin tokens' lifetime (WithAdminMaxTTL); 0
// when there is none.
func (s *Signer) MaxAdminTTL() time.Duration { return s.adminTTL }

// Mint returns a signed token for the user, role and version, valid for
// ttl. An admin token longer than the cap is refused (ErrAdminTTL).
func (s *Signer) Mint(id Identity, ttl time.Duration) (string, error) {
	if id.UserID <= 0 {
		return "", fmt.Errorf("mint token: user id must be positive, got %d", id.UserID)
	}
	if id.Role != RoleUser && id.Role != RoleAdmin {
		return "", fmt.Errorf("mint token: unknown role %q", id.Role)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("mint token: ttl must be positive")
	}
	if id.Version < 0 {
		return "", fmt.Errorf("mint token: version must not be negative, got %d", id.Version)
	}
	if id.Role == RoleAdmin && s.adminTTL > 0 && ttl > s.adminTTL {
		return "", fmt.Errorf("mint token: %w: %s, at most %s", ErrAdminTTL, ttl, s.adminTTL)
	}
	now := s.now()
	c := claims{
		Role: id.Role,
		Ver:  id.Version,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    issuer,
			Subject:   strconv.FormatInt(id.UserID, 10),
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	}
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(s.secret)
	if err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	return tok, nil
}

// Parse verifies a token and returns the identity it carries.
func (s *Signer) Parse(token string) (Identity, error) {
	if len(token) > maxSeenLen {
		id, _, err := s.verify(token)
		return id, err
	}
	key := keyOf(token)
	set := s.cache()
	if id, ok := set.shard(&key).lookup(&key, token, s.now()); ok {
		return id, nil
	}
	id, exp, err := s.verify(token)
	if err != nil {
		return Identity{}, err
	}
	if set.n.Add(1) > maxSeen {
		set = newSeenSet()
		set.n.Store(1)
		s.seen.Store(set)
	}
	set.shard(&key).store(&key, token, id, exp)
	return id, nil
}

func (s *Signer) cache() *seenSet {
	if set := s.seen.Load(); set != nil {
		return set
	}
	s.seen.CompareAndSwap(nil, newSeenSet())
	return s.seen.Load()
}

// verify checks a token fully and returns its identity and expiry.
//
// In a flash sale nearly every buyer's first purchase brings a token not
// seen before, and the library's general parse (header JSON, reflection,
// a new HMAC per token) was a sixth of a purchase's CPU. A token with the
// exact header Mint writes takes a short path with the same checks: the
// HMAC-SHA256 signature over header.payload compared in constant time,
// the claims decoded as the library decodes them (claims in Mint's own
// form without reflection) and validated by the library's validator with
// the parser's options. Any other header goes
// through the library's parser, which accepts or refuses it (alg none, RS256,
// ...) on its own terms. FuzzVerifyAgrees holds the two paths to the same
// answers.
func (s *Signer) verify(token string) (Identity, time.Time, error) {
	head, rest, ok := strings.Cut(token, ".")
	if !ok || head != s.head {
		return s.verifyFull(token)
	}
	var c claims
	if err := s.verifyShort(token, rest, &c); err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	return s.identityOf(c)
}

// macState is an HMAC-SHA256 keyed with the secret, and the scratch
// space verifyShort uses beside it: the token's text, its decoded
// signature, the MAC it computes and the decoded claims.
type macState struct {
	mac  hash.Hash
	text []byte
	raw  [2 * sha256.Size]byte
	sum  [sha256.Size]byte
	body []byte
}

// maxScratch bounds the scratch space a pooled macState keeps: a huge
// token is checked, but its copy is not held on to.
const maxScratch = 4 << 10

// putMAC returns st to the pool, without scratch space grown past maxScratch.
func (s *Signer) putMAC(st *macState) {
	if cap(st.text) > maxScratch || cap(st.body) > maxScratch {
		st.text, st.body = nil, nil
	}
	s.macs.Put(st)
}

// verifyShort checks the signature and claims of a token whose header is
// s.head; rest is what follows the header's dot.
func (s *Signer) verifyShort(token, rest string, c *claims) error {
	_, sig, ok := strings.Cut(rest, ".")
	if !ok || strings.Contains(sig, ".") {
		return jwt.ErrTokenMalformed
	}
	// One copy of the token into pooled scratch space: the conversions of
	// its parts to bytes were three allocations per new token.
	st := s.macs.Get().(*macState)
	defer s.putMAC(st)
	st.text = append(st.text[:0], token...)
	signed, sigB := st.text[:len(token)-len(sig)-1], st.text[len(token)-len(sig):]
	payloadB := st.text[len(token)-len(rest) : len(token)-len(sig)-1]
	// The decoder skips line breaks, as the library's does: decode, then
	// compare, rather than judge by the text's length.
	var raw []byte
	var err error
	if base64.RawURLEncoding.DecodedLen(len(sigB)) <= len(st.raw) {
		var n int
		n, err = base64.RawURLEncoding.Decode(st.raw[:], sigB)
		raw = st.raw[:n]
	} else {
		raw, err = base64.RawURLEncoding.DecodeString(sig)
	}
	if err != nil {
		return jwt.ErrTokenMalformed
	}
	st.mac.Reset()
	st.mac.Write(signed)
	if !hmac.Equal(st.mac.Sum(st.sum[:0]), raw) {
		return jwt.ErrTokenSignatureInvalid
	}
	st.body = slices.Grow(st.body[:0], base64.RawURLEncoding.DecodedLen(len(payloadB)))
	n, err := base64.RawURLEncoding.Decode(st.body[:cap(st.body)], payloadB)
	if err != nil {
		return jwt.ErrTokenMalformed
	}
	body := st.body[:n]
	if !mintedClaims(body, c) {
		if err := json.Unmarshal(body, c); err != nil {
			return jwt.ErrTokenMalformed
		}
	}
	return s.check.Validate(c)
}

// mintedClaims decodes claims written exactly as Mint writes them,
//
//	{"role":"user","iss":"seckill","sub":"42","exp":1796091320,"iat":1796004920}
//
// into c, as json.Unmarshal would, without reflection. It reports false,
// leaving c alone, for anything else (other order, spacing, escapes,
// fields or number forms): json.Unmarshal decodes those.
func mintedClaims(b []byte, c *claims) bool {
	rest, ok := bytes.CutPrefix(b, []byte(`{"role":"`))
	if !ok {
		return false
	}
	var role string
	switch {
	case bytes.HasPrefix(rest, []byte(RoleUser+`"`)):
		role = RoleUser
	case bytes.HasPrefix(rest, []byte(RoleAdmin+`"`)):
		role = RoleAdmin
	default:
		return false
	}
	rest = rest[len(role)+1:]
	rest, ok = bytes.CutPrefix(rest, []byte(`,"iss":"`+issuer+`","sub":"`))
	if !ok {
		return false
	}
	sub, _, rest, ok := plainInt(rest, 18)
	if !ok {
		return false
	}
	rest, ok = bytes.CutPrefix(rest, []byte(`","exp":`))
	if !ok {
		return false
	}
	_, exp, rest, ok := plainInt(rest, 15)
	if !ok {
		return false
	}
	rest, ok = bytes.CutPrefix(rest, []byte(`,"iat":`))
	if !ok {
		return false
	}
	_, iat, rest, ok := plainInt(rest, 15)
	if !ok || string(rest) != "}" {
		return false
	}
	*c = claims{Role: role, RegisteredClaims: jwt.RegisteredClaims{
		Issuer:    issuer,
		Subject:   string(sub),
		ExpiresAt: jwt.NewNumericDate(time.Unix(exp, 0)),
		IssuedAt:  jwt.NewNumericDate(time.Unix(iat, 0)),
	}}
	return true
}

// plainInt reads 1 to max decimal digits without a leading zero from the
// start of b: the digits, their value, and what follows. Numbers of up to
// 15 digits are exact in the float64 through which json.Unmarshal reads
// a NumericDate.
func plainInt(b []byte, max int) (digits []byte, n int64, rest []byte, ok bool) {
	i := 0
	for i < len(b) && i <= max && '0' <= b[i] && b[i] <= '9' {
		n = n*10 + int64(b[i]-'0')
		i++
	}
	if i == 0 || i > max || (b[0] == '0' && i > 1) {
		return nil, 0, nil, false
	}
	return b[:i], n, b[i:], true
}

// verifyFull checks a token with the library's parser.
func (s *Signer) verifyFull(token string) (Identity, time.Time, error) {
	var c claims
	_, err := s.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return s.secret, nil })
	if err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	return s.identityOf(c)
}

// identityOf returns the identity of verified claims, or refuses claims
// that name no valid user and role, a negative version, or an admin token
// that lives longer than the cap.
func (s *Signer) identityOf(c claims) (Identity, time.Time, error) {
	uid, err := strconv.ParseInt(c.Subject, 10, 64)
	if err != nil || uid <= 0 {
		return Identity{}, time.Time{}, fmt.Errorf("%w: bad subject", ErrInvalidToken)
	}
	if c.Role != RoleUser && c.Role != RoleAdmin {
		return Identity{}, time.Time{}, fmt.Errorf("%w: bad role", ErrInvalidToken)
	}
	if c.Ver < 0 {
		return Identity{}, time.Time{}, fmt.Errorf("%w: bad version", ErrInvalidToken)
	}
	if c.Role == RoleAdmin && s.adminTTL > 0 && (c.IssuedAt == nil || c.ExpiresAt.Sub(c.IssuedAt.Time) > s.adminTTL+time.Second) {
		return Identity{}, time.Time{}, fmt.Errorf("%w: an admin token living longer than %s", ErrInvalidToken, s.adminTTL)
	}
	return Identity{UserID: uid, Role: c.Role, Version: c.Ver}, c.ExpiresAt.Time, nil
}
