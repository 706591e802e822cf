// Package plot draws a simulation's timelines (evolve sim --plot): per
// policy and per minute, the prefill engines serving, the requests queued
// and the mean end-to-end latency, so that an operator can see a planner
// follow a workload shift. It draws with gonum/plot, as SVG, PNG or PDF.
package plot

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/evolvellm/evolve/sim"
)

// Formats are the file formats Write draws, by file extension.
var Formats = []string{"svg", "png", "pdf"}

// FormatOf is the format of a plot file by its extension (svg, png or
// pdf), or an error that names them.
func FormatOf(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	for _, f := range Formats {
		if ext == f {
			return f, nil
		}
	}
	return "", fmt.Errorf("%q: a plot is drawn as .svg, .png or .pdf, by the file's extension", path)
}

// The plot's size: three panels stacked, wide enough for a few hours of
// minutes; the legend's column grows with its longest name.
const (
	width  = 24 * vg.Centimeter
	height = 25 * vg.Centimeter
	titleH = 1.6 * vg.Centimeter
)

// palette and dashes tell policies apart by colour and by dash pattern, so
// that a print in grey still does.
var (
	palette = []color.RGBA{
		{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0x94, 0x67, 0xbd, 0xff},
		{0xff, 0x7f, 0x0e, 0xff}, {0x8c, 0x56, 0x4b, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
	}
	dashes = [][]vg.Length{nil, {8, 4}, {2, 3}, {12, 3, 2, 3}, {4, 4}, {1, 2}, {10, 2}}
)

// panel is one of the stacked plots: a title, a y label, the value of a
// policy's minute (ok false: no point that minute), what else its axis
// must reach (nil: the values alone), and whether its last minutes are
// those of requests not all finished by the run's end.
type panel struct {
	title, y string
	value    func(sim.Window) (v float64, ok bool)
	scale    func(sim.Window) float64
	censored bool
}

var panels = []panel{
	{"Prefill engines serving", "engines", func(w sim.Window) (float64, bool) { return float64(w.Prefill), true },
		func(w sim.Window) float64 { return float64(w.Prefill + w.Decode) }, false},
	{"Requests queued on engines", "requests", func(w sim.Window) (float64, bool) { return float64(w.Waiting), true }, nil, false},
	{"Mean end-to-end latency of the requests arriving each minute", "seconds", func(w sim.Window) (float64, bool) {
		return w.MeanE2E(), w.Requests > 0
	}, nil, true},
}

// Write draws the results' timelines in format (svg, png or pdf) to w,
// with a line where the warm-up ends and scoring starts (none when warmup
// is 0), titled with what the results tell of the run (WriteScenario
// titles it with the run's parameters).
func Write(w io.Writer, format string, results []sim.Result, warmup time.Duration) error {
	return draws(w, format, results, warmup, resultsTitle(results, warmup))
}

// WriteScenario is Write, titled with the scenario's parameters: the
// profile, engines, workload and agents, warm-up and scored time, seed.
func WriteScenario(w io.Writer, format string, results []sim.Result, sc sim.Scenario) error {
	return draws(w, format, results, sc.Warmup, scenarioTitle(sc))
}

// scenarioTitle is a run's parameters, as the figure's title says them.
func scenarioTitle(sc sim.Scenario) string {
	profile := "?"
	if sc.Profile != nil {
		profile = sc.Profile.Name
	}
	load := fmt.Sprintf("%s, %d agents", sc.Workload, sc.Agents)
	if sc.Trace != nil {
		load = fmt.Sprintf("a trace of %d requests", len(sc.Trace))
		if sc.TimeScale > 0 && sc.TimeScale != 1 {
			load += fmt.Sprintf(" at %gx", sc.TimeScale)
		}
	}
	return fmt.Sprintf("%d engines of %s, %s; %s warm-up + %s scored, seed %d", sc.Engines, profile, load, dur(sc.Warmup), dur(sc.Duration), sc.Seed)
}

// resultsTitle is what the results themselves say of their run.
func resultsTitle(results []sim.Result, warmup time.Duration) string {
	engines, minutes := 0, 0
	for _, r := range results {
		minutes = max(minutes, len(r.Timeline))
		for _, win := range r.Timeline {
			engines = max(engines, win.Prefill+win.Decode)
		}
	}
	t := fmt.Sprintf("%s on %d engines, %s modelled", counted(len(results), "policy"), engines, dur(time.Duration(minutes)*time.Minute))
	if warmup > 0 {
		t += fmt.Sprintf(" (%s warm-up)", dur(warmup))
	}
	return t
}

func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return fmt.Sprintf("%d %sies", n, strings.TrimSuffix(noun, "y"))
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// dur writes a duration as 1h30m, 2h, 20m or 45s.
func dur(d time.Duration) string {
	t := int(d.Round(time.Second).Seconds())
	h, m, s := t/3600, t/60%60, t%60
	var b strings.Builder
	if h > 0 {
		fmt.Fprintf(&b, "%dh", h)
	}
	if m > 0 {
		fmt.Fprintf(&b, "%dm", m)
	}
	if s > 0 || t == 0 {
		fmt.Fprintf(&b, "%ds", s)
	}
	return b.String()
}

func draws(w io.Writer, format string, results []sim.Result, warmup time.Duration, title string) error {
	minutes := 0
	for _, r := range results {
		minutes = max(minutes, len(r.Timeline))
	}
	if minutes < 2 {
		return fmt.Errorf("plot: need at least two minutes of timeline")
	}
	legend := gplot.NewLegend()
	legend.Top, legend.Left = true, true
	same := sameAs(results)
	for i, r := range results {
		name := r.Policy
		if j, ok := same[i]; ok {
			// Drawn exactly under the other: say so, or it is not seen.
			name += " (same lines as " + results[j].Policy + ")"
		}
		legend.Add(name, lineStyle(i))
	}
	// The legend's column is as wide as its longest name.
	legendW := legend.Rectangle(draw.Canvas{}).Size().X + vg.Centimeter/2
	figW := max(width, 17*vg.Centimeter+legendW)
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(figW, height)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(figW, height), vgimg.UseDPI(120), vgimg.UseBackgroundColor(color.White))}
	case "pdf":
		c = vgpdf.New(figW, height)
	default:
		return fmt.Errorf("plot: format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	end := runEnd(results)
	plots := make([][]*gplot.Plot, len(panels))
	for i, pn := range panels {
		p, err := drawPanel(pn, results, warmup, end, i == len(panels)-1)
		if err != nil {
			return err
		}
		plots[i] = []*gplot.Plot{p}
	}
	dc := draw.New(c)
	sty := legend.TextStyle
	sty.Font.Size = vg.Points(13)
	sty.XAlign = draw.XCenter
	dc.FillText(sty, vg.Point{X: figW / 2, Y: height - titleH/2}, title)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Centimeter / 4, PadBottom: vg.Centimeter / 4,
		PadY: vg.Centimeter / 2, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 4}
	canvases := gplot.Align(plots, tiles, draw.Crop(dc, 0, -legendW, 0, -titleH))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	legend.Draw(draw.Crop(dc, figW-legendW, 0, 0, -titleH-vg.Centimeter/2))
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// sameAs maps each policy whose timeline draws the same in every panel as
// an earlier one's to that one.
func sameAs(results []sim.Result) map[int]int {
	out := map[int]int{}
	for i := range results {
		for j := 0; j < i; j++ {
			if _, dup := out[j]; dup {
				continue
			}
			if sameTimeline(results[i].Timeline, results[j].Timeline) {
				out[i] = j
				break
			}
		}
	}
	return out
}

func sameTimeline(a, b []sim.Window) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		for _, pn := range panels {
			va, oka := pn.value(a[k])
			vb, okb := pn.value(b[k])
			if oka != okb || oka && va != vb {
				return false
			}
		}
	}
	return true
}

// runEnd is where the runs end, in minutes (their modelled time).
func runEnd(results []sim.Result) float64 {
	end := 0.0
	for _, r := range results {
		end = max(end, r.VirtualSec/60, float64(len(r.Timeline)))
	}
	return end
}

// censoredFrom is the minute after which a policy's requests may not all
// have finished by the run's end: requests as long as its P99 arriving
// later could not; +Inf when every request finished.
func censoredFrom(r sim.Result, end float64) float64 {
	if r.RequestsUnfinished == 0 || r.P99E2E <= 0 {
		return math.Inf(1)
	}
	return end - r.P99E2E/60
}

// lineStyle is policy i's line: a colour and a dash pattern.
func lineStyle(i int) *plotter.Line {
	l := &plotter.Line{}
	l.Color = palette[i%len(palette)]
	l.Dashes = dashes[i%len(dashes)]
	l.Width = vg.Points(1.5)
	return l
}

// drawPanel is one panel with a line per policy, from 0, and a line where
// the warm-up ends; the last panel labels the minute axis. Lines that
// coincide are drawn a little apart (the title says so), and the last
// minutes of a panel of latencies, whose long requests had not finished
// when the run ended, are shaded and named.
func drawPanel(pn panel, results []sim.Result, warmup time.Duration, end float64, last bool) (*gplot.Plot, error) {
	p := gplot.New()
	p.Y.Label.Text = pn.y
	p.X.Tick.Marker = gplot.TickerFunc(niceTicks)
	p.Y.Tick.Marker = gplot.TickerFunc(niceTicks)
	if last {
		p.X.Label.Text = "minute"
	}
	p.Add(plotter.NewGrid())
	ymax, top := 1.0, 0.0
	series := make([]plotter.XYs, len(results))
	for i, r := range results {
		for _, win := range r.Timeline {
			if v, ok := pn.value(win); ok {
				series[i] = append(series[i], plotter.XY{X: win.Start.Minutes(), Y: v})
				ymax = math.Max(ymax, v)
			}
			if pn.scale != nil {
				top = math.Max(top, pn.scale(win))
			}
		}
	}
	ymax = math.Max(ymax, top)
	title := pn.title
	var notes []string
	if top > 0 {
		title += fmt.Sprintf(" (the axis reaches all %.0f)", top)
	}
	// A line drawn exactly over another hides it: the later ones of a
	// group of equal lines go a little higher, a step each.
	apart := false
	for i := range series {
		shift := 0
		for j := 0; j < i; j++ {
			if slices.Equal(series[i], series[j]) {
				shift++
			}
		}
		if shift > 0 && len(series[i]) > 0 {
			apart = true
			moved := make(plotter.XYs, len(series[i]))
			for k, pt := range series[i] {
				moved[k] = plotter.XY{X: pt.X, Y: pt.Y + float64(shift)*ymax*0.012}
			}
			series[i] = moved
		}
	}
	if apart {
		notes = append(notes, "equal lines drawn a little apart")
	}
	if pn.censored {
		from := math.Inf(1)
		for _, r := range results {
			from = math.Min(from, censoredFrom(r, end))
		}
		if from < end {
			from = math.Max(from, 0)
			band, err := plotter.NewPolygon(plotter.XYs{{X: from, Y: 0}, {X: end, Y: 0}, {X: end, Y: ymax * 1.05}, {X: from, Y: ymax * 1.05}})
			if err != nil {
				return nil, err
			}
			band.Color = color.Gray{Y: 0xe6}
			band.LineStyle.Width = 0
			p.Add(band)
			notes = append(notes, fmt.Sprintf("shaded from minute %.0f: long requests arriving then had not finished when the run ended, and the mean leaves them out", from))
		}
	}
	if len(notes) > 0 {
		title += "\n" + wrapTitle(strings.Join(notes, "; "), 90)
	}
	p.Title.Text = title
	for i, r := range results {
		if len(series[i]) == 0 {
			continue
		}
		l, err := plotter.NewLine(series[i])
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", r.Policy, err)
		}
		l.LineStyle = lineStyle(i).LineStyle
		p.Add(l)
	}
	p.Y.Min, p.Y.Max = 0, ymax*1.05
	p.X.Min, p.X.Max = 0, end
	if m := warmup.Minutes(); m > 0 && m < p.X.Max {
		mark, err := plotter.NewLine(plotter.XYs{{X: m, Y: 0}, {X: m, Y: p.Y.Max}})
		if err != nil {
			return nil, err
		}
		mark.Color = color.Gray{Y: 0x80}
		mark.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		p.Add(mark)
		if last {
			p.X.Label.Text = fmt.Sprintf("minute (scored from minute %s, after the warm-up)", strconv.FormatFloat(m, 'f', -1, 64))
		}
	}
	return p, nil
}

// wrapTitle breaks a title onto lines of at most n characters.
func wrapTitle(s string, n int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > n {
			lines = append(lines, line)
			line = w
			continue
		}
		line = strings.TrimSpace(line + " " + w)
	}
	return strings.Join(append(lines, line), "\n")
}

// niceTicks marks an axis at about five round values (1, 2 or 5 times a
// power of ten), labelled as plain numbers: whole engines stay whole.
func niceTicks(lo, hi float64) []gplot.Tick {
	if hi <= lo {
		return []gplot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', -1, 64)}}
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, f := range []float64{1, 2, 5, 10} {
		if f*mag >= raw {
			step = f * mag
			break
		}
	}
	step = math.Max(step, 1)
	var ticks []gplot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		ticks = append(ticks, gplot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return ticks
}
