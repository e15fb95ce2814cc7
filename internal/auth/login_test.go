package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/testenv"
	schema "seckill/sql"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// outbox is a Sender that keeps the codes for the test to read.
type outbox struct {
	mu    sync.Mutex
	codes map[string][]string
	fail  atomic.Bool
}

func (o *outbox) Send(_ context.Context, phone, code string) error {
	if o.fail.Load() {
		return errors.New("gateway down")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.codes == nil {
		o.codes = map[string][]string{}
	}
	o.codes[phone] = append(o.codes[phone], code)
	return nil
}

func (o *outbox) last(t testing.TB, phone string) string {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	cs := o.codes[phone]
	if len(cs) == 0 {
		t.Fatalf("no code sent to %s", phone)
	}
	return cs[len(cs)-1]
}

func mustDB(t testing.TB, mysql bool) *gorm.DB {
	t.Helper()
	dialect := "sqlite"
	if mysql {
		dialect = "mysql"
	}
	g := testenv.DB(t, dialect)
	if _, err := schema.Apply(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	return g
}

type loginFixture struct {
	login *Login
	box   *outbox
	g     *gorm.DB
}

func newLoginFixture(t testing.TB, cfg LoginConfig) loginFixture {
	t.Helper()
	cfg.KeyPrefix = testenv.Prefix(t)
	box := &outbox{}
	g := mustDB(t, true)
	l := NewLogin(testenv.Redis(t), NewUsers(g), mustSigner(t, secret), box, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return loginFixture{login: l, box: box, g: g}
}

const phone = "+8613800138000"

// home is the address the phone's owner asks from.
const home = "198.51.100.7"

func TestLoginRoundTrip(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Admins: []string{"+15550000001"}, Resend: time.Millisecond})
	ctx := context.Background()
	if err := f.login.SendCode(ctx, phone, home); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	s, err := f.login.Verify(ctx, phone, code, home)
	if err != nil {
		t.Fatal(err)
	}
	if !s.NewUser || s.Identity.UserID < 1_000_000 || s.Identity.Role != RoleUser {
		t.Fatalf("first login: %+v", s)
	}
	got, err := f.login.signer.Parse(s.Token)
	if err != nil || got != s.Identity {
		t.Fatalf("token carries %+v, %v; want %+v", got, err, s.Identity)
	}
	// The code is single-use.
	if _, err := f.login.Verify(ctx, phone, code, home); !errors.Is(err, ErrNoCode) {
		t.Fatalf("second use of a code: %v, want ErrNoCode", err)
	}
	// A later login is the same user.
	sendEventually(t, f.login, phone, home)
	s2, err := f.login.Verify(ctx, phone, f.box.last(t, phone), home)
	if err != nil || s2.NewUser || s2.Identity.UserID != s.Identity.UserID {
		t.Fatalf("second login: %+v, %v; want user %d", s2, err, s.Identity.UserID)
	}
	// A configured admin phone gets the admin role.
	if err := f.login.SendCode(ctx, "+15550000001", home); err != nil {
		t.Fatal(err)
	}
	a, err := f.login.Verify(ctx, "+15550000001", f.box.last(t, "+15550000001"), home)
	if err != nil || a.Identity.Role != RoleAdmin || a.Identity.UserID == s.Identity.UserID {
		t.Fatalf("admin login: %+v, %v", a, err)
	}
}

// sendEventually sends a code, retrying while the resend guard (set short
// by the test) has not run out: a condition with a deadline, not a sleep.
func sendEventually(t testing.TB, l *Login, phone, addr string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := l.SendCode(context.Background(), phone, addr)
		var w *WaitError
		if !errors.As(err, &w) || w.Reason != "resend" {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resend guard did not run out: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWrongTriesLockTheCode(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{MaxTries: 3})
	ctx := context.Background()
	if err := f.login.SendCode(ctx, phone, home); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1_000_000)
	for want := 2; want >= 1; want-- {
		var w *WrongCodeError
		if _, err := f.login.Verify(ctx, phone, wrong, home); !errors.As(err, &w) || w.TriesLeft != want {
			t.Fatalf("wrong code: %v, want %d tries left", err, want)
		}
	}
	if _, err := f.login.Verify(ctx, phone, wrong, home); !errors.Is(err, ErrCodeLocked) {
		t.Fatalf("third wrong code: %v, want ErrCodeLocked", err)
	}
	if _, err := f.login.Verify(ctx, phone, code, home); !errors.Is(err, ErrCodeLocked) {
		t.Fatalf("right code after the lock: %v, want ErrCodeLocked", err)
	}
	var n int64
	f.g.Model(&User{}).Count(&n)
	if n != 0 {
		t.Fatalf("%d users created by failed logins", n)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func TestCodeStorage(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{CodeTTL: 90 * time.Second})
	ctx := context.Background()
	if err := f.login.SendCode(ctx, phone, home); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	rdb := f.login.rdb
	ttl, err := rdb.PTTL(ctx, f.login.keys.Code(phone)).Result()
	if err != nil || ttl <= 0 || ttl > 90*time.Second {
		t.Fatalf("code key ttl %v, %v; want (0, 90s]", ttl, err)
	}
	vals, err := rdb.HGetAll(ctx, f.login.keys.Code(phone)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range vals {
		if strings.Contains(v, code) {
			t.Fatalf("redis keeps the code in clear in field %s", k)
		}
	}
	// Resend too soon: refused, with the wait.
	var w *WaitError
	if err := f.login.SendCode(ctx, phone, home); !errors.As(err, &w) || w.Reason != "resend" || w.Wait <= 0 || w.Wait > time.Minute {
		t.Fatalf("resend at once: %v", err)
	}
}

// sendUntilRefused asks for codes from addr until a refusal other than the
// resend wait, and returns how many were sent and the refusal.
func sendUntilRefused(t testing.TB, l *Login, phone, addr string) (int, *WaitError) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	sent := 0
	for {
		err := l.SendCode(context.Background(), phone, addr)
		var w *WaitError
		switch {
		case err == nil:
			sent++
		case !errors.As(err, &w):
			t.Fatalf("code for %s from %s: %v", phone, addr, err)
		case w.Reason != WaitResend:
			return sent, w
		}
		if time.Now().After(deadline) {
			t.Fatalf("no refusal from %s after %d codes", addr, sent)
		}
		time.Sleep(time.Millisecond)
	}
}

func (o *outbox) count(phone string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.codes[phone])
}

func TestCodesPerWindow(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodes: 4, MaxCodesPerRequester: 2, Window: time.Hour})
	n, w := sendUntilRefused(t, f.login, phone, home)
	if n != 2 || w.Reason != WaitWindow || w.Wait <= 0 || w.Wait > time.Hour {
		t.Fatalf("one address: %d codes, then %+v; want 2, then a window refusal within the hour", n, w)
	}
	n, w = sendUntilRefused(t, f.login, phone, "203.0.113.1")
	if n != 2 || w.Reason != WaitWindow {
		t.Fatalf("a second address: %d codes, then %+v; want its own 2", n, w)
	}
	n, w = sendUntilRefused(t, f.login, phone, "203.0.113.2")
	if n != 0 || w.Reason != WaitPhone || w.Wait <= 0 || w.Wait > time.Hour {
		t.Fatalf("a third address: %d codes, then %+v; want the phone's ceiling of 4", n, w)
	}
	if n := f.box.count(phone); n != 4 {
		t.Fatalf("%d codes sent, want 4", n)
	}
	// Another phone has limits of its own.
	if err := f.login.SendCode(context.Background(), "+15550000002", home); err != nil {
		t.Fatal(err)
	}
}

// TestStrangersCannotLockOutTheOwner: strangers asking for the owner's
// codes, from one address or many, never stop the owner from getting a code
// and logging in, and the SMS strangers make the phone receive stay within
// the ceiling.
func TestStrangersCannotLockOutTheOwner(t *testing.T) {
	t.Parallel()
	const ceiling, each = 10, 3
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodes: ceiling, MaxCodesPerRequester: each, Window: time.Hour})
	ctx := context.Background()
	login := func(addr string) Session {
		t.Helper()
		sendEventually(t, f.login, phone, addr)
		s, err := f.login.Verify(ctx, phone, f.box.last(t, phone), addr)
		if err != nil {
			t.Fatalf("owner's login from %s: %v", addr, err)
		}
		return s
	}

	// One stranger asks again and again: it runs out of its own budget,
	// not the owner's.
	if n, w := sendUntilRefused(t, f.login, phone, "203.0.113.1"); n != each || w.Reason != WaitWindow {
		t.Fatalf("stranger: %d codes, then %+v; want %d, then a window refusal", n, w, each)
	}
	first := login(home)

	// Strangers from many addresses use up the ceiling (the owner's first
	// code counts in it: home had not logged in yet).
	strangers := each + 1
	for i := 2; strangers < ceiling+each; i++ {
		n, w := sendUntilRefused(t, f.login, phone, fmt.Sprintf("203.0.113.%d", i))
		strangers += n
		if w.Reason == WaitPhone {
			break
		}
	}
	if strangers != ceiling {
		t.Fatalf("%d codes sent to the phone for requesters that never logged in, want the ceiling %d", strangers, ceiling)
	}
	// A code a stranger made the phone receive logs the owner in, from
	// wherever the owner is.
	if _, err := f.login.Verify(ctx, phone, f.box.last(t, phone), "192.0.2.50"); err != nil {
		t.Fatalf("owner's login with the code a stranger asked for: %v", err)
	}
	// A new stranger gets nothing; the owner's device does, login after
	// login (each login starts its budget afresh).
	if n, w := sendUntilRefused(t, f.login, phone, "203.0.113.200"); n != 0 || w.Reason != WaitPhone {
		t.Fatalf("a stranger past the ceiling: %d codes, %+v", n, w)
	}
	for range 2 * each {
		if s := login(home); s.Identity.UserID != first.Identity.UserID {
			t.Fatalf("user %d, want %d", s.Identity.UserID, first.Identity.UserID)
		}
	}
	if n := f.box.count(phone); n != ceiling+2*each {
		t.Fatalf("%d codes sent to the phone, want %d before home logged in and %d after", n, ceiling, 2*each)
	}
	// Without logging in, even the owner's device stops at its budget.
	if n, w := sendUntilRefused(t, f.login, phone, home); n != each || w.Reason != WaitWindow {
		t.Fatalf("owner without logging in: %d codes, then %+v; want %d", n, w, each)
	}
}

// TestStrangersCannotLockTheOwnersCode: wrong guesses from strangers lock
// the code for strangers only; the owner who asked for it, or who logged in
// from where they submit it, still logs in with it.
func TestStrangersCannotLockTheOwnersCode(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxTries: 3})
	ctx := context.Background()
	guess := func(code string) {
		t.Helper()
		wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1_000_000)
		locked := false
		for i := range 6 {
			_, err := f.login.Verify(ctx, phone, wrong, fmt.Sprintf("203.0.113.%d", i))
			var w *WrongCodeError
			switch {
			case errors.Is(err, ErrCodeLocked):
				locked = true
			case !errors.As(err, &w) || locked:
				t.Fatalf("stranger's guess %d: %v", i, err)
			}
		}
		if !locked {
			t.Fatal("strangers' guesses never locked the code")
		}
		if _, err := f.login.Verify(ctx, phone, code, "203.0.113.99"); !errors.Is(err, ErrCodeLocked) {
			t.Fatalf("a stranger with the right code after the lock: %v, want ErrCodeLocked", err)
		}
	}

	sendEventually(t, f.login, phone, home)
	code := f.box.last(t, phone)
	guess(code)
	if _, err := f.login.Verify(ctx, phone, code, home); err != nil {
		t.Fatalf("the owner who asked for the code: %v", err)
	}
	// Now home has logged in: a code a stranger asked for, locked for
	// strangers, still logs the owner in there.
	sendEventually(t, f.login, phone, "203.0.113.50")
	code = f.box.last(t, phone)
	guess(code)
	if _, err := f.login.Verify(ctx, phone, code, home); err != nil {
		t.Fatalf("the owner from a device that logged in before: %v", err)
	}
}

// TestKnownRequestersBounded: a phone remembers its newest logins only.
func TestKnownRequestersBounded(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, KnownRequesters: 2})
	ctx := context.Background()
	for i := range 4 {
		addr := fmt.Sprintf("192.0.2.%d", i)
		sendEventually(t, f.login, phone, addr)
		if _, err := f.login.Verify(ctx, phone, f.box.last(t, phone), addr); err != nil {
			t.Fatal(err)
		}
	}
	known, err := f.login.rdb.ZRange(ctx, f.login.keys.Known(phone), 0, -1).Result()
	if err != nil || len(known) != 2 || known[0] != "192.0.2.2" || known[1] != "192.0.2.3" {
		t.Fatalf("known requesters %v, %v; want the newest two", known, err)
	}
	if ttl := f.login.rdb.PTTL(ctx, f.login.keys.Known(phone)).Val(); ttl <= 0 || ttl > 30*24*time.Hour {
		t.Fatalf("known requesters kept for %v", ttl)
	}
}

func TestRequesterOf(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"203.0.113.7":          "203.0.113.7",
		"::ffff:203.0.113.7":   "203.0.113.7",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64",
		"2001:db8:1:2::ffff":   "2001:db8:1:2::/64",
		"fe80::1%eth0":         "fe80::/64",
		"":                     "unknown",
		"not-an-address":       "unknown",
		"203.0.113.7:443":      "unknown",
		"}:code{":              "unknown",
	} {
		if got := requesterOf(in); got != want {
			t.Errorf("requesterOf(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSendFailureForgetsTheCode(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	ctx := context.Background()
	f.box.fail.Store(true)
	if err := f.login.SendCode(ctx, phone, home); err == nil {
		t.Fatal("a failed send reported success")
	}
	f.box.fail.Store(false)
	if err := f.login.SendCode(ctx, phone, home); err != nil {
		t.Fatalf("asking again after a failed send: %v", err)
	}
}

// TestSendFailureGivesTheBudgetBack: an SMS gateway outage costs no one
// their codes: many failed sends from one address, and from strangers, leave
// every budget whole once the gateway is back.
func TestSendFailureGivesTheBudgetBack(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{MaxCodes: 4, MaxCodesPerRequester: 2, Resend: time.Millisecond})
	ctx := context.Background()
	f.box.fail.Store(true)
	for i := range 10 {
		for _, addr := range []string{home, "203.0.113.9"} {
			var wait *WaitError
			err := f.login.SendCode(ctx, phone, addr)
			if err == nil || errors.As(err, &wait) {
				t.Fatalf("send %d from %s with the gateway down: %v, want the gateway's error", i, addr, err)
			}
		}
	}
	f.box.fail.Store(false)
	// Each address still has its 2 codes (the strangers' ceiling of 4 holds
	// both), as if the outage had never been.
	for _, addr := range []string{home, "203.0.113.9"} {
		if n, wait := sendUntilRefused(t, f.login, phone, addr); n != 2 || wait == nil || wait.Reason != WaitWindow {
			t.Fatalf("%s after the outage: %d codes, then %v; want 2, then its window", addr, n, wait)
		}
	}
}

func TestRefusedInput(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	ctx := context.Background()
	for _, p := range []string{"", "13800138000", "+0138001380", "+1234567", "+1234567890123456", "+86 138 0013 8000", "+86{1}38001380", "+８６１３８００１３８０００", "+8613800138000\n"} {
		if err := f.login.SendCode(ctx, p, home); !errors.Is(err, ErrBadPhone) {
			t.Errorf("SendCode(%q) = %v, want ErrBadPhone", p, err)
		}
		if _, err := f.login.Verify(ctx, p, "123456", home); !errors.Is(err, ErrBadPhone) {
			t.Errorf("Verify(%q) = %v, want ErrBadPhone", p, err)
		}
	}
	for _, c := range []string{"", "12345", "1234567", "12345a", " 123456", "１２３４５６"} {
		if _, err := f.login.Verify(ctx, phone, c, home); !errors.Is(err, ErrBadCode) {
			t.Errorf("Verify code %q = %v, want ErrBadCode", c, err)
		}
	}
	if _, err := f.login.Verify(ctx, phone, "123456", home); !errors.Is(err, ErrNoCode) {
		t.Errorf("verify without a code sent: %v, want ErrNoCode", err)
	}
	noSender := NewLogin(f.login.rdb, f.login.users, f.login.signer, nil, LoginConfig{KeyPrefix: testenv.Prefix(t)}, f.login.log)
	if err := noSender.SendCode(ctx, phone, home); !errors.Is(err, ErrNoSender) {
		t.Errorf("no sender: %v", err)
	}
}

// TestConcurrentVerify presses one right code 50 times at once: one login.
func TestConcurrentVerify(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	if err := f.login.SendCode(context.Background(), phone, home); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	var ok atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			<-start
			_, err := f.login.Verify(context.Background(), phone, code, home)
			switch {
			case err == nil:
				ok.Add(1)
			case !errors.Is(err, ErrNoCode):
				t.Errorf("verify: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d logins with one code, want 1", ok.Load())
	}
}

// TestConcurrentFirstLogin makes one user out of simultaneous first logins,
// on MySQL and SQLite.
func TestConcurrentFirstLogin(t *testing.T) {
	t.Parallel()
	for _, mysql := range []bool{true, false} {
		t.Run(fmt.Sprintf("mysql=%v", mysql), func(t *testing.T) {
			t.Parallel()
			users := NewUsers(mustDB(t, mysql))
			var created atomic.Int64
			ids := make(chan int64, 20)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range 20 {
				wg.Go(func() {
					<-start
					u, c, err := users.Login(context.Background(), phone, time.Now())
					if err != nil {
						t.Error(err)
						return
					}
					if c {
						created.Add(1)
					}
					ids <- u.ID
				})
			}
			close(start)
			wg.Wait()
			close(ids)
			first := int64(0)
			for id := range ids {
				if first == 0 {
					first = id
				}
				if id != first || id < 1_000_000 {
					t.Fatalf("user ids %d and %d for one phone (want >= 1000000)", first, id)
				}
			}
			if created.Load() != 1 {
				t.Fatalf("%d creations, want 1", created.Load())
			}
		})
	}
}

// TestLoginsCannotLiftThePhoneCeiling: a login starts the address's own
// count afresh, but asking and logging in again and again still stops at
// the phone's ceiling: no one can make a phone receive SMS without bound,
// its owner included. Strangers alone cannot fill that ceiling.
func TestLoginsCannotLiftThePhoneCeiling(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{MaxCodes: 4, MaxCodesPerRequester: 2, Resend: time.Millisecond})
	ctx := context.Background()
	ceiling := f.login.cfg.PhoneCeiling
	if ceiling != 8 {
		t.Fatalf("phone ceiling %d, want 2 * MaxCodes = 8", ceiling)
	}
	// The owner has logged in from home before; then strangers take their
	// whole share.
	sendEventually(t, f.login, phone, home)
	if _, err := f.login.Verify(ctx, phone, f.box.last(t, phone), home); err != nil {
		t.Fatal(err)
	}
	strangers := 0
	for i := range 3 {
		n, _ := sendUntilRefused(t, f.login, phone, fmt.Sprintf("203.0.113.%d", i+1))
		strangers += n
	}
	// The owner's first code, asked before their first login, counted as
	// a stranger's.
	if strangers != 4-1 {
		t.Fatalf("strangers got %d codes, want the strangers' ceiling less the owner's first", strangers)
	}
	// The owner asks and logs in, again and again.
	sent := 1
	for range 3 * ceiling {
		n, w := sendUntilRefused(t, f.login, phone, home)
		sent += n
		if n == 0 {
			if w.Reason != WaitPhone {
				t.Fatalf("refused after %d codes by %v, want the phone's ceiling", sent, w)
			}
			break
		}
		if _, err := f.login.Verify(ctx, phone, f.box.last(t, phone), home); err != nil {
			t.Fatal(err)
		}
	}
	if total := f.box.count(phone); total != ceiling || sent != ceiling-strangers {
		t.Fatalf("the phone got %d codes (the owner %d), want the ceiling %d (the owner %d)", total, sent, ceiling, ceiling-strangers)
	}
}
