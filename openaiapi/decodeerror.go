package openaiapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// DecodeErrorText says what is wrong with a body encoding/json could not
// decode, in the words of the API rather than of Go's types: "max_tokens
// must be a number, not a string" where encoding/json says "cannot
// unmarshal string into Go struct field Request.max_tokens of type int".
func DecodeErrorText(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		found := te.Value
		switch found {
		case "number", "string", "object", "array", "bool":
			found = map[string]string{"number": "a number", "string": "a string", "object": "an object",
				"array": "a list", "bool": "true or false"}[found]
		default:
			if strings.HasPrefix(found, "number ") {
				found = "the number " + strings.TrimPrefix(found, "number ")
			}
		}
		if te.Field == "" {
			return fmt.Sprintf("expected %s, found %s", kindOf(te.Type), found)
		}
		return fmt.Sprintf("%s must be %s, not %s", te.Field, kindOf(te.Type), found)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("not valid JSON (at byte %d): %s", se.Offset, se.Error())
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// DecodeError is the 400 for a body encoding/json could not decode: its
// message is DecodeErrorText's, and its param the member at fault when
// one is (a value of the wrong type); a body that is not JSON is said to
// be malformed.
func DecodeError(err error) *Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return BadRequest(te.Field, "%s", DecodeErrorText(err))
	}
	return BadRequest("", "malformed JSON body: %s", DecodeErrorText(err))
}

// kindOf names the JSON a Go type takes.
func kindOf(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number of 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && t.Name() == "RawMessage" {
			return "a value"
		}
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a value"
}
