package couch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/iotest"
)

// jsonCases are values scanValue must accept or reject exactly as
// encoding/json does.
var jsonCases = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e+10`, `-12.25E-3`, `true`, `false`, `null`,
	`{"a":1,"b":[1,2,{"c":"d"}],"e":{"f":null}}`,
	`{"_id":"a\"b\\c\/d\b\f\n\r\t\u00e9\uD83D\uDE00","x":"ü€𝄞"}`,
	` { "a" : [ 1 , 2 ] } `,
	`[[[[[[[[[[]]]]]]]]]]`,
	`{"pad":"` + strings.Repeat("x", 100000) + `"}`,
	// invalid
	`{`, `[`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[1 2]`, `{1:2}`, `{"a":1 "b":2}`,
	`"abc`, `"a\x"`, `"a\u12"`, `"a\u12g4"`, "\"a\x01b\"", `01`, `-`, `1.`, `1e`, `.5`, `+1`,
	`tru`, `nul`, `falsy`, `True`, `{"a":1}}`, `]`, `}`, `'a'`, `[1,2`, `{"a":[}`,
}

func TestScanValue(t *testing.T) {
	for _, c := range jsonCases {
		want := json.Valid([]byte(c))
		// A complete buffer: the value must span everything but trailing space.
		end, err := scanValue([]byte(c), 0, 0)
		got := err == nil && skipWS([]byte(c), end) == len(c)
		if err == errIncomplete {
			// A number at the very end may continue: the stream decides.
			padded := []byte(c + " ")
			end, err = scanValue(padded, 0, 0)
			got = err == nil && skipWS(padded, end) == len(padded)
		}
		if got != want {
			t.Errorf("%.60q: scanValue accepts %v (end %d, %v), json.Valid %v", c, got, end, err, want)
		}
	}
}

// TestJSONStreamValues reads a sequence of values from readers that give
// one byte at a time and in halves, as a socket may.
func TestJSONStreamValues(t *testing.T) {
	var valid []string
	for _, c := range jsonCases {
		if json.Valid([]byte(c)) {
			valid = append(valid, c)
		}
	}
	doc := "[" + strings.Join(valid, ",") + "]"
	readers := []struct {
		name string
		r    func() *jsonStream
	}{
		{"whole", func() *jsonStream { return newJSONStream(strings.NewReader(doc)) }},
		{"one byte", func() *jsonStream { return newJSONStream(iotest.OneByteReader(strings.NewReader(doc))) }},
		{"halves", func() *jsonStream { return newJSONStream(iotest.HalfReader(strings.NewReader(doc))) }},
	}
	for _, rd := range readers {
		t.Run(rd.name, func(t *testing.T) {
			js := rd.r()
			if err := js.delim('['); err != nil {
				t.Fatal(err)
			}
			var got [][]byte
			for first := true; ; first = false {
				more, err := js.more(first)
				if err != nil {
					t.Fatal(err)
				}
				if !more {
					break
				}
				v, err := js.value()
				if err != nil {
					t.Fatalf("value %d: %v", len(got), err)
				}
				got = append(got, v)
			}
			// Earlier slices stay intact while later values are read.
			if len(got) != len(valid) {
				t.Fatalf("%d values, want %d", len(got), len(valid))
			}
			for i, v := range got {
				if string(v) != strings.TrimSpace(valid[i]) {
					t.Errorf("value %d = %.60q, want %.60q", i, v, valid[i])
				}
			}
		})
	}
}

func TestReadBulkGetErrors(t *testing.T) {
	stop := errors.New("stop")
	ok := `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-x"}}]}]}`
	tests := []struct {
		name, body string
		fnErr      error
		want       string // substring of the error; "" for none
		docs       int
	}{
		{name: "ok", body: ok, docs: 1},
		{name: "other keys first", body: `{"x":[1,{"y":2}],"results":[]}`, docs: 0},
		{name: "missing and error entries", body: `{"results":[{"id":"a","docs":[{"missing":"1-x"},{},{"error":{"id":"a"}},{"ok":{"_id":"a","_rev":"2-y"}}]}]}`, docs: 1},
		{name: "no results", body: `{"rows":[]}`, want: `no "results"`},
		{name: "truncated", body: ok[:40], want: "unexpected EOF"},
		{name: "malformed doc", body: `{"results":[{"id":"a","docs":[{"ok":{"_id":"a","_rev":"1-x",}}]}]}`, want: "invalid character"},
		{name: "doc without rev", body: `{"results":[{"id":"a","docs":[{"ok":{"_id":"a"}}]}]}`, want: "without _id or _rev"},
		{name: "not an object", body: `[1]`, want: "expected"},
		{name: "callback error returned as is", body: ok, fnErr: stop, want: "stop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			err := readBulkGet(newJSONStream(strings.NewReader(tc.body)), func(Doc) error { n++; return tc.fnErr })
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("err %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err %v, want %q", err, tc.want)
			case tc.fnErr != nil && !errors.Is(err, tc.fnErr):
				t.Fatalf("err %v is not the callback's", err)
			}
			if tc.want == "" && n != tc.docs {
				t.Errorf("%d docs, want %d", n, tc.docs)
			}
		})
	}
}

func FuzzScanValue(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := json.Valid(b)
		padded := append(b[:len(b):len(b)], ' ')
		end, err := scanValue(padded, 0, 0)
		got := err == nil && skipWS(padded, end) == len(padded)
		if got != want {
			t.Fatalf("%q: scanValue %v (end %d, %v), json.Valid %v", b, got, end, err, want)
		}
	})
}

// TestObjectMembersArrayElements walks objects and arrays member by member
// and element by element, and names what is wrong with a bad one.
func TestObjectMembersArrayElements(t *testing.T) {
	t.Parallel()
	stop := errors.New("stop")
	tests := []struct {
		name, in string
		array    bool
		stopAt   string // fn fails at this key or element
		want     string // the items seen, then "|" and the error
	}{
		{"object", ` { "a" : 1 , "b":[1,{"c":2}] ,"d":"x"} `, false, "", `"a"=1 "b"=[1,{"c":2}] "d"="x" |<nil>`},
		{"empty object", `{}`, false, "", `|<nil>`},
		{"array", `[1, "two" ,{"three":3}, [4]]`, true, "", `1 "two" {"three":3} [4] |<nil>`},
		{"empty array", ` [ ] `, true, "", `|<nil>`},
		{"not an object", `[1]`, false, "", `|not an object: [1]`},
		{"not an array", `{}`, true, "", `|not an array: {}`},
		{"object truncated", `{"a":1,`, false, "", `"a"=1 |object truncated: {"a":1,`},
		{"array truncated", `[1`, true, "", `1 |array truncated: [1`},
		{"object malformed", `{"a" 1}`, false, "", `|object malformed: {"a" 1}`},
		{"fn fails in object", `{"a":1,"b":2,"c":3}`, false, `"b"`, `"a"=1 "b"=2 |stop`},
		{"fn fails in array", `[1,2,3]`, true, `2`, `1 2 |stop`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var seen []string
			var err error
			if tc.array {
				err = arrayElements([]byte(tc.in), func(v []byte) error {
					seen = append(seen, string(v))
					if string(v) == tc.stopAt {
						return stop
					}
					return nil
				})
			} else {
				err = objectMembers([]byte(tc.in), func(k, v []byte) error {
					seen = append(seen, string(k)+"="+string(v))
					if string(k) == tc.stopAt {
						return stop
					}
					return nil
				})
			}
			got := ""
			for _, s := range seen {
				got += s + " "
			}
			got += "|" + fmt.Sprint(err)
			if got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
