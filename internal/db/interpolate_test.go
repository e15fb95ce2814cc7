package db

import "testing"

// TestInterpolateSafe: the driver writes arguments into statements only
// with charsets whose escaping holds, and an operator's own
// interpolateParams stands.
func TestInterpolateSafe(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]bool{
		"u:p@tcp(127.0.0.1:3306)/seckill":                                         true,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=utf8mb4&parseTime=true":          true,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=utf8mb4,utf8":                    true,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=latin1":                          true,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=gbk":                             false,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=utf8mb4,sjis":                    false,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=BIG5":                            false,
		"u:p@tcp(127.0.0.1:3306)/seckill?interpolateParams=false":                 false,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=utf8mb4&interpolateParams=false": false,
		"u:p@tcp(127.0.0.1:3306)/seckill?charset=%zz":                             false,
	} {
		if got := interpolateSafe(dsn); got != want {
			t.Errorf("interpolateSafe(%q) = %v, want %v", dsn, got, want)
		}
	}
}
