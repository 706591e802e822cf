package plot

import (
	"bytes"
	"image/png"
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
