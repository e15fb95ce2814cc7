package grow

import (
	"fmt"
	"math"
	"strings"
)

// SVG draws a growth run: each figure over the buyers, as a multiple of
// its value at the first size, on log-log axes, beside the lines a flat
// and a linear cost would follow. The step that grew the table only is
// left out (its slope is in the table), and so are the figures that follow
// the table's rows (the drain's).
func SVG(res Result) []byte {
	const w, h, left, right, top, bottom = 760, 460, 70, 230, 30, 50
	var steps []Step
	for _, s := range res.Steps {
		if len(steps) == 0 || s.Buyers != steps[len(steps)-1].Buyers {
			steps = append(steps, s)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	if len(steps) < 2 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	x0, x1 := math.Log10(float64(steps[0].Buyers)), math.Log10(float64(steps[len(steps)-1].Buyers))
	ymax := x1 - x0 // a linear cost's multiple, in decades
	for _, f := range Figures {
		if f.OverTable {
			continue
		}
		for _, s := range steps {
			if base := f.Of(steps[0]); base > 0 && f.Of(s) > 0 {
				ymax = max(ymax, math.Log10(f.Of(s)/base))
			}
		}
	}
	ymin := -0.5
	ymax = math.Ceil(ymax*2)/2 + 0.25
	px := func(x float64) float64 { return left + (x-x0)/(x1-x0)*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - (y-ymin)/(ymax-ymin)*(h-top-bottom) }
	axes(&b, steps, px, py, ymin, ymax)
	line := func(y0, y1 float64, style, label string) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="%s"/>`+"\n", px(x0), py(y0), px(x1), py(y1), style)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#666">%s</text>`+"\n", px(x1)+6, py(y1)+4, label)
	}
	line(0, 0, "4 4", "flat")
	line(0, x1-x0, "2 6", "linear")
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}
	for i, f := range Figures {
		base := f.Of(steps[0])
		if base <= 0 || f.OverTable {
			continue
		}
		var pts []string
		for _, s := range steps {
			if v := f.Of(s); v > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(math.Log10(float64(s.Buyers))), py(math.Log10(v/base))))
			}
		}
		c := colors[i%len(colors)]
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), c)
		ly := top + 20 + 18*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`, w-right+60, ly, w-right+80, ly, c)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+86, ly+4, f.Name)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// axes draws the frame, a tick per size and per half decade of multiple.
func axes(b *strings.Builder, steps []Step, px, py func(float64) float64, ymin, ymax float64) {
	xa, xb := px(math.Log10(float64(steps[0].Buyers))), px(math.Log10(float64(steps[len(steps)-1].Buyers)))
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", xa, py(ymin), xb, py(ymin))
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", xa, py(ymin), xa, py(ymax))
	for _, s := range steps {
		x := px(math.Log10(float64(s.Buyers)))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`, x, py(ymin), x, py(ymin)+5)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, py(ymin)+20, count(s.Buyers))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">buyers of the voucher (orders in MySQL, buyers in Redis)</text>`+"\n", (xa+xb)/2, py(ymin)+40)
	for y := math.Ceil(ymin*2) / 2; y <= ymax; y += 0.5 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, xa, py(y), xb, py(y))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%sx</text>`+"\n", xa-6, py(y)+4, trim(math.Pow(10, y)))
	}
	fmt.Fprintf(b, `<text x="14" y="%.1f" transform="rotate(-90 14 %.1f)" text-anchor="middle">cost as a multiple of the first size's</text>`+"\n", (py(ymin)+py(ymax))/2, (py(ymin)+py(ymax))/2)
}

// count writes 10000 as 10^4 where it is a power of ten.
func count(n int) string {
	if e := math.Log10(float64(n)); e == math.Trunc(e) {
		return fmt.Sprintf("10^%d", int(e))
	}
	return fmt.Sprint(n)
}

// trim writes a multiple with two significant digits.
func trim(v float64) string {
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2g", v), "0"), ".")
}
