// Package openaiapitest reads what tests of evolve's engines and router
// get back: a streamed chat answer, chunk by chunk, with evolve's
// extensions (the "evolve" object, a handover in place of the rest), and
// a whole answer with the lines an engine opens it with for a router.
package openaiapitest

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/evolvellm/evolve/protocol"
)

// Chat is what a streamed chat answer said.
type Chat struct {
	Content  []string        // each content chunk's text, in order
	Roles    int             // chunks that named the role
	IDs      map[string]bool // the answer ids its chunks carried
	Usage    map[string]any  // the last usage seen
	Evolve   *protocol.ResponseKV
	HandOver *protocol.HandOver // the event that ended the stream in a handover
	Done     bool               // [DONE] came
	// Other holds the lines that are neither events nor blank (SSE
	// comments such as protocol.TokenComment, or junk); Errors the events
	// that do not parse or carry an error.
	Other, Errors []string
	ReadErr       error // why reading stopped, if not at the stream's end
}

// Text is the answer's text.
func (c *Chat) Text() string { return strings.Join(c.Content, "") }

// ReadChat reads a streamed chat answer to its end; after each content
// chunk it calls each (when not nil) with the count so far.
func ReadChat(body io.Reader, each func(n int)) *Chat {
	c := &Chat{IDs: map[string]bool{}}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			if sc.Text() != "" {
				c.Other = append(c.Other, sc.Text())
			}
			continue
		}
		if line == "[DONE]" {
			c.Done = true
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				Finish *string `json:"finish_reason"`
			} `json:"choices"`
			Usage    map[string]any       `json:"usage"`
			Evolve   *protocol.ResponseKV `json:"evolve"`
			HandOver *protocol.HandOver   `json:"evolve_handover"`
			Error    any                  `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil || ch.Error != nil {
			c.Errors = append(c.Errors, line)
			continue
		}
		if ch.HandOver != nil {
			c.HandOver = ch.HandOver
			continue
		}
		c.IDs[ch.ID] = true
		if ch.Usage != nil {
			c.Usage = ch.Usage
		}
		if ch.Evolve != nil {
			c.Evolve = ch.Evolve
		}
		for _, x := range ch.Choices {
			if x.Delta.Role != "" {
				c.Roles++
			}
			if x.Finish == nil && x.Delta.Content != nil {
				c.Content = append(c.Content, *x.Delta.Content)
				if each != nil {
					each(len(c.Content))
				}
			}
		}
	}
	c.ReadErr = sc.Err()
	return c
}

// Whole is a whole (not streamed) answer as an engine writes it for a
// router: the lines that open it (protocol.AnswerComment, then a
// protocol.TokenComment per token), then its JSON.
type Whole struct {
	ID       string   // from the AnswerComment line; "" without one
	Created  int64    //
	Tokens   []uint32 // the tokens the TokenComment lines named
	Samplers []uint64 // and the sampler's state after each
	JSON     []byte   // the answer (or a handover)
	// Bad holds the comment lines that could not be read.
	Bad []string
}

// ReadWhole reads a whole answer, with or without the opening lines.
func ReadWhole(body io.Reader) (*Whole, error) {
	w := &Whole{}
	rd := bufio.NewReader(body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil && (err != io.EOF || strings.HasPrefix(line, ":")) {
			return w, fmt.Errorf("the answer ended before its JSON: %w", cmp.Or(err, io.ErrUnexpectedEOF))
		}
		if rest, ok := strings.CutPrefix(line, protocol.AnswerComment); ok {
			if _, err := fmt.Sscan(rest, &w.ID, &w.Created); err != nil {
				w.Bad = append(w.Bad, line)
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, protocol.TokenComment); ok {
			var id uint32
			var s uint64
			if _, err := fmt.Sscan(rest, &id, &s); err != nil {
				w.Bad = append(w.Bad, line)
				continue
			}
			w.Tokens, w.Samplers = append(w.Tokens, id), append(w.Samplers, s)
			continue
		}
		rest, err := io.ReadAll(rd)
		w.JSON = append([]byte(line), rest...)
		return w, err
	}
}
