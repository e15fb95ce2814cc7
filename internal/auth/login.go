package auth

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"regexp"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"seckill/internal/ratelimit"
	"seckill/lua"
)

// Refusals of a login step; the HTTP edge turns each into a status and code.
var (
	ErrBadPhone   = errors.New("phone must be + and 8 to 15 digits")
	ErrBadCode    = errors.New("code must be 6 digits")
	ErrNoCode     = errors.New("no active code for this phone")
	ErrCodeLocked = errors.New("code locked after too many wrong tries")
	// ErrNoSender means login codes cannot be delivered: no sender is set up.
	ErrNoSender = errors.New("login codes are not delivered on this server")
)

// Reasons a code is refused, in WaitError.
const (
	// WaitResend: a code was sent to the phone less than Resend ago.
	WaitResend = "resend"
	// WaitWindow: this requester had its MaxCodesPerRequester for the phone.
	WaitWindow = "window"
	// WaitPhone: requesters that never logged in to the phone had its
	// MaxCodes.
	WaitPhone = "phone"
)

// WaitError means a code was refused to protect the phone: wait Wait.
type WaitError struct {
	Wait   time.Duration
	Reason string // WaitResend, WaitWindow or WaitPhone
}

func (e *WaitError) Error() string { return "code refused (" + e.Reason + "): wait " + e.Wait.String() }

// WrongCodeError is a wrong code that did not lock the code yet.
type WrongCodeError struct{ TriesLeft int }

func (e *WrongCodeError) Error() string { return fmt.Sprintf("wrong code, %d tries left", e.TriesLeft) }

// phoneRE is E.164: a plus, a country code that does not start with 0, and
// at most 15 digits in all. Keys and rows are built from numbers it passed.
var phoneRE = regexp.MustCompile(`^\+[1-9][0-9]{7,14}$`)
var codeRE = regexp.MustCompile(`^[0-9]{6}$`)

// ValidPhone reports whether phone is an E.164 number.
func ValidPhone(phone string) bool { return phoneRE.MatchString(phone) }

// LoginConfig tunes the code login. Zero fields take the defaults.
//
// The code limits bound the SMS a phone receives without letting anyone
// lock its owner out (lua/send_code.lua has the whole argument): a
// requester (client address; an IPv6 /64) has its own budget per phone,
// strangers to the phone share a ceiling, and requesters that logged in to
// the phone lately are held only by their own budget and a ceiling per
// phone that strangers cannot fill.
type LoginConfig struct {
	KeyPrefix string        // Redis key prefix; default "seckill"
	CodeTTL   time.Duration // how long a code is valid; default 5m
	Resend    time.Duration // least time between two codes to one phone; default 60s
	// MaxCodes is the codes per phone per Window for requesters that never
	// logged in to it, together: the bound on SMS strangers can make a
	// phone receive. Default 10.
	MaxCodes int
	// MaxCodesPerRequester is the codes per phone per Window one requester
	// gets; a login from it starts its count afresh. Default 3, at most
	// MaxCodes.
	MaxCodesPerRequester int
	// PhoneCeiling is the codes per phone per Window from any requester,
	// known ones included: the bound on SMS sent to one phone, whoever
	// asks (a login starts a requester's own count afresh, never this
	// one). Strangers fill at most MaxCodes of it. Default 2 * MaxCodes,
	// at least MaxCodes + MaxCodesPerRequester.
	PhoneCeiling int
	Window       time.Duration // default 24h
	// KnownRequesters is how many requesters that logged in to a phone
	// are remembered (the newest), each for KnownFor after its last login.
	// Defaults 5 and 30 days.
	KnownRequesters int
	KnownFor        time.Duration
	MaxTries        int           // wrong tries that lock a code (per trusted requester; shared by the rest); default 5
	TokenTTL        time.Duration // lifetime of the token a login gives; default 24h
	// Admins are the phones whose logins get the admin role. Their token
	// lives at most the signer's admin cap (Signer.MaxAdminTTL) and
	// carries the user's admin token version from Versions (0 when nil).
	Admins   []string
	Versions VersionReader
	// Now is the clock of user rows and tokens' issue; default time.Now.
	Now func() time.Time
}

// Login is the phone + one-time code login: codes live in Redis (shared by
// every instance, stored only as an HMAC), users in the database.
type Login struct {
	rdb    redis.UniversalClient
	users  *Users
	signer *Signer
	sender Sender
	cfg    LoginConfig
	keys   codeKeys
	send   *redis.Script
	unsend *redis.Script
	check  *redis.Script
	log    *slog.Logger
}

// NewLogin returns a Login. sender may be nil: codes are then refused with
// ErrNoSender. It does not own rdb.
func NewLogin(rdb redis.UniversalClient, users *Users, signer *Signer, sender Sender, cfg LoginConfig, log *slog.Logger) *Login {
	cfg.KeyPrefix = cmp.Or(cfg.KeyPrefix, "seckill")
	cfg.CodeTTL = cmp.Or(cfg.CodeTTL, 5*time.Minute)
	cfg.Resend = cmp.Or(cfg.Resend, time.Minute)
	cfg.MaxCodes = cmp.Or(cfg.MaxCodes, 10)
	cfg.MaxCodesPerRequester = min(cmp.Or(cfg.MaxCodesPerRequester, 3), cfg.MaxCodes)
	cfg.PhoneCeiling = max(cmp.Or(cfg.PhoneCeiling, 2*cfg.MaxCodes), cfg.MaxCodes+cfg.MaxCodesPerRequester)
	cfg.KnownRequesters = cmp.Or(cfg.KnownRequesters, 5)
	cfg.KnownFor = cmp.Or(cfg.KnownFor, 30*24*time.Hour)
	cfg.Window = cmp.Or(cfg.Window, 24*time.Hour)
	cfg.MaxTries = cmp.Or(cfg.MaxTries, 5)
	cfg.TokenTTL = cmp.Or(cfg.TokenTTL, 24*time.Hour)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Login{
		rdb: rdb, users: users, signer: signer, sender: sender, cfg: cfg,
		keys: codeKeys{prefix: cfg.KeyPrefix},
		send: lua.SendCode(), unsend: lua.UnsendCode(), check: lua.CheckCode(), log: log,
	}
}

// digest is what Redis keeps of a code: an HMAC under the token secret, so
// a copy of Redis does not hand out live codes.
func (l *Login) digest(phone, code string) string {
	m := hmac.New(sha256.New, l.signer.secret)
	m.Write([]byte("login-code\x00" + phone + "\x00" + code))
	return hex.EncodeToString(m.Sum(nil))
}

func newCode() (string, error) {
	n, err := rand.Int(rand.Reader, big.NewInt(1_000_000))
	if err != nil {
		return "", fmt.Errorf("make login code: %w", err)
	}
	return fmt.Sprintf("%06d", n.Int64()), nil
}

// requesterOf is who asks, for the code limits: the client address, or
// its /64 for IPv6 (ratelimit.AddrKey: the key of every per-address
// limit). Anything that is not an address is one requester, "unknown".
func requesterOf(addr string) string {
	if _, err := netip.ParseAddr(addr); err != nil {
		return "unknown"
	}
	return ratelimit.AddrKey(addr)
}

// SendCode makes a code for the phone, stores its digest and sends it.
// addr is the client address asking (the HTTP edge's ClientIP).
func (l *Login) SendCode(ctx context.Context, phone, addr string) error {
	if !ValidPhone(phone) {
		return ErrBadPhone
	}
	if l.sender == nil {
		return ErrNoSender
	}
	code, err := newCode()
	if err != nil {
		return err
	}
	req := requesterOf(addr)
	digest := l.digest(phone, code)
	keys := []string{l.keys.Code(phone), l.keys.Resend(phone), l.keys.Sent(phone), l.keys.SentTo(phone, req), l.keys.Known(phone), l.keys.Total(phone)}
	res, err := l.send.Run(ctx, l.rdb, keys, digest,
		l.cfg.CodeTTL.Milliseconds(), l.cfg.Resend.Milliseconds(), l.cfg.MaxCodes, l.cfg.MaxCodesPerRequester,
		l.cfg.Window.Milliseconds(), req, l.cfg.PhoneCeiling).Int64Slice()
	if err != nil {
		return fmt.Errorf("store login code: %w", err)
	}
	if len(res) != 2 {
		return fmt.Errorf("store login code: %d return values, want 2", len(res))
	}
	switch res[0] {
	case 0:
	case 1:
		return &WaitError{Wait: time.Duration(res[1]) * time.Millisecond, Reason: WaitResend}
	case 2:
		return &WaitError{Wait: time.Duration(res[1]) * time.Millisecond, Reason: WaitWindow}
	case 3:
		return &WaitError{Wait: time.Duration(res[1]) * time.Millisecond, Reason: WaitPhone}
	default:
		return fmt.Errorf("store login code: unknown status %d", res[0])
	}
	if err := l.sender.Send(ctx, phone, code); err != nil {
		// The phone never got it: forget it, give its place in the limits
		// back, and let the user ask again now.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if uerr := l.unsend.Run(cctx, l.rdb, []string{keys[0], keys[1], keys[2], keys[3], keys[5]}, digest, res[1]).Err(); uerr != nil {
			l.log.Warn("taking back an undelivered login code failed", "phone", MaskPhone(phone), "err", uerr)
		}
		return fmt.Errorf("send login code: %w", err)
	}
	l.log.Info("login code sent", "phone", MaskPhone(phone))
	return nil
}

// Session is what a login gives: a bearer token and who it is for.
type Session struct {
	Token     string
	ExpiresAt time.Time
	Identity  Identity
	NewUser   bool
}

// Verify checks the code, uses it up, finds or creates the user and mints
// a token. addr is the client address submitting it: a login remembers it
// as one that may ask the phone for codes past the strangers' ceiling. A
// failure after the code was used up (the database is down) needs a new
// code.
func (l *Login) Verify(ctx context.Context, phone, code, addr string) (Session, error) {
	if !ValidPhone(phone) {
		return Session{}, ErrBadPhone
	}
	if !codeRE.MatchString(code) {
		return Session{}, ErrBadCode
	}
	req := requesterOf(addr)
	keys := []string{l.keys.Code(phone), l.keys.SentTo(phone, req), l.keys.Known(phone)}
	res, err := l.check.Run(ctx, l.rdb, keys, l.digest(phone, code), l.cfg.MaxTries, req,
		l.cfg.Now().UnixMilli(), l.cfg.KnownFor.Milliseconds(), l.cfg.KnownRequesters).Int64Slice()
	if err != nil {
		return Session{}, fmt.Errorf("check login code: %w", err)
	}
	if len(res) != 2 {
		return Session{}, fmt.Errorf("check login code: %d return values, want 2", len(res))
	}
	switch res[0] {
	case 0:
	case 1:
		return Session{}, ErrNoCode
	case 2:
		return Session{}, &WrongCodeError{TriesLeft: int(res[1])}
	case 3:
		return Session{}, ErrCodeLocked
	default:
		return Session{}, fmt.Errorf("check login code: unknown status %d", res[0])
	}
	now := l.cfg.Now()
	usr, created, err := l.users.Login(ctx, phone, now)
	if err != nil {
		return Session{}, err
	}
	id := Identity{UserID: usr.ID, Role: RoleUser}
	ttl := l.cfg.TokenTTL
	if slices.Contains(l.cfg.Admins, phone) {
		id.Role = RoleAdmin
		if most := l.signer.MaxAdminTTL(); most > 0 {
			ttl = min(ttl, most)
		}
		if l.cfg.Versions != nil {
			if id.Version, err = l.cfg.Versions.Current(ctx, id.UserID); err != nil {
				return Session{}, err
			}
		}
	}
	tok, err := l.signer.Mint(id, ttl)
	if err != nil {
		return Session{}, err
	}
	l.log.Info("user logged in", "user_id", id.UserID, "role", id.Role, "new_user", created)
	return Session{Token: tok, ExpiresAt: now.Add(ttl).UTC(), Identity: id, NewUser: created}, nil
}
