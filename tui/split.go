package tui

import (
	"fmt"
	"strings"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"
)

// Split shows two monitors side by side (evolve top --beside), typically
// two simulated policies of one comparison. Each pane gets half the
// screen; keys go to both, so they show the same view and move together.
// Switching nodes is not offered here: make both panes read-only.
type Split struct {
	panes         [2]*Model
	width, height int
}

// paneMsg is a message for one pane.
type paneMsg struct {
	pane int
	msg  tea.Msg
}

// NewSplit returns a monitor of a (left, or above) beside b.
func NewSplit(a, b *Model) *Split {
	a.minCols, b.minCols = minPaneWidth, minPaneWidth
	return &Split{panes: [2]*Model{a, b}, width: 2*120 + 3, height: 40}
}

// wrap tags the message a pane's command produces with the pane.
func (s *Split) wrap(pane int, c tea.Cmd) tea.Cmd {
	if c == nil {
		return nil
	}
	return func() tea.Msg { return paneMsg{pane: pane, msg: c()} }
}

// Init starts both panes.
func (s *Split) Init() tea.Cmd {
	return tea.Batch(s.wrap(0, s.panes[0].Init()), s.wrap(1, s.panes[1].Init()))
}

// Update routes a pane's messages to it, and keys and sizes to both.
func (s *Split) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case paneMsg:
		switch inner := msg.msg.(type) {
		case nil:
			return s, nil
		case tea.BatchMsg:
			cmds := make([]tea.Cmd, len(inner))
			for i, c := range inner {
				cmds[i] = s.wrap(msg.pane, c)
			}
			return s, tea.Batch(cmds...)
		case tea.QuitMsg:
			return s, s.quit()
		}
		_, c := s.panes[msg.pane].Update(msg.msg)
		return s, s.wrap(msg.pane, c)
	case tea.WindowSizeMsg:
		s.width, s.height = msg.Width, msg.Height
		for i, p := range s.panes {
			w, h := s.paneSize(i)
			p.Update(tea.WindowSizeMsg{Width: w, Height: h})
		}
		return s, nil
	case tea.KeyMsg:
		if k := msg.String(); k == "q" || k == "ctrl+c" {
			return s, s.quit()
		}
		var cmds []tea.Cmd
		for i, p := range s.panes {
			_, c := p.Update(msg)
			cmds = append(cmds, s.wrap(i, c))
		}
		return s, tea.Batch(cmds...)
	}
	return s, nil
}

func (s *Split) quit() tea.Cmd {
	for _, p := range s.panes {
		p.stop()
	}
	return tea.Quit
}

// minPaneWidth is the narrowest a pane may be side by side: the nodes
// table of short node names (a simulation's e0, e1...) keeps every
// figure, and drops only its LOAD sparkline; longer names cut the row.
const minPaneWidth = 76

// paneWidth is each pane's width side by side on a screen of width w: a
// bar between.
func paneWidth(w int) int { return (w - 3) / 2 }

// stacked reports whether the panes go one above the other: the screen is
// too narrow for them side by side, but tall enough for two.
func (s *Split) stacked() bool {
	return paneWidth(s.width) < minPaneWidth && s.width >= minWidth && s.height >= 2*minHeight+1
}

// paneSize is pane i's size in the current layout.
func (s *Split) paneSize(i int) (int, int) {
	if !s.stacked() {
		return paneWidth(s.width), s.height
	}
	top := (s.height - 1) / 2 // a rule between
	if i == 0 {
		return s.width, top
	}
	return s.width, s.height - 1 - top
}

// View draws the panes side by side, a bar between them, or one above
// the other on a tall, narrow screen.
func (s *Split) View() string {
	if s.stacked() {
		return strings.TrimSuffix(s.panes[0].View(), "\n") + "\n" + strings.Repeat("─", s.width) + "\n" + s.panes[1].View()
	}
	if w := paneWidth(s.width); w < minPaneWidth || s.height < minHeight {
		return fmt.Sprintf("terminal too small: side by side needs %dx%d, one above the other %dx%d; this one is %dx%d\n(q quits)",
			2*minPaneWidth+3, minHeight, minWidth, 2*minHeight+1, s.width, s.height)
	}
	w := paneWidth(s.width)
	left := strings.Split(strings.TrimSuffix(s.panes[0].View(), "\n"), "\n")
	right := strings.Split(strings.TrimSuffix(s.panes[1].View(), "\n"), "\n")
	n := max(len(left), len(right))
	var b strings.Builder
	for i := 0; i < n; i++ {
		var l, r string
		if i < len(left) {
			l = left[i]
		}
		if i < len(right) {
			r = right[i]
		}
		if pad := w - lipgloss.Width(l); pad > 0 {
			l += strings.Repeat(" ", pad)
		}
		b.WriteString(l + " │ " + r)
		if i < n-1 {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
