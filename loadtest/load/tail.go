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

// Print writes the tail for a person, in words: JSON readers have the
// field names and the README.
func (t Tail) Print(w io.Writer) {
	if t.SoldOuts == 0 {
		fmt.Fprintf(w, "  tail         last sale at %.3fs after the firing began; no sold_out answer\n", t.LastSale)
	} else {
		fmt.Fprintf(w, "  tail         last sale at %.3fs after the firing began; first of %d sold_out answers at %.3fs\n",
			t.LastSale, t.SoldOuts, t.FirstSoldOut)
		fmt.Fprintf(w, "               %s\n", t.refusedText())
	}
	fmt.Fprintf(w, "               last 1%% of units sold (%d purchases): latency ms p50 %.2f  p99 %.2f  max %.2f\n",
		t.LastUnits, t.Latency.P50, t.Latency.P99, t.Latency.Max)
}

// refusedText says what SoldOutToLastSale measured: the time from the
// first sold_out answer to the last sale.
func (t Tail) refusedText() string {
	if t.SoldOutToLastSale > 0 {
		return fmt.Sprintf("time from the first sold_out answer to the last sale %.1f ms: buyers were refused while units still sold", t.SoldOutToLastSale)
	}
	// max: never "-0.0".
	return fmt.Sprintf("the first sold_out answer came %.1f ms after the last sale: no buyer was refused while units still sold", max(-t.SoldOutToLastSale, 0))
}
