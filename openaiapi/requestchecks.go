package openaiapi

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The checks of a chat request's tools and response_format: shapes a
// chat template or vLLM's structured output cannot take are refused with
// a 400 that names the member, rather than rendered into the prompt as
// they came (a tool whose name is 5 and whose parameters are "nope").

// jsonKind names the JSON value raw holds, by its first byte: "a string",
// "an object", "a list", "a number", "true or false", "null", or "nothing".
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "a list"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	return "a number"
}

// absent reports whether a member is missing or null.
func absent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// checkTools refuses tools that are not a list of functions, each with a
// name (a non-empty string) and, if any, parameters that are a JSON
// Schema object, as vLLM's ChatCompletionToolsParam takes them.
func checkTools(raw json.RawMessage) *Error {
	if absent(raw) {
		return nil
	}
	var tools []json.RawMessage
	if json.Unmarshal(raw, &tools) != nil {
		return BadRequest("tools", "tools must be a list of tools, not %s", jsonKind(raw))
	}
	for i, t := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		var tool struct {
			Type     json.RawMessage `json:"type"`
			Function json.RawMessage `json:"function"`
		}
		if json.Unmarshal(t, &tool) != nil {
			return BadRequest(param, "%s must be an object, not %s", param, jsonKind(t))
		}
		if !absent(tool.Type) {
			var typ string
			if json.Unmarshal(tool.Type, &typ) != nil || typ != "function" {
				return BadRequest(param+".type", "%s.type must be \"function\" (got %s)", param, bytes.TrimSpace(tool.Type))
			}
		}
		if absent(tool.Function) {
			return BadRequest(param+".function", "%s.function is required: {\"name\": ..., \"parameters\": {...}}", param)
		}
		var fn struct {
			Name        json.RawMessage `json:"name"`
			Description json.RawMessage `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		}
		if json.Unmarshal(tool.Function, &fn) != nil {
			return BadRequest(param+".function", "%s.function must be an object, not %s", param, jsonKind(tool.Function))
		}
		var name string
		if absent(fn.Name) {
			return BadRequest(param+".function.name", "%s.function.name is required", param)
		}
		if json.Unmarshal(fn.Name, &name) != nil {
			return BadRequest(param+".function.name", "%s.function.name must be a string, not %s", param, jsonKind(fn.Name))
		}
		if name == "" {
			return BadRequest(param+".function.name", "%s.function.name must not be empty", param)
		}
		if !absent(fn.Description) && jsonKind(fn.Description) != "a string" {
			return BadRequest(param+".function.description", "%s.function.description must be a string, not %s", param, jsonKind(fn.Description))
		}
		if !absent(fn.Parameters) && jsonKind(fn.Parameters) != "an object" {
			return BadRequest(param+".function.parameters", "%s.function.parameters must be a JSON Schema object, not %s", param, jsonKind(fn.Parameters))
		}
	}
	return nil
}

// responseFormats are the response_format types served: OpenAI's, and
// vLLM's structural_tag.
var responseFormats = map[string]bool{"text": true, "json_object": true, "json_schema": true, "structural_tag": true}

// checkResponseFormat refuses a response_format that is not an object of
// a type served, or a json_schema one without its schema object.
func checkResponseFormat(raw json.RawMessage) *Error {
	if absent(raw) {
		return nil
	}
	var f struct {
		Type       json.RawMessage `json:"type"`
		JSONSchema json.RawMessage `json:"json_schema"`
	}
	if json.Unmarshal(raw, &f) != nil {
		return BadRequest("response_format", "response_format must be an object such as {\"type\": \"json_object\"}, not %s", jsonKind(raw))
	}
	var typ string
	if json.Unmarshal(f.Type, &typ) != nil || !responseFormats[typ] {
		got := string(bytes.TrimSpace(f.Type))
		if got == "" {
			got = "none"
		}
		return BadRequest("response_format.type", "response_format.type must be text, json_object or json_schema (got %s)", got)
	}
	if typ == "json_schema" && jsonKind(f.JSONSchema) != "an object" {
		return BadRequest("response_format.json_schema", "response_format of type json_schema needs json_schema: {\"name\": ..., \"schema\": {...}}")
	}
	return nil
}
