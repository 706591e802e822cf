package orchestrator

import (
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/evolvellm/evolve/openaiapi"
)

// Model aliases let clients that name a model of their own reach the one
// the cluster serves: Claude Code asks for claude-* models (a background
// task's haiku, a sub-agent's), and many OpenAI clients name gpt-4o. Each
// alias is a name or a path.Match pattern ("claude-*"; "*" takes any
// name). A request for an alias is served as one for the served model,
// and its body names the served model, as vLLM's server requires.

// checkAliases reports a pattern path.Match cannot read.
func checkAliases(aliases []string) error {
	for _, a := range aliases {
		if a == "" {
			return fmt.Errorf("model alias: an empty name")
		}
		if _, err := path.Match(a, ""); err != nil {
			return fmt.Errorf("model alias %q: %v (want a name, or a pattern such as claude-*)", a, err)
		}
	}
	return nil
}

// aliased says whether asked is one of the model aliases.
func (o *Orchestrator) aliased(asked string) bool {
	for _, a := range o.cfg.ModelAliases {
		if ok, _ := path.Match(a, asked); ok {
			return true
		}
	}
	return false
}

// literalAliases are the aliases that are plain names: the models list
// names them beside the served model.
func (o *Orchestrator) literalAliases() []string {
	var out []string
	for _, a := range o.cfg.ModelAliases {
		if !strings.ContainsAny(a, `*?[\`) {
			out = append(out, a)
		}
	}
	return out
}

// resolveModel says whether a request for asked is served by the served
// model: no name, the served one, or an alias.
func (o *Orchestrator) resolveModel(asked, served string) bool {
	return asked == "" || asked == served || o.aliased(asked)
}

// unknownModel is the error for a request that asks for a model the
// cluster does not serve.
func (o *Orchestrator) unknownModel(asked, served string) *openaiapi.Error {
	also := ""
	if len(o.cfg.ModelAliases) > 0 {
		also = fmt.Sprintf(" (also as %s)", strings.Join(o.cfg.ModelAliases, ", "))
	}
	return &openaiapi.Error{Status: 404, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("The model `%s` does not exist. This cluster serves `%s`%s.", asked, served, also)}
}

// servedBody is rb naming the served model in place of the alias the
// client asked for.
func servedBody(rb openaiapi.Body, served string) openaiapi.Body {
	name, _ := json.Marshal(served)
	return rb.Set(map[string]json.RawMessage{"model": name})
}
