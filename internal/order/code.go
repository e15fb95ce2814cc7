package order

import (
	"crypto/rand"
	"strings"

	"gorm.io/gorm"

	"seckill/internal/db"
)

// A voucher code is what a paid order's buyer shows at the shop and the
// cashier types to redeem it: CodeLen characters drawn with crypto/rand
// from codeAlphabet, which leaves out the look-alikes 0/O and 1/I. 32
// letters and 10 of them: 2^50 codes, so one cannot be guessed, and the
// unique key on orders.code (sql/*/0006_voucher_codes.sql) makes each
// name one order, across every voucher.
//
// Every order gets its code in the transaction that makes it paid, in one
// place: the writer writing an order with nothing to pay (Writer.newOrder,
// Writer.create), and the lifecycle's pay move (transition.move), which a
// payment's transaction makes through Lifecycle.DoTx. Both draw through
// withCode. A repeated pay changes nothing, so the code stays the same.
const (
	CodeLen      = 10
	codeAlphabet = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"
)

// codeTries is how many codes withCode draws before it gives up: a second
// draw meeting a taken code is a one in 2^50 event already.
const codeTries = 3

// newCode draws a voucher code. 256 is a multiple of the alphabet's 32
// letters, so every letter is as likely.
func newCode() string {
	var b [CodeLen]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand's contract)
	for i := range b {
		b[i] = codeAlphabet[b[i]%byte(len(codeAlphabet))]
	}
	return string(b[:])
}

// withCode runs write with a new code, and again with another while the
// unique key refuses the code because another order holds it (taken says
// so; a duplicate of another key is write's own answer). A refused
// statement is undone alone, on MySQL and SQLite alike: the transaction
// goes on.
func withCode(tx *gorm.DB, write func(code string) error) error {
	var err error
	for range codeTries {
		code := newCode()
		err = write(code)
		if !db.IsDuplicate(err) {
			return err
		}
		taken, qerr := codeTaken(tx, code)
		if qerr != nil {
			return qerr
		}
		if !taken {
			return err
		}
	}
	return err
}

// codeTaken reports whether an order holds the code. On MySQL the read
// locks: a plain read sees the transaction's snapshot, which misses a code
// another transaction committed since, the very one the unique key just
// refused; a locking read sees the latest committed row.
func codeTaken(tx *gorm.DB, code string) (bool, error) {
	q := "SELECT COUNT(*) FROM orders WHERE code = ?"
	if tx.Dialector.Name() == "mysql" {
		q += " FOR UPDATE"
	}
	var n int64
	err := tx.Raw(q, code).Scan(&n).Error
	return n > 0, err
}

// NormalizeCode reads a code as a person types or a scanner reads it:
// case, spaces and dashes do not matter. It reports false for anything
// that cannot be a code.
func NormalizeCode(s string) (string, bool) {
	s = strings.ToUpper(strings.NewReplacer(" ", "", "-", "", "\t", "").Replace(s))
	if len(s) != CodeLen {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(codeAlphabet, s[i]) < 0 {
			return "", false
		}
	}
	return s, true
}
