package couch

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Seq is an update sequence exactly as the server sent it: a JSON number
// (PouchDB Server, CouchDB 1.x) or a JSON string (CouchDB 2+, opaque). The
// zero value (nil) means "from the beginning" and encodes as 0. Never parse
// or order CouchDB's strings; compare with Equal and use Int only for
// numeric seqs.
type Seq json.RawMessage

// SeqOf wraps raw JSON as a Seq, copying it. Empty input and JSON null give
// the zero Seq.
func SeqOf(raw []byte) Seq {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return Seq(bytes.Clone(raw))
}

// IsZero reports whether s means "from the beginning": nil, 0 or "0".
func (s Seq) IsZero() bool {
	switch string(s) {
	case "", "0", `"0"`, "null":
		return true
	}
	return false
}

// Equal reports whether two seqs are the same JSON value (byte-equal after
// trimming whitespace; 0 equals the zero Seq).
func (s Seq) Equal(o Seq) bool {
	if s.IsZero() || o.IsZero() {
		return s.IsZero() && o.IsZero()
	}
	return bytes.Equal(bytes.TrimSpace(s), bytes.TrimSpace(o))
}

// Int returns the seq as an integer when it is a JSON number (or a string
// holding only a decimal number); ok is false for CouchDB's opaque strings.
func (s Seq) Int() (n int64, ok bool) {
	if s.IsZero() {
		return 0, true
	}
	str := string(s)
	if len(str) >= 2 && str[0] == '"' {
		str = str[1 : len(str)-1]
	}
	n, err := strconv.ParseInt(str, 10, 64)
	return n, err == nil
}

// Param is the value to send as since= (or last-event-id): a number as
// is, a string without its JSON quotes.
func (s Seq) Param() string {
	if len(s) == 0 {
		return "0"
	}
	if s[0] == '"' {
		var str string
		if err := json.Unmarshal(s, &str); err == nil {
			return str
		}
	}
	return string(s)
}

// String returns the seq's JSON text ("0" for the zero Seq).
func (s Seq) String() string {
	if len(s) == 0 {
		return "0"
	}
	return string(s)
}

// MarshalJSON returns the raw JSON (0 for the zero Seq).
func (s Seq) MarshalJSON() ([]byte, error) {
	if len(s) == 0 {
		return []byte("0"), nil
	}
	return s, nil
}

// UnmarshalJSON stores a copy of data.
func (s *Seq) UnmarshalJSON(data []byte) error {
	*s = SeqOf(data)
	return nil
}
