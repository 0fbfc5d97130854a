package couch

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// jsonStream reads a JSON document from a stream one value at a time
// without decoding it: values come back as slices of its buffers, checked
// for well-formedness by a hand-written scanner (a single pass, no
// reflection), which is several times cheaper than encoding/json's
// Decoder for documents that are only passed on. A buffer is never
// reused: slices returned earlier stay valid (they keep their buffer alive
// until dropped), so document bodies need no copy.
//
// Read buffers follow the stream: each is twice what the last read
// delivered, from jsonMinChunk up to jsonChunk, so a stream that delivers
// fast reads 64 KiB at a time while an idle one (a continuous _changes
// feed waiting for a change or a heartbeat) holds only a small buffer.
type jsonStream struct {
	r     io.Reader
	buf   []byte // buf[off:] is unread
	off   int
	err   error // the reader's error once it returned one (io.EOF at the end)
	chunk int   // the next read buffer's size (0: jsonMinChunk)
	// max bounds one value (0: no bound); what names it in the error.
	max  int64
	what string
}

const (
	jsonMinChunk = 256      // the smallest read buffer
	jsonChunk    = 64 << 10 // the largest read buffer, unless a value needs more
	jsonMaxDepth = 10000    // nesting limit, as encoding/json
)

// errIncomplete: the buffer ends inside the value.
var errIncomplete = errors.New("incomplete JSON value")

func newJSONStream(r io.Reader) *jsonStream { return &jsonStream{r: r} }

// newLimitedJSONStream is a stream whose values (what: "_changes row",
// "document") may be at most max bytes each: a longer one gives a
// *TooLargeError as soon as that many bytes of it are buffered.
func newLimitedJSONStream(r io.Reader, max int64, what string) *jsonStream {
	return &jsonStream{r: r, max: max, what: what}
}

// fill makes more bytes available, keeping buf[keep:] (moved to the start
// of a new buffer). It returns false when the stream has ended.
func (s *jsonStream) fill(keep int) bool {
	if s.err != nil {
		return false
	}
	rest := s.buf[keep:]
	if s.chunk == 0 {
		s.chunk = jsonMinChunk
	}
	size := max(s.chunk, 2*len(rest))
	if s.max > 0 {
		// Never more than the limit needs: a value that does not fit is
		// an error anyway (value checks before it fills).
		size = max(min(size, int(min(s.max, 1<<40))+jsonChunk), len(rest)+jsonMinChunk)
	}
	nb := make([]byte, len(rest), size)
	copy(nb, rest)
	s.buf, s.off = nb, s.off-keep
	for {
		n, err := s.r.Read(nb[len(nb):cap(nb)])
		s.buf = nb[:len(nb)+n]
		if n > 0 {
			s.chunk = min(max(2*n, jsonMinChunk), jsonChunk)
		}
		if err != nil {
			s.err = err
			return n > 0
		}
		if n > 0 {
			return true
		}
	}
}

// atRest reports whether nothing but whitespace is left unread in the
// buffer (what the connection holds beyond it is not looked at).
func (s *jsonStream) atRest() bool {
	return skipWS(s.buf, s.off) >= len(s.buf)
}

func (s *jsonStream) readErr() error {
	if s.err == nil || s.err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return s.err
}

// peek skips whitespace and returns the next byte without consuming it.
func (s *jsonStream) peek() (byte, error) {
	for {
		s.off = skipWS(s.buf, s.off)
		if s.off < len(s.buf) {
			return s.buf[s.off], nil
		}
		if !s.fill(s.off) {
			return 0, s.readErr()
		}
	}
}

// delim consumes the next non-space byte, which must be c.
func (s *jsonStream) delim(c byte) error {
	got, err := s.peek()
	if err != nil {
		return err
	}
	if got != c {
		return fmt.Errorf("expected %q, found %q at byte %d of the buffer", c, got, s.off)
	}
	s.off++
	return nil
}

// value returns the next complete JSON value (checked) and consumes it.
func (s *jsonStream) value() ([]byte, error) {
	if _, err := s.peek(); err != nil {
		return nil, err
	}
	for {
		end, err := scanValue(s.buf, s.off, 0)
		if err == errIncomplete {
			if s.max > 0 && int64(len(s.buf)-s.off) > s.max {
				return nil, &TooLargeError{What: s.what, Limit: s.max}
			}
			if !s.fill(s.off) {
				return nil, s.readErr()
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		v := s.buf[s.off:end:end]
		s.off = end
		return v, nil
	}
}

// more reports whether the array being read has another element,
// consuming the separating comma; false after consuming the closing ']'.
// first is true before the first element.
func (s *jsonStream) more(first bool) (bool, error) {
	c, err := s.peek()
	if err != nil {
		return false, err
	}
	switch {
	case c == ']':
		s.off++
		return false, nil
	case first:
		return true, nil
	case c == ',':
		s.off++
		return true, nil
	}
	return false, fmt.Errorf("expected ',' or ']', found %q", c)
}

// elements reads the JSON array that comes next, calling fn with each
// element (checked, a slice of the stream's buffers).
func (s *jsonStream) elements(fn func(elem []byte) error) error {
	if err := s.delim('['); err != nil {
		return err
	}
	for first := true; ; first = false {
		more, err := s.more(first)
		if err != nil || !more {
			return err
		}
		v, err := s.value()
		if err != nil {
			return err
		}
		if err := fn(v); err != nil {
			return err
		}
	}
}

// key reads an object's next key (consuming the ':' after it), or reports
// the end of the object (consuming the '}'). first is true before the
// first member.
func (s *jsonStream) key(first bool) (string, bool, error) {
	c, err := s.peek()
	if err != nil {
		return "", false, err
	}
	switch {
	case c == '}':
		s.off++
		return "", false, nil
	case !first && c == ',':
		s.off++
	case !first:
		return "", false, fmt.Errorf("expected ',' or '}', found %q", c)
	}
	if c, err = s.peek(); err != nil {
		return "", false, err
	}
	if c != '"' {
		return "", false, fmt.Errorf("expected an object key, found %q", c)
	}
	raw, err := s.value()
	if err != nil {
		return "", false, err
	}
	k, err := unquote(raw)
	if err != nil {
		return "", false, err
	}
	return k, true, s.delim(':')
}

// unquote returns the content of a checked JSON string.
func unquote(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", fmt.Errorf("not a string: %.100s", raw)
	}
	ascii := true
	for _, c := range raw[1 : len(raw)-1] {
		if c == '\\' {
			var s string
			err := json.Unmarshal(raw, &s)
			return s, err
		}
		ascii = ascii && c < utf8.RuneSelf
	}
	if !ascii && !utf8.Valid(raw[1:len(raw)-1]) {
		// As encoding/json: invalid UTF-8 becomes U+FFFD, so a string
		// reads the same here as anywhere else (and as it is written).
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	return string(raw[1 : len(raw)-1]), nil
}

// strPlain marks the bytes that may appear unescaped in a JSON string
// without ending it.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// scanValue checks the JSON value starting at b[i] (after optional
// whitespace) and returns the index just past it; errIncomplete when b
// ends first.
func scanValue(b []byte, i, depth int) (int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return i, errIncomplete
	}
	switch c := b[i]; c {
	case '"':
		return scanString(b, i)
	case '{', '[':
		if depth >= jsonMaxDepth {
			return i, errors.New("JSON nested too deeply")
		}
		closing := byte('}')
		if c == '[' {
			closing = ']'
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			return i, errIncomplete
		}
		if b[i] == closing {
			return i + 1, nil
		}
		for {
			var err error
			if c == '{' {
				if i = skipWS(b, i); i >= len(b) {
					return i, errIncomplete
				}
				if b[i] != '"' {
					return i, fmt.Errorf("invalid character %q looking for an object key", b[i])
				}
				if i, err = scanString(b, i); err != nil {
					return i, err
				}
				if i = skipWS(b, i); i >= len(b) {
					return i, errIncomplete
				}
				if b[i] != ':' {
					return i, fmt.Errorf("invalid character %q after an object key", b[i])
				}
				i++
			}
			if i, err = scanValue(b, i, depth+1); err != nil {
				return i, err
			}
			if i = skipWS(b, i); i >= len(b) {
				return i, errIncomplete
			}
			switch b[i] {
			case ',':
				i++
			case closing:
				return i + 1, nil
			default:
				return i, fmt.Errorf("invalid character %q after a value", b[i])
			}
		}
	case 't':
		return scanLiteral(b, i, "true")
	case 'f':
		return scanLiteral(b, i, "false")
	case 'n':
		return scanLiteral(b, i, "null")
	default:
		if c == '-' || '0' <= c && c <= '9' {
			return scanNumber(b, i)
		}
		return i, fmt.Errorf("invalid character %q looking for a value", c)
	}
}

// SWAR constants: a byte 0x01 and 0x80 in every lane of a uint64.
const (
	lanes01 = 0x0101010101010101
	lanes80 = 0x8080808080808080
)

// plain8 reports whether none of the 8 bytes in x ends or escapes a
// string or is a control character.
func plain8(x uint64) bool {
	q := x ^ (lanes01 * '"')
	bs := x ^ (lanes01 * '\\')
	return ((x-lanes01*0x20)&^x|(q-lanes01)&^q|(bs-lanes01)&^bs)&lanes80 == 0
}

func scanString(b []byte, i int) (int, error) {
	i++
	for {
		for i+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		if i >= len(b) {
			return i, errIncomplete
		}
		switch b[i] {
		case '"':
			return i + 1, nil
		case '\\':
			if i+1 >= len(b) {
				return i, errIncomplete
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, errIncomplete
				}
				for _, h := range b[i+2 : i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return i, fmt.Errorf("invalid \\u escape in a string")
					}
				}
				i += 6
			default:
				return i, fmt.Errorf("invalid escape %q in a string", b[i+1])
			}
		default:
			return i, fmt.Errorf("control character %#x in a string", b[i])
		}
	}
}

func scanLiteral(b []byte, i int, lit string) (int, error) {
	for k := 0; k < len(lit); k++ {
		if i+k >= len(b) {
			return i, errIncomplete
		}
		if b[i+k] != lit[k] {
			return i, fmt.Errorf("invalid literal, expected %s", lit)
		}
	}
	return i + len(lit), nil
}

// scanNumber checks a number's grammar. A number running to the end of b
// is incomplete: more digits may follow.
func scanNumber(b []byte, i int) (int, error) {
	digits := func(i int) (int, int) {
		s := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		return i, i - s
	}
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, errIncomplete
	}
	if b[i] == '0' {
		i++
	} else {
		var n int
		if i, n = digits(i); n == 0 {
			if i >= len(b) {
				return i, errIncomplete
			}
			return i, errors.New("invalid number")
		}
	}
	if i < len(b) && b[i] == '.' {
		var n int
		if i, n = digits(i + 1); n == 0 {
			if i >= len(b) {
				return i, errIncomplete
			}
			return i, errors.New("invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		var n int
		if i, n = digits(i); n == 0 {
			if i >= len(b) {
				return i, errIncomplete
			}
			return i, errors.New("invalid number")
		}
	}
	if i >= len(b) {
		return i, errIncomplete
	}
	return i, nil
}

// objectMembers calls fn for each member of the checked JSON object obj
// (keys still quoted); values are slices of obj.
func objectMembers(obj []byte, fn func(key, val []byte) error) error {
	return jsonItems(obj, '{', '}', "object", func(i int) (int, error) {
		kEnd := skipValue(obj, i)
		j := skipWS(obj, kEnd)
		if j >= len(obj) || obj[j] != ':' {
			return j, fmt.Errorf("object malformed: %.100s", obj)
		}
		vStart := skipWS(obj, j+1)
		vEnd := skipValue(obj, vStart)
		return vEnd, fn(obj[i:kEnd], obj[vStart:vEnd])
	})
}

// arrayElements calls fn for each element of the checked JSON array arr.
func arrayElements(arr []byte, fn func(val []byte) error) error {
	return jsonItems(arr, '[', ']', "array", func(i int) (int, error) {
		end := skipValue(arr, i)
		return end, fn(arr[i:end])
	})
}

// jsonItems walks the checked JSON object or array b (what names it), which
// opens with open and closes with closing: item is called at the start of
// each member or element and returns where it ends.
func jsonItems(b []byte, open, closing byte, what string, item func(i int) (int, error)) error {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != open {
		return fmt.Errorf("not an %s: %.100s", what, b)
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) {
			return fmt.Errorf("%s truncated: %.100s", what, b)
		}
		switch b[i] {
		case closing:
			return nil
		case ',':
			i++
			continue
		}
		var err error
		if i, err = item(i); err != nil {
			return err
		}
	}
}
