package mango

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// A decoded JSON value is one of: nil (null), bool, Number, string, []any
// (an array) or Object. Objects keep their members in document order and
// their duplicate keys, as jiffy (CouchDB's decoder) does: a field lookup
// takes the first member of a name, and objects compare member by member.

// Object is a JSON object, its members in document order.
type Object []Member

// Member is one name/value pair of an Object.
type Member struct {
	Key   string
	Value any
}

// Number is a JSON number: an integer (Int set, in I) when its text has
// no fraction or exponent and fits in 64 bits, a float (F) otherwise, as
// jiffy decodes them (1 is an integer, 1.0 and 1e2 are floats; an
// integer beyond 64 bits, a bignum in Erlang, is a float here).
type Number struct {
	I   int64
	F   float64
	Int bool
}

// ErrBadJSON is the error of Decode for text that is not one JSON value.
var ErrBadJSON = errors.New("mango: bad JSON")

// Decode decodes one JSON value (a document) into the form Match takes.
func Decode(data []byte) (any, error) {
	d := decoder{b: data}
	d.space()
	v, err := d.value(0)
	if err != nil {
		return nil, err
	}
	d.space()
	if d.i != len(d.b) {
		return nil, d.errf("text after the value")
	}
	return v, nil
}

// maxDepth bounds the nesting Decode accepts (CouchDB's own documents
// never come close).
const maxDepth = 1000

type decoder struct {
	b []byte
	i int
}

func (d *decoder) errf(format string, a ...any) error {
	return fmt.Errorf("%w: at byte %d: %s", ErrBadJSON, d.i, fmt.Sprintf(format, a...))
}

func (d *decoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) literal(s string, v any) (any, error) {
	if len(d.b)-d.i < len(s) || string(d.b[d.i:d.i+len(s)]) != s {
		return nil, d.errf("invalid literal")
	}
	d.i += len(s)
	return v, nil
}

func (d *decoder) value(depth int) (any, error) {
	if d.i >= len(d.b) {
		return nil, d.errf("unexpected end")
	}
	if depth > maxDepth {
		return nil, d.errf("nested too deep")
	}
	switch c := d.b[d.i]; {
	case c == '{':
		d.i++
		obj := Object{}
		d.space()
		if d.i < len(d.b) && d.b[d.i] == '}' {
			d.i++
			return obj, nil
		}
		for {
			d.space()
			if d.i >= len(d.b) || d.b[d.i] != '"' {
				return nil, d.errf("expected a member name")
			}
			k, err := d.str()
			if err != nil {
				return nil, err
			}
			d.space()
			if d.i >= len(d.b) || d.b[d.i] != ':' {
				return nil, d.errf("expected ':'")
			}
			d.i++
			d.space()
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			obj = append(obj, Member{k, v})
			d.space()
			if d.i < len(d.b) && d.b[d.i] == ',' {
				d.i++
				continue
			}
			if d.i < len(d.b) && d.b[d.i] == '}' {
				d.i++
				return obj, nil
			}
			return nil, d.errf("expected ',' or '}'")
		}
	case c == '[':
		d.i++
		arr := []any{}
		d.space()
		if d.i < len(d.b) && d.b[d.i] == ']' {
			d.i++
			return arr, nil
		}
		for {
			d.space()
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
			d.space()
			if d.i < len(d.b) && d.b[d.i] == ',' {
				d.i++
				continue
			}
			if d.i < len(d.b) && d.b[d.i] == ']' {
				d.i++
				return arr, nil
			}
			return nil, d.errf("expected ',' or ']'")
		}
	case c == '"':
		return d.str()
	case c == 't':
		return d.literal("true", true)
	case c == 'f':
		return d.literal("false", false)
	case c == 'n':
		return d.literal("null", nil)
	case c == '-' || c >= '0' && c <= '9':
		return d.number()
	default:
		return nil, d.errf("unexpected %q", c)
	}
}

// str decodes a string at d.i (its opening quote).
func (d *decoder) str() (string, error) {
	start := d.i
	d.i++
	plain := true
	for d.i < len(d.b) {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			if plain {
				return string(d.b[start+1 : d.i-1]), nil
			}
			var s string
			if err := json.Unmarshal(d.b[start:d.i], &s); err != nil {
				return "", fmt.Errorf("%w: %w", ErrBadJSON, err)
			}
			return s, nil
		case c == '\\':
			plain = false
			d.i += 2
		case c < 0x20:
			return "", d.errf("control character in a string")
		case c >= utf8.RuneSelf:
			plain = false // let encoding/json check (and replace) bad UTF-8
			d.i++
		default:
			d.i++
		}
	}
	return "", d.errf("unterminated string")
}

func (d *decoder) number() (any, error) {
	start := d.i
	isInt := true
	for d.i < len(d.b) {
		c := d.b[d.i]
		if c >= '0' && c <= '9' || c == '-' || c == '+' {
			d.i++
			continue
		}
		if c == '.' || c == 'e' || c == 'E' {
			isInt = false
			d.i++
			continue
		}
		break
	}
	text := string(d.b[start:d.i])
	if !json.Valid(d.b[start:d.i]) {
		return nil, d.errf("bad number %q", text)
	}
	if isInt {
		if i, err := strconv.ParseInt(text, 10, 64); err == nil {
			return Number{I: i, Int: true}, nil
		}
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, d.errf("bad number %q", text)
	}
	if math.IsInf(f, 0) {
		return nil, d.errf("number out of range %q", text)
	}
	return Number{F: f}, nil
}

// float is n as a float64.
func (n Number) float() float64 {
	if n.Int {
		return float64(n.I)
	}
	return n.F
}

// cmpNumber compares two numbers by value (1 == 1.0), exactly.
func cmpNumber(a, b Number) int {
	switch {
	case a.Int && b.Int:
		return cmpOrdered(a.I, b.I)
	case !a.Int && !b.Int:
		return cmpOrdered(a.F, b.F)
	case a.Int:
		return -cmpIntFloat(b.F, a.I)
	default:
		return cmpIntFloat(a.F, b.I)
	}
}

// cmpIntFloat compares f with i exactly (not through float64(i), which
// rounds beyond 2^53).
func cmpIntFloat(f float64, i int64) int {
	if f < -(1 << 63) {
		return -1
	}
	if f >= 1<<63 {
		return 1
	}
	t := math.Trunc(f)
	if c := cmpOrdered(int64(t), i); c != 0 {
		return c
	}
	return cmpOrdered(f, t) // the fraction decides
}

func cmpOrdered[T int64 | float64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Encode writes a decoded value back as JSON (members in their order).
func Encode(v any) []byte { return appendJSON(nil, v) }

func appendJSON(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...)
	case bool:
		return strconv.AppendBool(b, v)
	case Number:
		if v.Int {
			return strconv.AppendInt(b, v.I, 10)
		}
		return strconv.AppendFloat(b, v.F, 'g', -1, 64)
	case string:
		s, _ := json.Marshal(v)
		return append(b, s...)
	case []any:
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, x)
		}
		return append(b, ']')
	case Object:
		b = append(b, '{')
		for i, m := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSON(b, m.Key)
			b = append(b, ':')
			b = appendJSON(b, m.Value)
		}
		return append(b, '}')
	}
	return append(b, "null"...)
}

// text is v as JSON for an error message, cut at 100 bytes.
func text(v any) string {
	b := appendJSON(nil, v)
	if len(b) > 100 {
		return string(b[:100]) + "..."
	}
	return string(b)
}
