package auth

import (
	"slices"
	"testing"
)

// TestPhoneForms: the forms people type a phone number in each read as
// the E.164 number users are stored under; a national number is the home
// country's; anything else is no phone.
func TestPhoneForms(t *testing.T) {
	t.Parallel()
	const mobile = "+8613800138000"
	for _, tc := range []struct {
		typed string
		want  []string
	}{
		{"+8613800138000", []string{mobile}},
		{"+86 138 0013 8000", []string{mobile}},
		{" +86-138-0013-8000 ", []string{mobile}},
		{"+86 (138) 0013.8000", []string{mobile}},
		{"0086 138 0013 8000", []string{mobile}},
		{"13800138000", []string{mobile, "+13800138000"}},
		{"138 0013 8000", []string{mobile, "+13800138000"}},
		{"138-0013-8000", []string{mobile, "+13800138000"}},
		{"138.0013.8000", []string{mobile, "+13800138000"}},
		{"138/0013/8000", []string{mobile, "+13800138000"}},
		{"138\u00a00013\u00a08000", []string{mobile, "+13800138000"}},
		{"１３８ ００１３ ８０００", []string{mobile, "+13800138000"}},
		{"＋８６　１３８００１３８０００", []string{mobile}},
		// The country code without its +: the number, or a national one.
		{"8613800138000", []string{"+868613800138000", mobile}},
		{"(86) 138 0013 8000", []string{"+868613800138000", mobile}},
		// A national number's trunk 0 is not part of the E.164 number.
		{"010 8888 6666", []string{"+861088886666"}},
		{"+1 (555) 000-0001", []string{"+15550000001"}},
		{"001 555 000 0001", []string{"+15550000001"}},
		// Too short or too long for E.164 as typed: only what fits.
		{"8000", nil},
		{"1234567", []string{"+861234567"}},
		{"+86 138 0013 8000 0000 0", nil},
		{"+0 138 0013 8000", nil},
		{"", nil},
		{"  ", nil},
		{"+", nil},
		{"--", nil},
		{"138 0013 800O", nil},
		{"86+13800138000", nil},
		{"++8613800138000", nil},
		{"ABCDE12345", nil},
		{"tel:+8613800138000", nil},
	} {
		if got := PhoneForms(tc.typed, HomeCountry); !slices.Equal(got, tc.want) {
			t.Errorf("PhoneForms(%q) = %q, want %q", tc.typed, got, tc.want)
		}
	}
}
