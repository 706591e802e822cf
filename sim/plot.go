package sim

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/evolvellm/evolve/workload"
)

// WritePlot draws the results' timelines as an SVG: the prefill engines of
// each policy minute by minute (top), and the mean end-to-end latency of
// the requests arriving in each minute (bottom), so that an operator can see
// a planner follow a workload shift. Lines differ by dash pattern as well
// as colour.
func WritePlot(w io.Writer, results []Result) error {
	const (
		width, height = 960, 560
		left, right   = 70, 180
		panelH        = 200
		top1, top2    = 40, 310
	)
	minutes := 0
	maxP, maxE := 1, 0.0
	for _, r := range results {
		minutes = max(minutes, len(r.Timeline))
		for _, win := range r.Timeline {
			maxP = max(maxP, win.Prefill+win.Decode)
			maxE = math.Max(maxE, meanOf(win.e2e))
		}
	}
	if minutes < 2 {
		return fmt.Errorf("plot: need at least two minutes of timeline")
	}
	if maxE == 0 {
		maxE = 1
	}
	x := func(m float64) float64 { return left + m/float64(minutes-1)*float64(width-left-right) }
	colours := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"}
	dashes := []string{"", "8,4", "2,3", "12,3,2,3", "4,4", "1,2", "10,2"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	panel := func(top int, title, yLabel string, ymax float64) {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="14">%s</text>`+"\n", left, top-12, html.EscapeString(title))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, top, width-left-right, panelH)
		for i := 0; i <= 4; i++ {
			y := float64(top) + float64(panelH)*(1-float64(i)/4)
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.3g</text>`+"\n", left-6, y+4, ymax*float64(i)/4)
		}
		fmt.Fprintf(&b, `<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`+"\n", top+panelH/2, top+panelH/2, html.EscapeString(yLabel))
		for m := 0; m < minutes; m += max(1, minutes/10) {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", x(float64(m)), top+panelH+16, m)
		}
	}
	panel(top1, "prefill engines serving, per minute", "prefill engines", float64(maxP))
	panel(top2, "mean end-to-end latency of requests arriving in each minute", "seconds", maxE)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">minute</text>`+"\n", left+(width-left-right)/2, top2+panelH+34)
	for i, r := range results {
		c, d := colours[i%len(colours)], dashes[i%len(dashes)]
		var p1, p2 []string
		for m, win := range r.Timeline {
			y1 := float64(top1) + float64(panelH)*(1-float64(win.Prefill)/float64(maxP))
			p1 = append(p1, fmt.Sprintf("%.1f,%.1f", x(float64(m)), y1))
			if len(win.e2e) > 0 {
				y2 := float64(top2) + float64(panelH)*(1-meanOf(win.e2e)/maxE)
				p2 = append(p2, fmt.Sprintf("%.1f,%.1f", x(float64(m)), y2))
			}
		}
		for _, pts := range [][]string{p1, p2} {
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s" points="%s"/>`+"\n", c, d, strings.Join(pts, " "))
			}
		}
		ly := top1 + 14 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", width-right+12, ly, width-right+42, ly, c, d)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+48, ly+4, html.EscapeString(r.Policy))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func meanOf(xs []float64) float64 {
	return workload.Summarize(append([]float64(nil), xs...)).Mean
}
