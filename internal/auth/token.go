// Package auth issues and checks the bearer tokens that carry a caller's
// identity: an HS256 JWT with the user id, a role and an expiry. The user id
// of a request comes only from its token.
package auth

import (
	"errors"
	"fmt"
	"strconv"
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
	var c claims
	_, err := s.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return s.secret, nil })
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	uid, err := strconv.ParseInt(c.Subject, 10, 64)
	if err != nil || uid <= 0 {
		return Identity{}, fmt.Errorf("%w: bad subject", ErrInvalidToken)
	}
	if c.Role != RoleUser && c.Role != RoleAdmin {
		return Identity{}, fmt.Errorf("%w: bad role", ErrInvalidToken)
	}
	return Identity{UserID: uid, Role: c.Role}, nil
}
