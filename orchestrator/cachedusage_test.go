package orchestrator

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/evolvellm/evolve/roles"
)

// A never-seen prompt split between a prefill and a decode node reports
// no cached tokens, on OpenAI's API and on Anthropic's, whole and
// streamed (message_start included): the KV the decode engine pulled was
// computed for this very request. The same prompt sent again reports
// its reuse.
func TestSplitRequestUsageCountsNoTransferAsCached(t *testing.T) {
	tc := startTestCluster(t, roles.Prefill, roles.Decode)
	router := tc.o.RouterURL()
	type answer struct {
		status          int
		prefill, decode string
		cached          int // cached_tokens, or cache_read_input_tokens
		startCached     int // message_start's cache_read_input_tokens (-1: none)
	}
	send := func(path, body string) answer {
		t.Helper()
		req, _ := http.NewRequest("POST", router+path, strings.NewReader(body))
		if path == "/v1/messages" {
			req.Header.Set("anthropic-version", "2023-06-01")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		a := answer{status: resp.StatusCode, prefill: resp.Header.Get(HeaderPrefillNode), decode: resp.Header.Get(HeaderDecodeNode), startCached: -1}
		read := func(b []byte) {
			var m struct {
				Type  string
				Usage *struct {
					CacheRead *int `json:"cache_read_input_tokens"`
					Details   *struct {
						Cached int `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				}
				Message *struct {
					Usage struct {
						CacheRead int `json:"cache_read_input_tokens"`
					}
				}
			}
			if json.Unmarshal(b, &m) != nil {
				return
			}
			if m.Type == "message_start" && m.Message != nil {
				a.startCached = m.Message.Usage.CacheRead
			}
			if u := m.Usage; u != nil && u.CacheRead != nil {
				a.cached = *u.CacheRead
			} else if u != nil && u.Details != nil {
				a.cached = u.Details.Cached
			}
		}
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			var b json.RawMessage
			json.NewDecoder(resp.Body).Decode(&b)
			read(b)
			return a
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				read([]byte(d))
			}
		}
		return a
	}
	for i, c := range []struct {
		path, shape string
	}{
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": %q}], "max_tokens": 4}`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": %q}], "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}`},
		{"/v1/completions", `{"prompt": %q, "max_tokens": 4}`},
		{"/v1/messages", `{"model": "evolve-tiny", "messages": [{"role": "user", "content": %q}], "max_tokens": 4}`},
		{"/v1/messages", `{"model": "evolve-tiny", "messages": [{"role": "user", "content": %q}], "max_tokens": 4, "stream": true}`},
	} {
		prompt := strings.Repeat(fmt.Sprintf("a repository no agent has read yet, part %d; ", i), 60)
		body := fmt.Sprintf(c.shape, prompt)
		first := send(c.path, body)
		if first.status != 200 || first.prefill == first.decode {
			t.Fatalf("%s %d: answered %d on %s and %s: want a split request", c.path, i, first.status, first.prefill, first.decode)
		}
		if first.cached != 0 || first.startCached > 0 {
			t.Errorf("%s %d: a never-seen prompt reports %d cached tokens (message_start %d)", c.path, i, first.cached, first.startCached)
		}
		if strings.Contains(body, `"stream": true`) && c.path == "/v1/messages" && first.startCached != 0 {
			t.Errorf("%s %d: no message_start usage read (%d)", c.path, i, first.startCached)
		}
		again := send(c.path, body)
		if again.status != 200 || again.cached == 0 {
			t.Errorf("%s %d: the same prompt again reports %d cached tokens (answered %d on %s and %s)", c.path, i, again.cached,
				again.status, again.prefill, again.decode)
		}
	}
}
