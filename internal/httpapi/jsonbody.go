package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"
)

// MaxJSONDepth is how deeply arrays and objects may nest in a request body.
// A replication document needs five levels (source.auth.basic, selectors a
// few more); the limit keeps a hostile body from costing more than a
// linear scan.
const MaxJSONDepth = 64

// checkJSONBody checks a request body before anything decodes it, and
// says exactly what is wrong: not UTF-8, not JSON (with the byte offset),
// nested deeper than MaxJSONDepth, a key given twice in one object (which
// of them counts is not obvious, so neither does), or not an object.
// Every error is a 400 bad_request.
func checkJSONBody(body []byte) *apiError {
	if !utf8.Valid(body) {
		off := 0
		for off < len(body) {
			r, n := utf8.DecodeRune(body[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return errorf(http.StatusBadRequest, "bad_request", "invalid UTF-8 at byte %d of the JSON body", off)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]struct{}
		path   string
		key    bool // the next string token is a key
		member string
	}
	var stack []frame
	first, done := true, false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) && !first && !done {
			err = io.ErrUnexpectedEOF
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return jsonSyntaxError(err, dec.InputOffset())
		}
		if done {
			return errorf(http.StatusBadRequest, "bad_request", "invalid JSON at byte %d: data after the JSON object", dec.InputOffset())
		}
		if first {
			first = false
			if d, ok := tok.(json.Delim); !ok || d != '{' {
				return errorf(http.StatusBadRequest, "bad_request", "Request body must be a JSON object, got %s", tokenKind(tok))
			}
		}
		path := "$"
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			path = top.path
			if top.object {
				if top.key {
					if d, ok := tok.(json.Delim); !ok || d != '}' {
						k, _ := tok.(string)
						if _, dup := top.keys[k]; dup {
							return errorf(http.StatusBadRequest, "bad_request", "duplicate key %q in the JSON object at %s", k, top.path)
						}
						top.keys[k] = struct{}{}
						top.member = k
						top.key = false
						continue
					}
				} else {
					path = top.path + "." + top.member
					top.key = true
				}
			} else {
				path = top.path + "[]"
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if len(stack) >= MaxJSONDepth {
				return errorf(http.StatusBadRequest, "bad_request", "JSON body nested too deeply: more than %d levels of arrays and objects (at %s)", MaxJSONDepth, path)
			}
			obj := tok == json.Delim('{')
			f := frame{object: obj, path: path, key: obj}
			if obj {
				f.keys = map[string]struct{}{}
			}
			stack = append(stack, f)
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			done = len(stack) == 0
		}
	}
	if first {
		return errorf(http.StatusBadRequest, "bad_request", "Request body must be a JSON object, got an empty body")
	}
	return nil
}

// jsonSyntaxError turns a decoder error into a reason with the offset.
func jsonSyntaxError(err error, off int64) *apiError {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off = se.Offset
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	if errors.Is(err, io.ErrUnexpectedEOF) {
		msg = "the body ends inside a value"
	}
	return errorf(http.StatusBadRequest, "bad_request", "invalid JSON at byte %d: %s", off, msg)
}

// tokenKind names a JSON token's type for an error message.
func tokenKind(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		if v == '[' {
			return "an array"
		}
		return fmt.Sprintf("%q", string(v))
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", tok)
}
