package auth

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

	"seckill/internal/testenv"
)

// TestVersionClaim: an admin token carries its version, read back on the
// first parse and from the cache alike; a token of version 0 is written as
// before versions existed (no "ver"); a negative version is refused.
func TestVersionClaim(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	for _, want := range []Identity{{UserID: 5, Role: RoleAdmin, Version: 3}, {UserID: 5, Role: RoleAdmin}, {UserID: 9, Role: RoleUser}} {
		tok, err := s.Mint(want, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 { // verified, then cached
			if got, err := s.Parse(tok); err != nil || got != want {
				t.Errorf("Parse = %+v, %v; want %+v", got, err, want)
			}
		}
		payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
		if has := strings.Contains(string(payload), `"ver"`); has != (want.Version != 0) {
			t.Errorf("the token of %+v has a ver claim: %v (%s)", want, has, payload)
		}
	}
	if _, err := s.Mint(Identity{UserID: 5, Role: RoleAdmin, Version: -1}, time.Minute); err == nil {
		t.Error("a negative version was minted")
	}
	forged := signed(t, jwt.MapClaims{"role": RoleAdmin, "ver": -2, "iss": issuer, "sub": "5", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Minute).Unix()})
	if _, err := s.Parse(forged); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("a token of version -2 parsed: %v", err)
	}
}

// signed is a token of claims signed with the test secret, as another
// minter (or an older release) would make it.
func signed(t testing.TB, c jwt.MapClaims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestAdminMaxTTL: with a cap, Mint refuses a longer admin token (a
// buyer's is not capped), and an admin token that lives longer, or does
// not say when it was issued, is refused however it was minted.
func TestAdminMaxTTL(t *testing.T) {
	t.Parallel()
	capped := mustSigner(t, secret, WithAdminMaxTTL(time.Hour))
	if _, err := capped.Mint(Identity{UserID: 1, Role: RoleAdmin}, time.Hour+time.Second); !errors.Is(err, ErrAdminTTL) {
		t.Errorf("an admin token past the cap: %v, want ErrAdminTTL", err)
	}
	for _, c := range []struct {
		id  Identity
		ttl time.Duration
	}{{Identity{UserID: 1, Role: RoleAdmin}, time.Hour}, {Identity{UserID: 2, Role: RoleUser}, 48 * time.Hour}} {
		tok, err := capped.Mint(c.id, c.ttl)
		if err != nil {
			t.Fatalf("mint %+v for %s: %v", c.id, c.ttl, err)
		}
		if _, err := capped.Parse(tok); err != nil {
			t.Errorf("%+v for %s refused: %v", c.id, c.ttl, err)
		}
	}
	uncapped := mustSigner(t, secret)
	long, _ := uncapped.Mint(Identity{UserID: 1, Role: RoleAdmin}, 30*24*time.Hour)
	if _, err := capped.Parse(long); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("a 30-day admin token parsed under a 1h cap: %v", err)
	}
	now := time.Now()
	noIat := signed(t, jwt.MapClaims{"role": RoleAdmin, "iss": issuer, "sub": "1", "exp": now.Add(time.Minute).Unix()})
	if _, err := capped.Parse(noIat); !errors.Is(err, ErrInvalidToken) {
		t.Errorf("an admin token without iat parsed under a cap: %v", err)
	}
	if _, err := uncapped.Parse(noIat); err != nil {
		t.Errorf("without a cap an admin token without iat is refused: %v", err)
	}
}

// versionsTable is a VersionReader in memory, counting its reads.
type versionsTable struct {
	mu    sync.Mutex
	v     map[int64]int64
	err   error
	reads atomic.Int64
}

func (f *versionsTable) Current(_ context.Context, user int64) (int64, error) {
	f.reads.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.v[user], f.err
}

func (f *versionsTable) set(user, v int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.v[user], f.err = v, err
}

// TestGuard: an admin token is taken while its version is its user's and
// refused (401, revoked) from the request after the user's version rose,
// on a route that needs no admin role too; one minted at the new version
// is taken; buyers' tokens are never looked up; a version that cannot be
// read answers 503, never lets the token through.
func TestGuard(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	s := mustSigner(t, secret)
	table := &versionsTable{v: map[int64]int64{}}
	g := NewGuard(s, table, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r := gin.New()
	r.GET("/me", g.Middleware(), func(c *gin.Context) { c.Status(204) })
	r.GET("/admin", g.Middleware(), RequireAdmin(), func(c *gin.Context) { c.Status(204) })
	mint := func(id Identity) string {
		tok, err := s.Mint(id, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	do := func(path, tok string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		r.ServeHTTP(w, req)
		return w
	}
	old, buyer := mint(Identity{UserID: 5, Role: RoleAdmin}), mint(Identity{UserID: 5, Role: RoleUser})
	for _, path := range []string{"/admin", "/me"} {
		if w := do(path, old); w.Code != 204 {
			t.Fatalf("%s with the admin token before any revocation: %d %s", path, w.Code, w.Body)
		}
	}
	table.set(5, 1, nil)
	for _, path := range []string{"/admin", "/me"} {
		w := do(path, old)
		if w.Code != 401 || !strings.Contains(w.Body.String(), "revoked") || !strings.Contains(w.Header().Get("WWW-Authenticate"), "invalid_token") {
			t.Errorf("%s with a revoked admin token: %d %q %s", path, w.Code, w.Header().Get("WWW-Authenticate"), w.Body)
		}
	}
	fresh := mint(Identity{UserID: 5, Role: RoleAdmin, Version: 1})
	if w := do("/admin", fresh); w.Code != 204 {
		t.Errorf("the admin token minted after the revocation: %d %s", w.Code, w.Body)
	}
	reads := table.reads.Load()
	if w := do("/me", buyer); w.Code != 204 {
		t.Errorf("the user's buyer token: %d %s", w.Code, w.Body)
	}
	if w := do("/admin", buyer); w.Code != 403 {
		t.Errorf("a buyer token on an admin route: %d, want 403", w.Code)
	}
	if n := table.reads.Load() - reads; n != 0 {
		t.Errorf("buyers' tokens read the versions %d times", n)
	}
	table.set(5, 1, errors.New("database down"))
	if w := do("/admin", fresh); w.Code != 503 {
		t.Errorf("an admin token whose version cannot be read: %d, want 503", w.Code)
	}
}

// TestVersions: on SQLite and MySQL a user starts at version 0, each
// revocation raises it by one, and revocations at once each get their own
// version: 50 released together end at 50, each number once.
func TestVersions(t *testing.T) {
	t.Parallel()
	for _, dialect := range []string{"sqlite", "mysql"} {
		t.Run(dialect, func(t *testing.T) {
			t.Parallel()
			v := NewVersions(mustDB(t, dialect == "mysql"))
			ctx := context.Background()
			if got, err := v.Current(ctx, 7); err != nil || got != 0 {
				t.Fatalf("a user never revoked: %d, %v; want 0", got, err)
			}
			for want := int64(1); want <= 2; want++ {
				if got, err := v.Revoke(ctx, 7, time.Now()); err != nil || got != want {
					t.Fatalf("revoke %d: %d, %v", want, got, err)
				}
				if got, err := v.Current(ctx, 7); err != nil || got != want {
					t.Fatalf("after revoke %d: %d, %v", want, got, err)
				}
			}
			if got, _ := v.Current(ctx, 8); got != 0 {
				t.Fatalf("another user moved to %d", got)
			}
			const n = 50
			start := make(chan struct{})
			var wg sync.WaitGroup
			got := make([]int64, n)
			for i := range n {
				wg.Go(func() {
					<-start
					ver, err := v.Revoke(ctx, 9, time.Now())
					if err != nil {
						t.Error(err)
					}
					got[i] = ver
				})
			}
			close(start)
			wg.Wait()
			slices.Sort(got)
			for i, ver := range got {
				if ver != int64(i+1) {
					t.Fatalf("versions of %d revocations at once: %v; want 1 to %d, each once", n, got, n)
				}
			}
		})
	}
}

// TestLoginAdminToken: an admin phone's login gets a token that carries
// its user's version and lives at most the signer's cap, however long
// SECKILL_TOKEN_TTL; a buyer's lives TokenTTL.
func TestLoginAdminToken(t *testing.T) {
	t.Parallel()
	const admin = "+15550000002"
	g := mustDB(t, true)
	versions := NewVersions(g)
	signer := mustSigner(t, secret, WithAdminMaxTTL(time.Hour))
	box := &outbox{}
	l := NewLogin(testenv.Redis(t), NewUsers(g), signer, box, LoginConfig{
		KeyPrefix: testenv.Prefix(t), TokenTTL: 48 * time.Hour, Admins: []string{admin}, Versions: versions, Resend: time.Millisecond,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	login := func(phone string) Session {
		t.Helper()
		sendEventually(t, l, phone, home)
		s, err := l.Verify(ctx, phone, box.last(t, phone), home)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := login(admin)
	if _, err := versions.Revoke(ctx, first.Identity.UserID, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		phone   string
		role    string
		version int64
		ttl     time.Duration
	}{{admin, RoleAdmin, 1, time.Hour}, {phone, RoleUser, 0, 48 * time.Hour}} {
		s := login(c.phone)
		id, err := signer.Parse(s.Token)
		if err != nil || id.Role != c.role || id.Version != c.version {
			t.Errorf("%s's login token: %+v, %v; want role %s, version %d", c.phone, id, err, c.role, c.version)
		}
		if left := time.Until(s.ExpiresAt); left > c.ttl || left < c.ttl-time.Minute {
			t.Errorf("%s's login token expires in %s, want %s", c.phone, left, c.ttl)
		}
	}
}
