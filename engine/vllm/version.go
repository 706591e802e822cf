package vllm

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// TokenIDsSince is the first vLLM release whose streams name the tokens
// they carry (return_token_ids), which a router needs to continue an
// answer on another engine when this one dies mid-stream.
var TokenIDsSince = [3]int{0, 10, 2}

// Version asks vLLM's GET /version for its release ("0.11.0",
// "0.10.2.dev45+g1a2b3c"); "" when it does not say.
func Version(ctx context.Context, hc *http.Client, base string) string {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/version", nil)
	if err != nil {
		return ""
	}
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		Version string `json:"version"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&out) != nil {
		return ""
	}
	return out.Version
}

// versionBefore says whether release v is older than want; a release it
// cannot read is not older (a development build, say).
func versionBefore(v string, want [3]int) bool {
	parts := strings.SplitN(v, ".", 4)
	if len(parts) < 3 {
		return false
	}
	for i := range 3 {
		digits := parts[i] // "2", "0rc1", "2+cu128": the leading digits
		if end := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); end >= 0 {
			digits = digits[:end]
		}
		n, err := strconv.Atoi(digits)
		if err != nil {
			return false
		}
		if n != want[i] {
			return n < want[i]
		}
	}
	return false
}
