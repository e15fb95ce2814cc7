package grow

import (
	"fmt"
	"math"
	"strings"
)

// SVG draws a growth run: each figure as a multiple of its value at the
// first step, on log-log axes, beside the lines a flat and a linear cost
// would follow. The figures over the buyers leave out the step that grew
// the table only (its slope is in the table); the drain's, dashed, follow
// the orders table's rows over every step.
func SVG(res Result) []byte {
	const w, h, left, right, top, bottom = 800, 460, 70, 250, 30, 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	lines := curves(res.Steps)
	x0, x1, ymax := bounds(lines)
	if len(lines) == 0 || x1 <= x0 {
		b.WriteString("</svg>\n")
		return []byte(b.String())
	}
	ymin := -0.5
	ymax = math.Ceil(ymax*2)/2 + 0.25
	px := func(x float64) float64 { return left + (x-x0)/(x1-x0)*(w-left-right) }
	py := func(y float64) float64 { return h - bottom - (y-ymin)/(ymax-ymin)*(h-top-bottom) }
	axes(&b, x0, x1, px, py, ymin, ymax)
	guide := func(y0, y1 float64, style, label string) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="%s"/>`+"\n", px(x0), py(y0), px(x1), py(y1), style)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#666">%s</text>`+"\n", px(x1)+6, py(y1)+4, label)
	}
	guide(0, 0, "4 4", "flat")
	guide(0, x1-x0, "2 6", "linear")
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}
	for i, l := range lines {
		pts := make([]string, len(l.pts))
		for j, p := range l.pts {
			pts[j] = fmt.Sprintf("%.1f,%.1f", px(p[0]), py(p[1]))
		}
		c, dash := colors[i%len(colors)], ""
		if l.overTable {
			dash = ` stroke-dasharray="6 3"`
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), c, dash)
		ly := top + 20 + 18*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`, w-right+60, ly, w-right+80, ly, c, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+86, ly+4, l.name)
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// curve is one figure's points: log10 of the size (buyers, or the table's
// rows) and log10 of the multiple of its first value.
type curve struct {
	name      string
	overTable bool
	pts       [][2]float64
}

// curves are the figures measured at two steps or more.
func curves(steps []Step) []curve {
	var byBuyers []Step // one step a size of the voucher
	for _, s := range steps {
		if len(byBuyers) == 0 || s.Buyers != byBuyers[len(byBuyers)-1].Buyers {
			byBuyers = append(byBuyers, s)
		}
	}
	var out []curve
	for _, f := range Figures {
		c, ss, x := curve{name: f.Name, overTable: f.OverTable}, byBuyers, func(s Step) float64 { return float64(s.Buyers) }
		if f.OverTable {
			ss, x = steps, func(s Step) float64 { return float64(s.Drain.TableRows) }
		}
		for _, s := range ss {
			if base, v := f.Of(ss[0]), f.Of(s); base > 0 && v > 0 {
				c.pts = append(c.pts, [2]float64{math.Log10(x(s)), math.Log10(v / base)})
			}
		}
		if len(c.pts) > 1 {
			out = append(out, c)
		}
	}
	return out
}

// bounds are the sizes the curves span and their largest multiple (at
// least a linear cost's over that span), all in decades.
func bounds(lines []curve) (x0, x1, ymax float64) {
	x0, x1 = math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, p := range l.pts {
			x0, x1, ymax = min(x0, p[0]), max(x1, p[0]), max(ymax, p[1])
		}
	}
	return x0, x1, max(ymax, x1-x0)
}

// axes draws the frame, a tick per decade of size (or at both ends when
// the span holds none) and per half decade of multiple.
func axes(b *strings.Builder, x0, x1 float64, px, py func(float64) float64, ymin, ymax float64) {
	xa, xb := px(x0), px(x1)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", xa, py(ymin), xb, py(ymin))
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", xa, py(ymin), xa, py(ymax))
	ticks := []float64{x0, x1}
	if math.Ceil(x0) <= math.Floor(x1) {
		ticks = nil
		for e := math.Ceil(x0); e <= x1; e++ {
			ticks = append(ticks, e)
		}
	}
	for _, t := range ticks {
		x := px(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`, x, py(ymin), x, py(ymin)+5)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, py(ymin)+20, count(int(math.Round(math.Pow(10, t)))))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">buyers of the voucher; dashed: orders in the table when the drain began</text>`+"\n", (xa+xb)/2, py(ymin)+40)
	for y := math.Ceil(ymin*2) / 2; y <= ymax; y += 0.5 {
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`, xa, py(y), xb, py(y))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%sx</text>`+"\n", xa-6, py(y)+4, trim(math.Pow(10, y)))
	}
	fmt.Fprintf(b, `<text x="14" y="%.1f" transform="rotate(-90 14 %.1f)" text-anchor="middle">cost as a multiple of the first step's</text>`+"\n", (py(ymin)+py(ymax))/2, (py(ymin)+py(ymax))/2)
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
