package engine

import (
	"math"
	"math/rand/v2"

	"github.com/evolvellm/evolve/openaiapi"
)

// A simulated model stops on its own, as a real one writes its end of
// turn: an answer's natural length is drawn from a log-normal of median
// answerMedian and 95th percentile answerP95 tokens (the output model of
// the coding workload, after the public Claude Code statistics it cites),
// and never below answerFloor. The draw depends on the prompt alone
// (and the request's seed), so that every engine that writes part of one
// answer, a decode leg or one that goes on with it after a failure, stops
// it at the same token. A request with ignore_eos (benchmarks, evolve
// bench) is written to its max_tokens; min_tokens raises the stop.
const (
	answerMedian = 300
	answerP95    = 2000
	answerFloor  = 64
)

// answerTokens is where the answer to prompt ends on its own: the
// output tokens after which the model writes its end of turn (sim.Request
// StopAt); max_tokens, when that comes first (or with ignore_eos), ends it
// as before, for its length.
func answerTokens(prompt []uint32, req *openaiapi.Request, maxTokens int) int {
	if req.IgnoreEOS {
		return maxTokens
	}
	h := uint64(len(prompt)) * 0x9e3779b97f4a7c15
	for _, t := range prompt[max(0, len(prompt)-256):] {
		h = (h ^ uint64(t)) * 0x100000001b3
	}
	if req.Seed != nil {
		h ^= uint64(*req.Seed) * 0xff51afd7ed558ccd
	}
	r := rand.New(rand.NewPCG(h, h>>17|1))
	sigma := math.Log(float64(answerP95)/answerMedian) / 1.6448536269514722
	n := max(answerFloor, int(answerMedian*math.Exp(sigma*r.NormFloat64())))
	if req.MinTokens != nil {
		n = max(n, *req.MinTokens)
	}
	return min(n, maxTokens)
}
