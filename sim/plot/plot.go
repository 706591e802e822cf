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
// minutes.
const (
	width  = 24 * vg.Centimeter
	height = 24 * vg.Centimeter
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
// policy's minute (ok false: no point that minute), and what else its axis
// must reach (nil: the values alone).
type panel struct {
	title, y string
	value    func(sim.Window) (v float64, ok bool)
	scale    func(sim.Window) float64
}

var panels = []panel{
	{"Prefill engines serving, of all serving", "engines", func(w sim.Window) (float64, bool) { return float64(w.Prefill), true },
		func(w sim.Window) float64 { return float64(w.Prefill + w.Decode) }},
	{"Requests queued on engines", "requests", func(w sim.Window) (float64, bool) { return float64(w.Waiting), true }, nil},
	{"Mean end-to-end latency of the requests arriving each minute", "seconds", func(w sim.Window) (float64, bool) {
		return w.MeanE2E(), w.Requests > 0
	}, nil},
}

// Write draws the results' timelines in format (svg, png or pdf) to w,
// with a line where the warm-up ends and scoring starts (none when warmup
// is 0).
func Write(w io.Writer, format string, results []sim.Result, warmup time.Duration) error {
	minutes := 0
	for _, r := range results {
		minutes = max(minutes, len(r.Timeline))
	}
	if minutes < 2 {
		return fmt.Errorf("plot: need at least two minutes of timeline")
	}
	var c vg.CanvasWriterTo
	switch format {
	case "svg":
		c = vgsvg.New(width, height)
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(120), vgimg.UseBackgroundColor(color.White))}
	case "pdf":
		c = vgpdf.New(width, height)
	default:
		return fmt.Errorf("plot: format %q: want one of %s", format, strings.Join(Formats, ", "))
	}
	legend := gplot.NewLegend()
	legend.Top, legend.Left = true, true
	plots := make([][]*gplot.Plot, len(panels))
	for i, pn := range panels {
		p, err := draws(pn, results, warmup, i == len(panels)-1)
		if err != nil {
			return err
		}
		plots[i] = []*gplot.Plot{p}
	}
	for i, r := range results {
		legend.Add(r.Policy, lineStyle(i))
	}
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Centimeter / 2, PadBottom: vg.Centimeter / 4,
		PadY: vg.Centimeter / 2, PadLeft: vg.Centimeter / 4, PadRight: vg.Centimeter / 4}
	canvases := gplot.Align(plots, tiles, draw.Crop(dc, 0, -legendWidth, 0, 0))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	legend.Draw(draw.Crop(dc, width-legendWidth, 0, 0, -vg.Centimeter))
	if _, err := c.WriteTo(w); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

// legendWidth is the column on the right that names the policies.
const legendWidth = 4 * vg.Centimeter

// lineStyle is policy i's line: a colour and a dash pattern.
func lineStyle(i int) *plotter.Line {
	l := &plotter.Line{}
	l.Color = palette[i%len(palette)]
	l.Dashes = dashes[i%len(dashes)]
	l.Width = vg.Points(1.5)
	return l
}

// draws is one panel with a line per policy, from 0, and a line where the
// warm-up ends; the last panel labels the minute axis.
func draws(pn panel, results []sim.Result, warmup time.Duration, last bool) (*gplot.Plot, error) {
	p := gplot.New()
	p.Title.Text = pn.title
	p.Y.Label.Text = pn.y
	p.X.Tick.Marker = gplot.TickerFunc(niceTicks)
	p.Y.Tick.Marker = gplot.TickerFunc(niceTicks)
	if last {
		p.X.Label.Text = "minute"
	}
	p.Add(plotter.NewGrid())
	ymax := 1.0
	for i, r := range results {
		var pts plotter.XYs
		for _, win := range r.Timeline {
			if v, ok := pn.value(win); ok {
				pts = append(pts, plotter.XY{X: win.Start.Minutes(), Y: v})
				ymax = math.Max(ymax, v)
			}
			if pn.scale != nil {
				ymax = math.Max(ymax, pn.scale(win))
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", r.Policy, err)
		}
		l.LineStyle = lineStyle(i).LineStyle
		p.Add(l)
	}
	p.Y.Min, p.Y.Max = 0, ymax*1.05
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
