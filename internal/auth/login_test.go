package auth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"seckill/internal/db"
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

func (o *outbox) last(t *testing.T, phone string) string {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	cs := o.codes[phone]
	if len(cs) == 0 {
		t.Fatalf("no code sent to %s", phone)
	}
	return cs[len(cs)-1]
}

func mustDB(t *testing.T, mysql bool) *gorm.DB {
	t.Helper()
	var g *gorm.DB
	var err error
	if mysql {
		g, err = db.OpenMySQL(testenv.MySQLDSN(t), 8)
	} else {
		g, err = db.OpenSQLite(filepath.Join(t.TempDir(), "t.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(g) })
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

func newLoginFixture(t *testing.T, cfg LoginConfig) loginFixture {
	t.Helper()
	cfg.KeyPrefix = testenv.Prefix(t)
	box := &outbox{}
	g := mustDB(t, true)
	l := NewLogin(testenv.Redis(t), NewUsers(g), mustSigner(t, secret), box, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return loginFixture{login: l, box: box, g: g}
}

const phone = "+8613800138000"

func TestLoginRoundTrip(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Admins: []string{"+15550000001"}, Resend: time.Millisecond})
	ctx := context.Background()
	if err := f.login.SendCode(ctx, phone); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	s, err := f.login.Verify(ctx, phone, code)
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
	if _, err := f.login.Verify(ctx, phone, code); !errors.Is(err, ErrNoCode) {
		t.Fatalf("second use of a code: %v, want ErrNoCode", err)
	}
	// A later login is the same user.
	sendEventually(t, f.login, phone)
	s2, err := f.login.Verify(ctx, phone, f.box.last(t, phone))
	if err != nil || s2.NewUser || s2.Identity.UserID != s.Identity.UserID {
		t.Fatalf("second login: %+v, %v; want user %d", s2, err, s.Identity.UserID)
	}
	// A configured admin phone gets the admin role.
	if err := f.login.SendCode(ctx, "+15550000001"); err != nil {
		t.Fatal(err)
	}
	a, err := f.login.Verify(ctx, "+15550000001", f.box.last(t, "+15550000001"))
	if err != nil || a.Identity.Role != RoleAdmin || a.Identity.UserID == s.Identity.UserID {
		t.Fatalf("admin login: %+v, %v", a, err)
	}
}

// sendEventually sends a code, retrying while the resend guard (set short
// by the test) has not run out: a condition with a deadline, not a sleep.
func sendEventually(t *testing.T, l *Login, phone string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := l.SendCode(context.Background(), phone)
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
	if err := f.login.SendCode(ctx, phone); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1_000_000)
	for want := 2; want >= 1; want-- {
		var w *WrongCodeError
		if _, err := f.login.Verify(ctx, phone, wrong); !errors.As(err, &w) || w.TriesLeft != want {
			t.Fatalf("wrong code: %v, want %d tries left", err, want)
		}
	}
	if _, err := f.login.Verify(ctx, phone, wrong); !errors.Is(err, ErrCodeLocked) {
		t.Fatalf("third wrong code: %v, want ErrCodeLocked", err)
	}
	if _, err := f.login.Verify(ctx, phone, code); !errors.Is(err, ErrCodeLocked) {
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
	if err := f.login.SendCode(ctx, phone); err != nil {
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
	if err := f.login.SendCode(ctx, phone); !errors.As(err, &w) || w.Reason != "resend" || w.Wait <= 0 || w.Wait > time.Minute {
		t.Fatalf("resend at once: %v", err)
	}
}

func TestCodesPerWindow(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodes: 3, Window: time.Hour})
	for range 3 {
		sendEventually(t, f.login, phone)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var w *WaitError
		err := f.login.SendCode(context.Background(), phone)
		if errors.As(err, &w) && w.Reason == "window" {
			if w.Wait <= 0 || w.Wait > time.Hour {
				t.Fatalf("window wait %v", w.Wait)
			}
			break
		}
		if !errors.As(err, &w) || time.Now().After(deadline) {
			t.Fatalf("4th code in the window: %v, want a window refusal", err)
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(f.box.codes[phone]); n != 3 {
		t.Fatalf("%d codes sent, want 3", n)
	}
}

func TestSendFailureForgetsTheCode(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	ctx := context.Background()
	f.box.fail.Store(true)
	if err := f.login.SendCode(ctx, phone); err == nil {
		t.Fatal("a failed send reported success")
	}
	f.box.fail.Store(false)
	if err := f.login.SendCode(ctx, phone); err != nil {
		t.Fatalf("asking again after a failed send: %v", err)
	}
}

func TestRefusedInput(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	ctx := context.Background()
	for _, p := range []string{"", "13800138000", "+0138001380", "+1234567", "+1234567890123456", "+86 138 0013 8000", "+86{1}38001380", "+８６１３８００１３８０００", "+8613800138000\n"} {
		if err := f.login.SendCode(ctx, p); !errors.Is(err, ErrBadPhone) {
			t.Errorf("SendCode(%q) = %v, want ErrBadPhone", p, err)
		}
		if _, err := f.login.Verify(ctx, p, "123456"); !errors.Is(err, ErrBadPhone) {
			t.Errorf("Verify(%q) = %v, want ErrBadPhone", p, err)
		}
	}
	for _, c := range []string{"", "12345", "1234567", "12345a", " 123456", "１２３４５６"} {
		if _, err := f.login.Verify(ctx, phone, c); !errors.Is(err, ErrBadCode) {
			t.Errorf("Verify code %q = %v, want ErrBadCode", c, err)
		}
	}
	if _, err := f.login.Verify(ctx, phone, "123456"); !errors.Is(err, ErrNoCode) {
		t.Errorf("verify without a code sent: %v, want ErrNoCode", err)
	}
	noSender := NewLogin(f.login.rdb, f.login.users, f.login.signer, nil, LoginConfig{KeyPrefix: testenv.Prefix(t)}, f.login.log)
	if err := noSender.SendCode(ctx, phone); !errors.Is(err, ErrNoSender) {
		t.Errorf("no sender: %v", err)
	}
}

// TestConcurrentVerify presses one right code 50 times at once: one login.
func TestConcurrentVerify(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{})
	if err := f.login.SendCode(context.Background(), phone); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	var ok atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			<-start
			_, err := f.login.Verify(context.Background(), phone, code)
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
