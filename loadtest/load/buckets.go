package load

import (
	"fmt"
	"math"
	"strconv"

	"seckill/internal/voucher"
)

// ParseBuckets reads a bucket count as the voucher creation request takes
// it: a positive number, or "auto" (one bucket per master, chosen by the
// service), which it returns as 0. The upper bound is the service's to
// enforce (a 422 at creation).
func ParseBuckets(s string) (int, error) {
	if s == "auto" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("buckets %q: want a positive number or auto", s)
	}
	return n, nil
}

// bucketsField is the "buckets" value of the voucher creation body: nil
// for one bucket (the field is left out, so a service without buckets
// takes the request as before), else the number or "auto".
func bucketsField(s string) any {
	switch n, err := ParseBuckets(s); {
	case err != nil || s == "auto":
		return s
	case n == 1:
		return nil
	default:
		return n
	}
}

// buyerIDs lists the user ids of n buyers from base. With skew 0, or a
// voucher of one bucket (every buyer's home is bucket 0), they are base,
// base+1, ... Otherwise a share skew of them have home bucket 0 of nb
// (voucher.Home) and the rest another home, spread over buckets 1..nb-1
// by the hash: two walks up from base, one taking the ids at home in
// bucket 0, the other the ids that are not, and buyer i is taken from the
// first walk while that walk holds fewer than round(skew*(i+1)) of the
// first i+1 buyers, so every prefix of the list (a run whose purchases
// reach only its first buyers) has the share too. Deterministic: the same
// arguments give the same ids.
func buyerIDs(base int64, n int, skew float64, nb int) []int64 {
	ids := make([]int64, n)
	if skew <= 0 || nb <= 1 {
		for i := range ids {
			ids[i] = base + int64(i)
		}
		return ids
	}
	home0, other := base, base
	taken := 0 // buyers taken from the home-0 walk
	for i := range ids {
		if float64(taken) < math.Round(skew*float64(i+1)) {
			for voucher.Home(home0, nb) != 0 {
				home0++
			}
			ids[i] = home0
			home0++
			taken++
			continue
		}
		for voucher.Home(other, nb) == 0 {
			other++
		}
		ids[i] = other
		other++
	}
	return ids
}
