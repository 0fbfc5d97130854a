package mango

import (
	"cmp"
	"strings"
	"sync"

	"golang.org/x/text/collate"
	"golang.org/x/text/language"
)

// Collation: CouchDB compares JSON values (mango_json:cmp, i.e.
// couch_ejson_compare) by type first, null < false < true < numbers <
// strings < arrays < objects; numbers by value; arrays element by element,
// then the shorter first; objects member by member in document order (the
// names as strings, then the values), then the one with fewer members
// first; strings by ICU's root collation (ucol_open(""), tertiary
// strength: "a" < "A" < "aa" < "b").
//
// Strings here go through golang.org/x/text/collate's root collation
// (CLDR root, the table ICU's root collation is built from), so they
// order as CouchDB orders them except where the Unicode/CLDR versions of
// the two tables differ (characters added to Unicode after x/text's
// tables, and ICU tailorings of the version CouchDB was built with). Two
// strings made of printable ASCII (U+0020..U+007E) are equal only when
// their bytes are, in both (no printable ASCII character is ignorable), so
// equality of such strings ($eq, $ne, $in, $nin, the common per-user
// selector) never consults the table.

var collators = sync.Pool{New: func() any { return collate.New(language.Und) }}

// cmpString compares two strings as CouchDB's ICU collation does.
func cmpString(a, b string) int {
	if a == b {
		return 0
	}
	c := collators.Get().(*collate.Collator)
	r := c.CompareString(a, b)
	collators.Put(c)
	return r
}

// printableASCII reports whether s is all U+0020..U+007E.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// eqString reports whether a and b collate equal.
func eqString(a, b string) bool {
	if a == b {
		return true
	}
	if printableASCII(a) && printableASCII(b) {
		return false
	}
	return cmpString(a, b) == 0
}

// typeRank is a value's place in CouchDB's collation of types.
func typeRank(v any) int {
	switch v := v.(type) {
	case nil:
		return 1
	case bool:
		if v {
			return 3
		}
		return 2
	case Number:
		return 4
	case string:
		return 5
	case []any:
		return 6
	default: // Object
		return 7
	}
}

// compare is mango_json:cmp: CouchDB's collation of two JSON values.
func compare(a, b any) int {
	ra, rb := typeRank(a), typeRank(b)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch a := a.(type) {
	case Number:
		return cmpNumber(a, b.(Number))
	case string:
		return cmpString(a, b.(string))
	case []any:
		b := b.([]any)
		for i := range min(len(a), len(b)) {
			if c := compare(a[i], b[i]); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(a), len(b))
	case Object:
		b := b.(Object)
		for i := range min(len(a), len(b)) {
			if c := cmpString(a[i].Key, b[i].Key); c != 0 {
				return c
			}
			if c := compare(a[i].Value, b[i].Value); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(a), len(b))
	}
	return 0 // null, false, true: the rank decides
}

// equal is compare(a, b) == 0 with the fast path for strings.
func equal(a, b any) bool {
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return eqString(x, y)
		}
		return false
	}
	return compare(a, b) == 0
}

// rawRank is a value's place in Erlang's term order (number < atom <
// tuple < list < binary), which mango_json:cmp_raw uses for _id.
func rawRank(v any) int {
	switch v.(type) {
	case Number:
		return 1
	case nil, bool:
		return 2
	case Object:
		return 3
	case []any:
		return 4
	default: // string
		return 5
	}
}

// atomText is null, true and false as Erlang atoms, which compare by
// their text.
func atomText(v any) string {
	switch v {
	case nil:
		return "null"
	case true:
		return "true"
	}
	return "false"
}

// compareRaw is mango_json:cmp_raw: Erlang's term order, strings byte by
// byte. CouchDB compares the _id field this way.
func compareRaw(a, b any) int {
	ra, rb := rawRank(a), rawRank(b)
	if ra != rb {
		return cmp.Compare(ra, rb)
	}
	switch a := a.(type) {
	case Number:
		return cmpNumber(a, b.(Number))
	case string:
		return strings.Compare(a, b.(string))
	case []any:
		b := b.([]any)
		for i := range min(len(a), len(b)) {
			if c := compareRaw(a[i], b[i]); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(a), len(b))
	case Object:
		// {Props}: 1-tuples of a list of {Key, Value} 2-tuples.
		b := b.(Object)
		for i := range min(len(a), len(b)) {
			if c := strings.Compare(a[i].Key, b[i].Key); c != 0 {
				return c
			}
			if c := compareRaw(a[i].Value, b[i].Value); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(a), len(b))
	}
	return strings.Compare(atomText(a), atomText(b))
}

// exactEqual is Erlang's =:= on decoded JSON (lists:member in $all): an
// integer never equals a float, strings and names equal byte for byte,
// objects member by member in order.
func exactEqual(a, b any) bool {
	switch a := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && a == y
	case Number:
		y, ok := b.(Number)
		return ok && a.Int == y.Int && (a.Int && a.I == y.I || !a.Int && a.F == y.F)
	case string:
		y, ok := b.(string)
		return ok && a == y
	case []any:
		y, ok := b.([]any)
		if !ok || len(a) != len(y) {
			return false
		}
		for i := range a {
			if !exactEqual(a[i], y[i]) {
				return false
			}
		}
		return true
	case Object:
		y, ok := b.(Object)
		if !ok || len(a) != len(y) {
			return false
		}
		for i := range a {
			if a[i].Key != y[i].Key || !exactEqual(a[i].Value, y[i].Value) {
				return false
			}
		}
		return true
	}
	return false
}

// termEqual is Erlang's == (numbers by value, the rest exactly): $all's
// [List] form compares the list so.
func termEqual(a, b any) bool {
	if x, ok := a.(Number); ok {
		y, ok := b.(Number)
		return ok && cmpNumber(x, y) == 0
	}
	switch a := a.(type) {
	case []any:
		y, ok := b.([]any)
		if !ok || len(a) != len(y) {
			return false
		}
		for i := range a {
			if !termEqual(a[i], y[i]) {
				return false
			}
		}
		return true
	case Object:
		y, ok := b.(Object)
		if !ok || len(a) != len(y) {
			return false
		}
		for i := range a {
			if a[i].Key != y[i].Key || !termEqual(a[i].Value, y[i].Value) {
				return false
			}
		}
		return true
	}
	return exactEqual(a, b)
}
