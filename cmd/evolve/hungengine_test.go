package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/evolvellm/evolve/internal/wait"
)

// streamed is what a client read of a streamed chat answer: its text, its
// chunks, and the longest wait between two of them.
type streamed struct {
	text    string
	chunks  int
	longest time.Duration
	decode  string // X-Evolve-Decode-Node
}

// streamChat sends body and reads its stream; after calls onChunk(n)
// after each chunk n.
func streamChat(t *testing.T, url string, body map[string]any, onChunk func(n int, decode string)) streamed {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	s := streamed{decode: resp.Header.Get("X-Evolve-Decode-Node")}
	var text strings.Builder
	last := time.Now()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || d == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Error *struct{ Message string } `json:"error"`
		}
		if json.Unmarshal([]byte(d), &c) != nil {
			continue
		}
		if c.Error != nil {
			t.Fatalf("the stream ended in an error after %d chunks: %s", s.chunks, c.Error.Message)
		}
		if len(c.Choices) == 0 {
			continue
		}
		now := time.Now()
		if s.chunks > 0 {
			s.longest = max(s.longest, now.Sub(last))
		}
		last = now
		text.WriteString(c.Choices[0].Delta.Content)
		s.chunks++
		if onChunk != nil {
			onChunk(s.chunks, s.decode)
		}
	}
	s.text = text.String()
	return s
}

// A stream whose decode engine hangs (SIGSTOP: a stopped process, as a
// stuck GPU looks) goes on on a peer within seconds of the node being
// marked down, with the same tokens: before, it waited as long as the
// engine hung (242 s until SIGCONT). The engine, continued, finds its
// client gone and drops the answer.
func TestHungEngineStreamGoesOnElsewhere(t *testing.T) {
	c := upCluster(t, "--engines", "3", "--prefill", "1", "--speedup", "5")
	body := map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a question that needs a long answer ", 20)}},
		"max_tokens": 1200, "ignore_eos": true, "seed": 7, "stream": true}
	ref := streamChat(t, c.state.RouterURL, body, nil)
	pids := map[string]int{}
	for i, pid := range c.state.Engines {
		pids["engine-"+string(rune('0'+i))] = pid
	}
	stopped := 0
	t.Cleanup(func() {
		if stopped != 0 {
			syscall.Kill(stopped, syscall.SIGCONT)
		}
	})
	var stoppedAt time.Time
	got := streamChat(t, c.state.RouterURL, body, func(n int, decode string) {
		if n == 200 {
			stopped, stoppedAt = pids[decode], time.Now()
			if err := syscall.Kill(stopped, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// A router that waits for the hung engine gets its tokens
			// when it is continued, 30 s on.
			pid := stopped
			time.AfterFunc(30*time.Second, func() { syscall.Kill(pid, syscall.SIGCONT) })
		}
	})
	if stopped == 0 {
		t.Fatalf("the answer ended after %d chunks, before its engine was stopped", got.chunks)
	}
	if got.text != ref.text || got.chunks != ref.chunks {
		t.Fatalf("the answer changed when its engine hung: %d chunks, want %d", got.chunks, ref.chunks)
	}
	// The node is marked down after 3 missed heartbeats; its leg is ended
	// a second later, and the answer resumes on the other decode node.
	if got.longest > 10*time.Second {
		t.Fatalf("the client waited %v for a token while the engine hung", got.longest)
	}
	hungFor := time.Since(stoppedAt)
	syscall.Kill(stopped, syscall.SIGCONT)
	stopped = 0
	// Back, it has no answer left running: it dropped the one it hung on.
	wait.Until(t, 15*time.Second, "the continued engine serving with nothing running", func() bool {
		n := c.node(got.decode)
		running, ok := n["running"].(float64)
		return ok && n["state"] == "serving" && running == 0
	})
	t.Logf("%s hung for %v; the client's longest wait between tokens %v", got.decode, hungFor, got.longest)
}
