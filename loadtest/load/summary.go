package load

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Summary is a run's figures; --json writes it as is.
type Summary struct {
	Target      string         `json:"target"`
	VoucherID   int64          `json:"voucher_id"`
	VoucherIDs  []int64        `json:"voucher_ids,omitempty"` // when the run bought several
	Stock       int            `json:"stock,omitempty"`
	Buckets     string         `json:"buckets"`                 // of the vouchers created: a number or auto
	BucketsMade int            `json:"buckets_made,omitempty"`  // what the creation answer names, auto resolved; 0: it names none, or --voucher
	Skew        float64        `json:"skew,omitempty"`          // share of buyers picked at home in bucket 0
	HomeZero    int            `json:"home_0_buyers,omitempty"` // with Skew: buyers at home in bucket 0
	Users       int            `json:"users"`
	Requests    int            `json:"requests"`
	Concurrency int            `json:"concurrency"`
	Rate        float64        `json:"rate,omitempty"`
	Seconds     float64        `json:"seconds"`
	RPS         float64        `json:"requests_per_second"`
	Latency     Latency        `json:"latency_ms"`
	Outcomes    map[string]int `json:"outcomes"`
	Tail        *Tail          `json:"tail,omitempty"` // nil: no purchase accepted
	Check       *Report        `json:"check,omitempty"`
}

// Latency holds percentiles in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func latencyOf(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	at := func(p float64) float64 {
		i := int(p*float64(len(d))+0.5) - 1
		return ms(d[min(max(i, 0), len(d)-1)])
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return Latency{P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: ms(d[len(d)-1]), Mean: ms(sum / time.Duration(len(d)))}
}

// Print writes the summary for a person.
func (s Summary) Print(w io.Writer) {
	mode := "closed loop"
	if s.Rate > 0 {
		mode = fmt.Sprintf("open loop at %.0f/s", s.Rate)
	}
	fmt.Fprintf(w, "\ntarget %s, voucher %d (%s), %d buyers, %d connections, %s\n", s.Target, s.VoucherID, bucketsText(s.Buckets, s.BucketsMade), s.Users, s.Concurrency, mode)
	if s.Skew > 0 {
		fmt.Fprintf(w, "  skew         %.2f: %d of %d buyers at home in bucket 0\n", s.Skew, s.HomeZero, s.Users)
	}
	fmt.Fprintf(w, "  purchases    %d in %.2fs: %.0f/s\n", s.Requests, s.Seconds, s.RPS)
	fmt.Fprintf(w, "  latency ms   p50 %.2f  p90 %.2f  p99 %.2f  max %.2f  mean %.2f\n",
		s.Latency.P50, s.Latency.P90, s.Latency.P99, s.Latency.Max, s.Latency.Mean)
	if s.Tail != nil {
		s.Tail.Print(w)
	}
	fmt.Fprintf(w, "  answers\n")
	for _, k := range slices.Sorted(maps.Keys(s.Outcomes)) {
		fmt.Fprintf(w, "    %-28s %d\n", k, s.Outcomes[k])
	}
	if n := s.Outcomes["429 rate_limited"]; n > 0 {
		fmt.Fprintf(w, "  note: nginx refused %d purchases with 429: it limits purchases per client address, and this\n"+
			"        load comes from one. For a load test start the cluster with\n"+
			"        SECKILL_NGINX_PURCHASE_RATE=1000000r/s SECKILL_NGINX_PURCHASE_BURST=1000000 (nginx counts in milliseconds).\n", n)
	}
	if n := s.Outcomes["429 too_many_requests"]; n > 0 {
		fmt.Fprintf(w, "  note: the instances refused %d purchases with 429: their own per-buyer and per-address limits.\n"+
			"        For a load test start the cluster with SECKILL_RATE_LIMIT=off.\n", n)
	}
	if s.Check != nil {
		s.Check.Print(w)
	}
}

// bucketsText says a voucher's buckets for a person: the count the
// service made when its creation answer named it (made > 0), else the
// count given (--buckets, also with --voucher), unconfirmed.
func bucketsText(asked string, made int) string {
	asked = cmp.Or(asked, "1")
	switch {
	case made == 0:
		return "buckets " + asked + ", not confirmed by the service"
	case asked == "auto":
		return fmt.Sprintf("%d %s, auto", made, plural(made, "bucket", "buckets"))
	}
	return fmt.Sprintf("%d %s", made, plural(made, "bucket", "buckets"))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Print writes the check's outcome for a person.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "  pipeline     orders %d, dead letters %d, stock %d in MySQL and %d in Redis, pending %d, drained in %.2fs\n",
		r.Orders, r.DeadLetters, r.DBStock, r.RedisStock, r.Pending, r.DrainSeconds)
	if r.OK {
		fmt.Fprintf(w, "  check        OK: every invariant holds\n")
		return
	}
	fmt.Fprintf(w, "  check        FAILED:\n    %s\n", strings.Join(r.Violations, "\n    "))
}
