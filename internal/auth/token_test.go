package auth

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func mustSigner(t testing.TB, s []byte, opts ...SignerOption) *Signer {
	t.Helper()
	sg, err := NewSigner(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

func TestMintParseRoundTrip(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	for _, want := range []Identity{{UserID: 42, Role: RoleUser}, {UserID: 1, Role: RoleAdmin}} {
		tok, err := s.Mint(want, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.Parse(tok)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		if got != want {
			t.Fatalf("got %+v, want %+v", got, want)
		}
		// Tokens of Mint take verify's short path, claims included.
		if !strings.HasPrefix(tok, s.head+".") {
			t.Fatalf("token %q does not start with the header %q the short path expects", tok, s.head)
		}
		body, err := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
		if err != nil {
			t.Fatal(err)
		}
		var c claims
		if !mintedClaims(body, &c) || c.Role != want.Role || c.Subject != strconv.FormatInt(want.UserID, 10) {
			t.Fatalf("claims %s not read by mintedClaims (got %+v)", body, c)
		}
	}
}

func TestRefusedTokens(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	other := mustSigner(t, []byte("another-secret-another-secret-xx"))
	good, _ := s.Mint(Identity{UserID: 7, Role: RoleUser}, time.Minute)

	forged, _ := other.Mint(Identity{UserID: 7, Role: RoleAdmin}, time.Minute)
	expired, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{Role: RoleUser, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: issuer, Subject: "7", ExpiresAt: jwt.NewNumericDate(time.Now().Add(-time.Minute)),
	}}).SignedString(secret)
	noExpiry, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{Role: RoleUser, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: issuer, Subject: "7",
	}}).SignedString(secret)
	badRole, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{Role: "root", RegisteredClaims: jwt.RegisteredClaims{
		Issuer: issuer, Subject: "7", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute)),
	}}).SignedString(secret)
	badSubject, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{Role: RoleUser, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: issuer, Subject: "-3", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute)),
	}}).SignedString(secret)
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, claims{Role: RoleUser, RegisteredClaims: jwt.RegisteredClaims{
		Issuer: issuer, Subject: "7", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Minute)),
	}}).SignedString(secret)
	// alg none: a header saying "none", the good token's claims, no signature.
	parts := strings.Split(good, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + parts[1] + "."
	// A good token with one claim byte changed keeps its signature.
	tampered := parts[0] + "." + parts[1][:len(parts[1])-2] + "A" + parts[1][len(parts[1])-1:] + "." + parts[2]

	cases := map[string]string{
		"empty": "", "garbage": "not.a.token", "forged": forged, "expired": expired, "no expiry": noExpiry,
		"bad role": badRole, "bad subject": badSubject, "hs512": hs512, "alg none": none, "tampered": tampered,
	}
	for name, tok := range cases {
		if _, err := s.Parse(tok); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%s: err = %v, want ErrInvalidToken", name, err)
		}
	}
}

func TestShortSecretRefused(t *testing.T) {
	t.Parallel()
	if _, err := NewSigner([]byte("short")); err == nil {
		t.Fatal("a 5-byte secret was accepted")
	}
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.TestMode)
	s := mustSigner(t, secret)
	r := gin.New()
	r.GET("/me", s.Middleware(), func(c *gin.Context) { c.JSON(200, gin.H{"user": From(c).UserID}) })
	r.GET("/admin", s.Middleware(), RequireAdmin(), func(c *gin.Context) { c.Status(204) })
	user, _ := s.Mint(Identity{UserID: 9, Role: RoleUser}, time.Minute)
	admin, _ := s.Mint(Identity{UserID: 1, Role: RoleAdmin}, time.Minute)

	do := func(path, header string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		r.ServeHTTP(w, req)
		return w
	}
	for _, tc := range []struct {
		path, header string
		status       int
	}{
		{"/me", "", 401},
		{"/me", "Bearer", 401},
		{"/me", "Basic " + user, 401},
		{"/me", "Bearer " + user + "x", 401},
		{"/me", "Bearer " + user, 200},
		{"/admin", "Bearer " + user, 403},
		{"/admin", "Bearer " + admin, 204},
	} {
		w := do(tc.path, tc.header)
		if w.Code != tc.status {
			t.Errorf("%s with %q: status %d, want %d", tc.path, tc.header, w.Code, tc.status)
		}
		if tc.status >= 400 && !strings.Contains(w.Body.String(), `"code"`) {
			t.Errorf("%s: error body without a code: %s", tc.path, w.Body.String())
		}
	}
	if w := do("/me", "Bearer "+user); !strings.Contains(w.Body.String(), `"user":9`) {
		t.Errorf("identity not passed on: %s", w.Body.String())
	}
}

// TestVerifiedTokenCache: a verified token is answered from the cache, and
// the cache never lets anything else through.
func TestVerifiedTokenCache(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	tok, _ := s.Mint(Identity{UserID: 5, Role: RoleUser}, time.Minute)
	start := make(chan struct{})
	errs := make(chan error, 200)
	for range 200 {
		go func() {
			<-start
			id, err := s.Parse(tok)
			if err == nil && id.UserID != 5 {
				err = errors.New("wrong identity from the cache")
			}
			errs <- err
		}()
	}
	close(start)
	for range 200 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	parts := strings.Split(tok, ".")
	for _, bad := range []string{tok + "x", parts[0] + "." + parts[1] + ".", tok[:len(tok)-1]} {
		if _, err := s.Parse(bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%q accepted after the good token was cached", bad)
		}
	}
	// The cache finds a token by its signature: the signature of the
	// cached token pasted onto another payload or header is still refused.
	other6, _ := s.Mint(Identity{UserID: 6, Role: RoleAdmin}, time.Minute)
	p6 := strings.Split(other6, ".")
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	for _, spliced := range []string{p6[0] + "." + p6[1] + "." + parts[2], none + "." + parts[1] + "." + parts[2], parts[1] + "." + parts[2]} {
		if id, err := s.Parse(spliced); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("%q with the cached token's signature: %+v, %v", spliced, id, err)
		}
	}
	// Another signer (another secret) does not share the cache.
	other := mustSigner(t, []byte("another-secret-another-secret-xx"))
	if _, err := other.Parse(tok); !errors.Is(err, ErrInvalidToken) {
		t.Fatal("a token of another secret was accepted")
	}
}

// BenchmarkVerify checks a token never seen before, as a buyer's first
// purchase does: the short path against the library's parser.
func BenchmarkVerify(b *testing.B) {
	s := mustSigner(b, secret)
	tok, err := s.Mint(Identity{UserID: 42, Role: RoleUser}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    func(string) (Identity, time.Time, error)
	}{{"short", s.verify}, {"library", s.verifyFull}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := c.f(tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestTokenStopsAtItsExpiry: a token works until its expiry (plus the
// parser's five seconds of leeway for clocks apart) and not after, whether
// it was verified before (and sits in the cache) or is seen for the first
// time.
func TestTokenStopsAtItsExpiry(t *testing.T) {
	t.Parallel()
	// A whole second: expiries are written in whole seconds.
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := newFakeClock(t0)
	s := mustSigner(t, secret, WithClock(clock.now))
	want := Identity{UserID: 9, Role: RoleUser}
	cached, err := s.Mint(want, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := s.Mint(Identity{UserID: 10, Role: RoleUser}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := s.Parse(cached); err != nil || id != want {
		t.Fatalf("at minting: %+v, %v", id, err)
	}
	clock.advance(59 * time.Second)
	if id, err := s.Parse(cached); err != nil || id != want {
		t.Fatalf("a second before expiry: %+v, %v", id, err)
	}
	// Past the expiry and the leeway: refused, cached or not.
	clock.set(t0.Add(time.Minute + 6*time.Second))
	if id, err := s.Parse(cached); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a cached token after its expiry: %+v, %v", id, err)
	}
	if id, err := s.Parse(fresh); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a token first seen after its expiry: %+v, %v", id, err)
	}
	// Refused again, now that the cache has dropped it.
	if _, err := s.Parse(cached); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("a cached token after its expiry, asked twice: %v", err)
	}
	// A token minted by the clock's now is valid by the clock's now, though
	// the machine's own clock is years behind.
	late, err := s.Mint(want, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := s.Parse(late); err != nil || id != want {
		t.Fatalf("a token minted at the clock's time: %+v, %v", id, err)
	}
}

// BenchmarkParse is the middleware's check: tokens never seen before (a
// sale's first presses: verify, then cache), and one seen before.
func BenchmarkParse(b *testing.B) {
	s := mustSigner(b, secret)
	toks := make([]string, 1<<17)
	for i := range toks {
		toks[i], _ = s.Mint(Identity{UserID: int64(i + 1), Role: RoleUser}, time.Hour)
	}
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := s.Parse(toks[i%len(toks)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("seen", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Parse(toks[0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSeenCacheHoldsNoPointers: the verified-token cache's keys and
// entries hold no pointer, so the garbage collector skips its maps and no
// request's header string is kept alive by it.
func TestSeenCacheHoldsNoPointers(t *testing.T) {
	t.Parallel()
	var walk func(reflect.Type) bool
	walk = func(typ reflect.Type) bool {
		switch typ.Kind() {
		case reflect.Struct:
			for i := range typ.NumField() {
				if walk(typ.Field(i).Type) {
					return true
				}
			}
			return false
		case reflect.Array:
			return walk(typ.Elem())
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
			return false
		}
		return true
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[seenKey](), reflect.TypeFor[verified]()} {
		if walk(typ) {
			t.Errorf("%v holds a pointer", typ)
		}
	}
}

// TestSeenShardComparesWholeTokens: two tokens under one key (signatures
// that start alike) take each other's place and are never answered for
// each other; an expired entry is dropped; tokens fill several chunks.
func TestSeenShardComparesWholeTokens(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_900_000_000, 0)
	sh := &seenShard{m: map[seenKey]verified{}}
	a, b := "h.p.SIGNATURE-START-0123456789-a", "h.q.SIGNATURE-START-0123456789-b"
	key := keyOf(a)
	if keyOf(b) != key {
		t.Fatal("the two tokens should share a key")
	}
	sh.store(&key, a, Identity{UserID: 1, Role: RoleUser}, now.Add(time.Minute))
	if id, ok := sh.lookup(&key, b, now); ok {
		t.Fatalf("token b answered with a's entry: %+v", id)
	}
	if id, ok := sh.lookup(&key, a, now); !ok || id != (Identity{UserID: 1, Role: RoleUser}) {
		t.Fatalf("token a: %+v, %v", id, ok)
	}
	sh.store(&key, b, Identity{UserID: 2, Role: RoleAdmin}, now.Add(time.Minute))
	if _, ok := sh.lookup(&key, a, now); ok {
		t.Fatal("token a answered after b took its place")
	}
	if id, ok := sh.lookup(&key, b, now); !ok || id != (Identity{UserID: 2, Role: RoleAdmin}) {
		t.Fatalf("token b: %+v, %v", id, ok)
	}
	if _, ok := sh.lookup(&key, b, now.Add(time.Minute)); ok {
		t.Fatal("token b answered at its expiry")
	}
	if _, ok := sh.m[key]; ok {
		t.Fatal("an expired entry was kept")
	}
	// Enough tokens for several chunks: each is read back whole.
	toks := map[seenKey]string{}
	for i := range 4 * seenChunk / 60 {
		tok := fmt.Sprintf("h.p.%016d%s", i, strings.Repeat("x", i%80))
		k := keyOf(tok)
		toks[k] = tok
		sh.store(&k, tok, Identity{UserID: int64(i + 1), Role: RoleUser}, now.Add(time.Hour))
	}
	if len(sh.text) < 3 {
		t.Fatalf("%d chunks, want at least 3", len(sh.text))
	}
	for k, tok := range toks {
		if _, ok := sh.lookup(&k, tok, now); !ok {
			t.Fatalf("%q not found", tok)
		}
	}
}

// TestLongTokenVerifiedEachTime: a token longer than the cache keeps is
// verified at every use, and refused when tampered with.
func TestLongTokenVerifiedEachTime(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	long, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"role": RoleUser, "iss": issuer, "sub": "11", "exp": time.Now().Add(time.Minute).Unix(),
		"pad": strings.Repeat("p", maxSeenLen),
	}).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if id, err := s.Parse(long); err != nil || id != (Identity{UserID: 11, Role: RoleUser}) {
			t.Fatalf("long token: %+v, %v", id, err)
		}
	}
	if _, err := s.Parse(long[:len(long)-2] + "AA"); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("long token with another signature: %v", err)
	}
}

// TestHugeTokenScratchNotKept: a huge token with Mint's header is refused,
// and the pooled scratch space it grew is not kept.
func TestHugeTokenScratchNotKept(t *testing.T) {
	t.Parallel()
	s := mustSigner(t, secret)
	huge := s.head + "." + strings.Repeat("A", 64<<10) + ".sig"
	if _, err := s.Parse(huge); !errors.Is(err, ErrInvalidToken) {
		t.Fatalf("huge token: %v", err)
	}
	st := &macState{text: make([]byte, 0, 64<<10)}
	s.putMAC(st)
	if st.text != nil || st.body != nil {
		t.Fatalf("scratch of %d bytes kept", cap(st.text))
	}
}
