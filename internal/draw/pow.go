package draw

import (
	"crypto/sha256"
	"math/bits"
	"strconv"
)

// maxNonce bounds a nonce's length, so a verify is one SHA-256 block or
// two whatever a client sends.
const maxNonce = 64

// PowOK tells whether nonce is a proof of work of k bits for user in the
// draw whose challenge is challenge (voucher.DrawChallenge): the SHA-256 of
// challenge + ":" + user id (decimal) + ":" + nonce starts with k zero
// bits. k = 0 takes anything, no nonce too.
func PowOK(challenge string, user int64, nonce string, k int) bool {
	if k <= 0 {
		return true
	}
	if nonce == "" || len(nonce) > maxNonce {
		return false
	}
	buf := make([]byte, 0, len(challenge)+2+20+len(nonce))
	buf = append(buf, challenge...)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, user, 10)
	buf = append(buf, ':')
	buf = append(buf, nonce...)
	return leadingZeros(sha256.Sum256(buf)) >= k
}

// leadingZeros counts the zero bits a digest starts with.
func leadingZeros(sum [sha256.Size]byte) int {
	n := 0
	for _, b := range sum {
		if b != 0 {
			return n + bits.LeadingZeros8(b)
		}
		n += 8
	}
	return n
}

// SolvePow finds a nonce PowOK takes (the decimal counter from 0): what
// the page does in JavaScript, for tests and tools.
func SolvePow(challenge string, user int64, k int) string {
	for i := 0; ; i++ {
		if n := strconv.Itoa(i); PowOK(challenge, user, n, k) {
			return n
		}
	}
}
