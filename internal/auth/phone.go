package auth

import "strings"

// HomeCountry is the country calling code of a phone number typed without
// one. The shop sells to buyers in China (its pages price in yuan and ask
// for +86 numbers), so a cashier who types "138 0013 8000" means
// +8613800138000.
const HomeCountry = "86"

// PhoneForms returns the E.164 numbers (the form users are stored in, see
// ValidPhone) that a phone number as a person types it can be: none when s
// is not a phone number, at most two. Spaces, dashes, dots, slashes and
// brackets do not matter, nor full-width characters (a Chinese keyboard's
// "１３８"). country is the calling code of a number typed without one.
//
//	"+86 138 0013 8000"  -> +8613800138000 (international)
//	"0086 138 0013 8000" -> +8613800138000 (00 dials out, as a +)
//	"138-0013-8000"      -> +8613800138000 (national), +13800138000 (the +
//	                        left out of an international one)
//	"010 8888 6666"      -> +861088886666 (national, its trunk 0 dropped)
func PhoneForms(s, country string) []string {
	digits, plus, ok := phoneDigits(s)
	if !ok {
		return nil
	}
	var candidates []string
	switch {
	case plus:
		candidates = []string{"+" + digits}
	case strings.HasPrefix(digits, "00"):
		candidates = []string{"+" + digits[2:]}
	default:
		candidates = []string{"+" + country + strings.TrimPrefix(digits, "0"), "+" + digits}
	}
	var out []string
	for _, c := range candidates {
		if ValidPhone(c) && (len(out) == 0 || out[0] != c) {
			out = append(out, c)
		}
	}
	return out
}

// phoneDigits reads the digits of a typed number, and whether it began
// with a +; ok is false for anything but digits, separators and one
// leading +.
func phoneDigits(s string) (digits string, plus bool, ok bool) {
	var b strings.Builder
	for i, r := range strings.TrimSpace(s) {
		if r >= 0xFF01 && r <= 0xFF5E { // full-width ASCII: "１３８", "＋", "（"
			r -= 0xFEE0
		}
		switch {
		case r >= '0' && r <= '9':
			b.WriteRune(r)
		case r == '+' && i == 0:
			plus = true
		case strings.ContainsRune(" -./()\u00a0\u3000\t", r):
		default:
			return "", false, false
		}
	}
	return b.String(), plus, b.Len() > 0
}
