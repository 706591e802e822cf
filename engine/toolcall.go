package engine

import (
	"bytes"
	"encoding/json"
	"sort"

	"github.com/evolvellm/evolve/openaiapi"
)

// A simulated model calls a tool only when the request requires one
// (tool_choice "required", or a named function): then its answer is one
// call of that tool (of the first offered, for "required"), whose
// arguments hold the generated text in the first string parameter of the
// tool's schema, as {"path": " baca dofe ..."}. With tool_choice "auto"
// it never calls one: an agent that ran the calls of a simulated model
// (Claude Code's Bash, Write) would act on made-up arguments. The answer
// costs the tokens it generates, as any other; its finish reason is
// "tool_calls".

// toolPlan is the call an answer makes.
type toolPlan struct {
	name  string // the function's name
	param string // the parameter that holds the generated text
}

// requiredTool reads the call a chat request requires, if any.
func requiredTool(req *openaiapi.Request) (*toolPlan, *apiError) {
	choice := bytes.TrimSpace(req.ToolChoice)
	if len(choice) == 0 || string(choice) == "null" || string(choice) == `"auto"` || string(choice) == `"none"` {
		return nil, nil
	}
	var tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if err := json.Unmarshal(req.Tools, &tools); err != nil || len(tools) == 0 {
		return nil, badRequest("tool_choice", "tool_choice asks for a tool call, but the request offers no tools")
	}
	want := ""
	if string(choice) != `"required"` {
		var named struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(choice, &named) != nil || named.Function.Name == "" {
			return nil, badRequest("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`)
		}
		want = named.Function.Name
	}
	for _, t := range tools {
		if want == "" || t.Function.Name == want {
			return &toolPlan{name: t.Function.Name, param: textParam(t.Function.Parameters)}, nil
		}
	}
	return nil, badRequest("tool_choice", "tool_choice names %q, which the request's tools do not offer", want)
}

// textParam is the parameter of a JSON schema that holds the generated
// text: the first required string property, else the first string
// property by name, else "input".
func textParam(schema json.RawMessage) string {
	var s struct {
		Properties map[string]struct {
			Type any `json:"type"`
		} `json:"properties"`
		Required []string `json:"required"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return "input"
	}
	isString := func(name string) bool {
		p, ok := s.Properties[name]
		return ok && p.Type == "string"
	}
	for _, r := range s.Required {
		if isString(r) {
			return r
		}
	}
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if isString(n) {
			return n
		}
	}
	return "input"
}

// toolCallJSON is one call in a message or a delta.
type toolCallJSON struct {
	Index    *int             `json:"index,omitempty"`
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"`
	Function toolFunctionJSON `json:"function"`
}

type toolFunctionJSON struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// callID names the answer's call: the same on every engine that writes
// part of the answer (its id is kept).
func (g *generation) callID() string { return "call-" + g.id }

// opening and closing are the arguments' JSON around the text.
func (t *toolPlan) opening() string {
	k, _ := json.Marshal(t.param)
	return "{" + string(k) + `:"`
}

const toolClosing = `"}`

// escaped is text as it reads inside a JSON string.
func escaped(text string) string {
	b, _ := json.Marshal(text)
	return string(b[1 : len(b)-1])
}

// toolDelta is a streamed chunk of the call: the first names the tool and
// opens its arguments, the others add to them.
func (g *generation) toolDelta(text string, last bool) *chatDelta {
	zero := 0
	call := toolCallJSON{Index: &zero, Function: toolFunctionJSON{Arguments: escaped(text)}}
	d := &chatDelta{}
	if g.sent == 0 {
		d.Role = "assistant"
		call.ID, call.Type, call.Function.Name = g.callID(), "function", g.tool.name
		call.Function.Arguments = g.tool.opening() + call.Function.Arguments
	}
	if last {
		call.Function.Arguments += toolClosing
	}
	d.ToolCalls = []toolCallJSON{call}
	return d
}

// toolMessage is the whole answer's message: the call with its arguments.
func (g *generation) toolMessage(text string) *chatDelta {
	args, _ := json.Marshal(map[string]string{g.tool.param: text})
	return &chatDelta{Role: "assistant", ToolCalls: []toolCallJSON{{ID: g.callID(), Type: "function",
		Function: toolFunctionJSON{Name: g.tool.name, Arguments: string(args)}}}}
}
