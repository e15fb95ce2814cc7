package auth

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestRequesterBudgetAtMostMaxCodes: a requester's own budget is at most
// MaxCodes, whatever MaxCodesPerRequester says: an owner who logged in (so
// the strangers' ceiling does not hold them) still gets MaxCodes codes a
// window, not 5.
func TestRequesterBudgetAtMostMaxCodes(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodes: 2, MaxCodesPerRequester: 5, Window: time.Hour})
	sendEventually(t, f.login, phone, home)
	if _, err := f.login.Verify(context.Background(), phone, f.box.last(t, phone), home); err != nil {
		t.Fatal(err)
	}
	if n, w := sendUntilRefused(t, f.login, phone, home); n != 2 || w.Reason != WaitWindow {
		t.Fatalf("the owner after logging in: %d codes, then %+v; want MaxCodes (2), then a window refusal", n, w)
	}
}

// TestPhoneCeilingAboveStrangersAndOwner: a PhoneCeiling set below
// MaxCodes + MaxCodesPerRequester is raised to it, so strangers who took
// their whole share cannot leave the owner less than their own budget.
func TestPhoneCeilingAboveStrangersAndOwner(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{Resend: time.Millisecond, MaxCodes: 2, MaxCodesPerRequester: 2, PhoneCeiling: 3, Window: time.Hour})
	// The owner's first code, before their first login, is a stranger's.
	sendEventually(t, f.login, phone, home)
	if _, err := f.login.Verify(context.Background(), phone, f.box.last(t, phone), home); err != nil {
		t.Fatal(err)
	}
	if n, w := sendUntilRefused(t, f.login, phone, "203.0.113.1"); n != 1 || w.Reason != WaitPhone {
		t.Fatalf("a stranger: %d codes, then %+v; want what is left of the strangers' 2", n, w)
	}
	if n, w := sendUntilRefused(t, f.login, phone, home); n != 2 || w.Reason != WaitWindow {
		t.Fatalf("the owner after the strangers: %d codes, then %+v; want their own budget (2), then a window refusal", n, w)
	}
}

// TestStrangersShareMaxTries: wrong guesses from requesters that neither
// asked for the code nor logged in to the phone share MaxTries: the
// MaxTries-th wrong guess, whoever sends it, locks the code for them.
func TestStrangersShareMaxTries(t *testing.T) {
	t.Parallel()
	f := newLoginFixture(t, LoginConfig{MaxTries: 3})
	ctx := context.Background()
	if err := f.login.SendCode(ctx, phone, home); err != nil {
		t.Fatal(err)
	}
	code := f.box.last(t, phone)
	wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1_000_000)
	for i, left := range []int{2, 1} {
		var w *WrongCodeError
		if _, err := f.login.Verify(ctx, phone, wrong, fmt.Sprintf("203.0.113.%d", i)); !errors.As(err, &w) || w.TriesLeft != left {
			t.Fatalf("stranger's wrong guess %d: %v, want %d tries left", i+1, err, left)
		}
	}
	if _, err := f.login.Verify(ctx, phone, wrong, "203.0.113.9"); !errors.Is(err, ErrCodeLocked) {
		t.Fatalf("the strangers' third wrong guess: %v, want ErrCodeLocked", err)
	}
	if _, err := f.login.Verify(ctx, phone, code, "203.0.113.10"); !errors.Is(err, ErrCodeLocked) {
		t.Fatalf("a stranger with the right code after the lock: %v, want ErrCodeLocked", err)
	}
}
