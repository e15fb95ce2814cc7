// Package auth issues and checks the bearer tokens that carry a caller's
// identity: an HS256 JWT with the user id, a role and an expiry. The user id
// of a request comes only from its token.
package auth

import (
	"errors"
	"fmt"
	"strconv"
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
}

// Admin reports whether the identity may run admin operations.
func (id Identity) Admin() bool { return id.Role == RoleAdmin }

// Signer mints and verifies tokens with one shared secret.
type Signer struct {
	secret []byte
	parser *jwt.Parser
	// seen caches tokens already verified, until they expire: in a flash
	// sale one buyer sends the same token many times, and verifying it
	// (base64, HMAC, JSON) is a third of a purchase's CPU.
	seen atomic.Pointer[sync.Map]
	// seenN counts entries in seen; at maxSeen it starts over.
	seenN atomic.Int64
}

// maxSeen bounds the verified-token cache (about 300 bytes an entry).
const maxSeen = 1 << 16

type verified struct {
	id  Identity
	exp time.Time
}

// NewSigner returns a Signer; the secret must be at least MinSecretLen bytes.
func NewSigner(secret []byte) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("token secret: need at least %d bytes, got %d", MinSecretLen, len(secret))
	}
	return &Signer{
		secret: secret,
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(),
			jwt.WithIssuer(issuer),
			jwt.WithLeeway(5*time.Second),
		),
	}, nil
}

type claims struct {
	Role string `json:"role"`
	jwt.RegisteredClaims
}

// Mint returns a signed token for the user and role, valid for ttl.
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
	now := time.Now()
	c := claims{
		Role: id.Role,
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
	m := s.cache()
	if v, ok := m.Load(token); ok {
		if e := v.(verified); time.Now().Before(e.exp) {
			return e.id, nil
		}
		m.Delete(token)
	}
	id, exp, err := s.verify(token)
	if err != nil {
		return Identity{}, err
	}
	if s.seenN.Add(1) > maxSeen {
		s.seen.Store(new(sync.Map))
		s.seenN.Store(1)
		m = s.cache()
	}
	m.Store(token, verified{id: id, exp: exp})
	return id, nil
}

func (s *Signer) cache() *sync.Map {
	if m := s.seen.Load(); m != nil {
		return m
	}
	s.seen.CompareAndSwap(nil, new(sync.Map))
	return s.seen.Load()
}

// verify checks a token fully and returns its identity and expiry.
func (s *Signer) verify(token string) (Identity, time.Time, error) {
	var c claims
	_, err := s.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return s.secret, nil })
	if err != nil {
		return Identity{}, time.Time{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	uid, err := strconv.ParseInt(c.Subject, 10, 64)
	if err != nil || uid <= 0 {
		return Identity{}, time.Time{}, fmt.Errorf("%w: bad subject", ErrInvalidToken)
	}
	if c.Role != RoleUser && c.Role != RoleAdmin {
		return Identity{}, time.Time{}, fmt.Errorf("%w: bad role", ErrInvalidToken)
	}
	return Identity{UserID: uid, Role: c.Role}, c.ExpiresAt.Time, nil
}
