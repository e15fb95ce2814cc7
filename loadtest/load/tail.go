package load

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"
)

// answer is one accepted or sold_out answer of the measured purchases, for
// the tail of the sale.
type answer struct {
	at      time.Duration // when it came, since the firing began
	latency time.Duration
	soldOut bool // else accepted (202)
}

// Tail is how the end of a sale went: whether buyers were told sold_out
// while units were still sold (with stock in buckets, units left in one
// bucket while another's buyers are refused), and how long the buyers of
// the last units waited (with buckets, the last units are the ones moved
// between buckets).
type Tail struct {
	SoldOuts int `json:"sold_out_answers"`
	// FirstSoldOut and LastSale are seconds since the firing began; 0
	// FirstSoldOut with SoldOuts 0 means none came.
	FirstSoldOut float64 `json:"first_sold_out_s"`
	LastSale     float64 `json:"last_sale_s"`
	// SoldOutToLastSale is LastSale minus FirstSoldOut in milliseconds:
	// how long buyers were refused while units still sold. Negative or 0
	// when no sold_out came before the last sale (0 when none came).
	SoldOutToLastSale float64 `json:"sold_out_to_last_sale_ms"`
	// LastUnits is how many purchases won the last 1% of the units sold
	// (accepted answers in the order they came; at least 1), Latency their
	// latency.
	LastUnits int     `json:"last_1pct_purchases"`
	Latency   Latency `json:"last_1pct_latency_ms"`
}

// tailOf reads the tail from the measured answers; nil when none was
// accepted. It sorts answers.
func tailOf(answers []answer) *Tail {
	slices.SortStableFunc(answers, func(a, b answer) int { return cmp.Compare(a.at, b.at) })
	var t Tail
	var sales []time.Duration // latencies of the accepted answers, in the order they came
	var firstSoldOut, lastSale time.Duration
	for _, a := range answers {
		if a.soldOut {
			if t.SoldOuts == 0 {
				firstSoldOut = a.at
			}
			t.SoldOuts++
			continue
		}
		sales = append(sales, a.latency)
		lastSale = a.at
	}
	if len(sales) == 0 {
		return nil
	}
	t.LastSale = lastSale.Seconds()
	if t.SoldOuts > 0 {
		t.FirstSoldOut = firstSoldOut.Seconds()
		t.SoldOutToLastSale = ms(lastSale - firstSoldOut)
	}
	t.LastUnits = max(1, (len(sales)+99)/100)
	t.Latency = latencyOf(slices.Clone(sales[len(sales)-t.LastUnits:]))
	return &t
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Print writes the tail for a person.
func (t Tail) Print(w io.Writer) {
	soldOut := "no sold_out answer"
	if t.SoldOuts > 0 {
		soldOut = fmt.Sprintf("first of %d sold_out at %.3fs", t.SoldOuts, t.FirstSoldOut)
	}
	fmt.Fprintf(w, "  tail         %s, last sale at %.3fs: sold_out_to_last_sale %.1f ms\n", soldOut, t.LastSale, t.SoldOutToLastSale)
	fmt.Fprintf(w, "               last 1%% of units sold (%d purchases): latency ms p50 %.2f  p99 %.2f  max %.2f\n",
		t.LastUnits, t.Latency.P50, t.Latency.P99, t.Latency.Max)
}
