package plot

import (
	"bytes"
	"image/png"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/evolvellm/evolve/engine/stepmodel"
	"github.com/evolvellm/evolve/sim"
)

func results(t *testing.T) []sim.Result {
	t.Helper()
	p, err := stepmodel.BuiltinProfile("gb300-kimi-k2")
	if err != nil {
		t.Fatal(err)
	}
	sc := sim.Scenario{Profile: p, Engines: 3, Workload: "math", Agents: 6, Warmup: time.Minute, Duration: 3 * time.Minute, Seed: 7}
	res, err := sim.Compare(sc, []string{"static:1:2", "dynamo"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Each format draws every policy's line in the three panels, with a legend
// that names the policies.
func TestWriteDrawsEveryPolicyInEachFormat(t *testing.T) {
	res := results(t)
	var svg bytes.Buffer
	if err := Write(&svg, "svg", res, time.Minute); err != nil {
		t.Fatal(err)
	}
	s := svg.String()
	for _, want := range []string{"<svg", "static:1:2", "dynamo", "Prefill engines serving", "Requests queued", "end-to-end latency", "minute"} {
		if !strings.Contains(s, want) {
			t.Fatalf("svg lacks %q: %.400s", want, s)
		}
	}
	// Two policies, three panels: six lines, and two legend samples.
	if n := strings.Count(s, "<path"); n < 8 {
		t.Fatalf("svg has %d paths, want a line per policy and panel", n)
	}

	var img bytes.Buffer
	if err := Write(&img, "png", res, time.Minute); err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(&img)
	if err != nil {
		t.Fatalf("png: %v", err)
	}
	if b := m.Bounds(); b.Dx() < 800 || b.Dy() < 800 {
		t.Fatalf("png is %v", b)
	}
	// Not blank: some pixels carry the policies' colours.
	coloured := 0
	for y := m.Bounds().Min.Y; y < m.Bounds().Max.Y; y += 2 {
		for x := m.Bounds().Min.X; x < m.Bounds().Max.X; x += 2 {
			r, g, b, _ := m.At(x, y).RGBA()
			if r != g || g != b {
				coloured++
			}
		}
	}
	if coloured < 100 {
		t.Fatalf("png has %d coloured pixels: no lines drawn", coloured)
	}

	var pdf bytes.Buffer
	if err := Write(&pdf, "pdf", res, time.Minute); err != nil || !bytes.HasPrefix(pdf.Bytes(), []byte("%PDF")) {
		t.Fatalf("pdf: %v %.20q", err, pdf.Bytes())
	}
}

func TestWriteRefusesWhatItCannotDraw(t *testing.T) {
	if err := Write(&bytes.Buffer{}, "svg", []sim.Result{{Policy: "empty"}}, 0); err == nil {
		t.Fatal("a plot of no timeline succeeded")
	}
	if err := Write(&bytes.Buffer{}, "gif", results(t), time.Minute); err == nil {
		t.Fatal("a gif was drawn")
	}
}

func TestFormatOf(t *testing.T) {
	for path, want := range map[string]string{"a.svg": "svg", "out/run.PNG": "png", "x.pdf": "pdf", "x.jpg": "", "plot": ""} {
		t.Run(path, func(t *testing.T) {
			got, err := FormatOf(path)
			if got != want || (want == "") != (err != nil) {
				t.Errorf("FormatOf(%q) = %q, %v; want %q", path, got, err, want)
			}
		})
	}
}

// timeline is a made-up run of minutes: prefill engines of engines, and
// queues from queue on.
func timeline(minutes, prefill, engines, queue int) []sim.Window {
	var out []sim.Window
	for m := range minutes {
		out = append(out, sim.Window{Start: time.Duration(m) * time.Minute, Prefill: prefill, Decode: engines - prefill, Waiting: queue + m%3, Requests: 10})
	}
	return out
}

func svgOf(t *testing.T, res []sim.Result, warmup time.Duration) string {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, "svg", res, warmup); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The figure's title says the run: with the scenario, its parameters;
// without, what the results tell. The first panel's title says what it
// plots.
func TestWriteTitlesTheRun(t *testing.T) {
	p, _ := stepmodel.BuiltinProfile("gb300-kimi-k2")
	sc := sim.Scenario{Profile: p, Engines: 3, Workload: "math", Agents: 6, Warmup: time.Minute, Duration: 3 * time.Minute, Seed: 7}
	res := []sim.Result{{Policy: "static:1:2", Timeline: timeline(4, 1, 3, 0)}, {Policy: "dynamo", Timeline: timeline(4, 1, 3, 5)}}
	var b bytes.Buffer
	if err := WriteScenario(&b, "svg", res, sc); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "3 engines of gb300-kimi-k2, math, 6 agents; 1m warm-up + 3m scored, seed 7") {
		t.Fatalf("no title with the run's parameters: %.600s", s)
	}
	s := svgOf(t, res, time.Minute)
	for _, want := range []string{"2 policies on 3 engines, 4m modelled (1m warm-up)", "Prefill engines serving (the axis reaches all 3)"} {
		if !strings.Contains(s, want) {
			t.Fatalf("svg lacks %q", want)
		}
	}
	if strings.Contains(s, "of all serving") {
		t.Fatal("the first panel claims to plot all serving engines")
	}
}

// A policy whose lines are another's in every panel would be drawn
// under it, unseen: the legend says so. Lines equal in one panel only are
// drawn a little apart there, and its title says so.
func TestIdenticalPoliciesAreSaidAndDrawnApart(t *testing.T) {
	res := []sim.Result{
		{Policy: "evolve", Timeline: timeline(5, 1, 4, 0)},
		{Policy: "static:1:3", Timeline: timeline(5, 1, 4, 0)},
		{Policy: "dynamo-static:1:3", Timeline: timeline(5, 1, 4, 7)},
	}
	s := svgOf(t, res, 0)
	if !strings.Contains(s, ">static:1:3 (same lines as evolve)<") || strings.Contains(s, "dynamo-static:1:3 (same") {
		t.Fatalf("legend: %v", regexpAll(s, `>[^<]*\(same lines as [^<]*<`))
	}
	if n := strings.Count(s, "equal lines drawn a little apart"); n != 3 { // evolve and static:1:3 in each
		t.Fatalf("%d panels say their equal lines are drawn apart", n)
	}
	// Equal only in the engines panel: apart there, not in the others,
	// and not the same lines.
	res[2].Timeline = timeline(5, 1, 4, 7)
	for i := range res[2].Timeline {
		res[2].Timeline[i].Requests = 0 // no latency to draw: made-up minutes have no requests' times
	}
	res = res[1:]
	s = svgOf(t, res, 0)
	if n := strings.Count(s, "equal lines drawn a little apart"); n != 1 || strings.Contains(s, "(same lines") {
		t.Fatalf("%d panels drawn apart for lines equal in one", n)
	}
}

// The last minutes' mean latency leaves out the long requests that had
// not finished when the run ended: those minutes are shaded and named,
// where requests were unfinished.
func TestUnfinishedRequestsAtTheEndAreMarked(t *testing.T) {
	res := []sim.Result{{Policy: "evolve", Timeline: timeline(10, 1, 4, 0), VirtualSec: 600, RequestsUnfinished: 12, P99E2E: 120}}
	if s := svgOf(t, res, 0); !strings.Contains(s, "shaded from minute 8: long requests arriving then had not finished") {
		t.Fatal("the unfinished requests' minutes are not marked")
	}
	res[0].RequestsUnfinished = 0
	if s := svgOf(t, res, 0); strings.Contains(s, "shaded") {
		t.Fatal("marked, though every request finished")
	}
}

// The legend's column is as wide as its longest name: nothing is drawn
// at the figure's right edge (a cut name would be).
func TestLegendIsNotCut(t *testing.T) {
	res := []sim.Result{{Policy: "evolve", Timeline: timeline(5, 1, 4, 0)}, {Policy: "static:best-throughput", Timeline: timeline(5, 1, 4, 0)},
		{Policy: "dynamo-static:best-throughput-with-a-long-name", Timeline: timeline(5, 2, 4, 3)}}
	var b bytes.Buffer
	if err := Write(&b, "png", res, 0); err != nil {
		t.Fatal(err)
	}
	m, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	r := m.Bounds()
	for x := r.Max.X - 4; x < r.Max.X; x++ {
		for y := r.Min.Y; y < r.Max.Y; y++ {
			if cr, cg, cb, _ := m.At(x, y).RGBA(); cr != 0xffff || cg != 0xffff || cb != 0xffff {
				t.Fatalf("a pixel at the right edge (%d,%d) is drawn: the legend runs off the figure", x, y)
			}
		}
	}
}

func regexpAll(s, pattern string) []string { return regexp.MustCompile(pattern).FindAllString(s, -1) }
