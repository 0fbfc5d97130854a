// Package mango evaluates CouchDB Mango selectors on the node: the rules
// of CouchDB 3.4.3's mango_selector (normalize/1, then match/2) over a JSON
// document, so that jobs replicating a selector can read a shared feed of
// their source and filter its rows here instead of each asking the server
// for a filtered feed of its own (filter=_selector).
//
// Parse normalizes a selector as CouchDB does (implicit $and, fields pushed
// down to their conditions, negations pushed down with De Morgan's laws)
// and compiles it; Match evaluates it. What differs from CouchDB and why:
//
//   - Strings are collated by golang.org/x/text/collate's root collation
//     (CLDR root) where CouchDB uses ICU's root collator: the same order but
//     for characters whose weights differ between the two tables' Unicode
//     versions (see collate.go). The _id field is compared byte by byte,
//     as CouchDB does.
//   - $regex is Go's RE2, CouchDB's is PCRE (Erlang's re, on bytes): a
//     pattern RE2 cannot compile (back-references, look-around) makes
//     Parse fail with ErrUnsupported, and "." matches a UTF-8 character
//     here where PCRE without the unicode option matches a byte.
//   - Integers beyond 64 bits (bignums in Erlang) are floats here: $mod
//     never matches them.
//   - Where CouchDB throws while matching (a field name with an empty part
//     such as "a..b", $mod with divisor 0, a $nor that normalization left
//     below a negated $elemMatch), Parse fails with ErrUnsupported: the
//     caller leaves such a selector to the server.
//
// A selector that fails with ErrUnsupported is valid to CouchDB; one that
// fails with ErrInvalid CouchDB rejects too.
package mango

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var (
	// ErrInvalid is a selector CouchDB rejects too (its error names the
	// operator or field).
	ErrInvalid = errors.New("mango: invalid selector")
	// ErrUnsupported is a selector CouchDB accepts that the node does not
	// evaluate as CouchDB would: leave it to the server (filter=_selector).
	ErrUnsupported = errors.New("mango: selector not evaluated on the node")
)

// Selector is a compiled selector. It is immutable and safe for
// concurrent use.
type Selector struct {
	root *node // nil: the empty selector, which matches everything
}

// Parse normalizes and compiles a selector (a JSON object).
func Parse(selector []byte) (*Selector, error) {
	v, err := Decode(selector)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return ParseValue(v)
}

// ParseValue is Parse of a decoded selector.
func ParseValue(v any) (*Selector, error) {
	obj, ok := v.(Object)
	if !ok {
		return nil, fmt.Errorf("%w: expected a JSON object, not %s", ErrInvalid, text(v))
	}
	if len(obj) == 0 {
		return &Selector{}, nil
	}
	n, err := Normalize(obj, JSONForm)
	if err != nil {
		return nil, err
	}
	root, err := compile(n)
	if err != nil {
		return nil, err
	}
	return &Selector{root: root}, nil
}

// MustParse is Parse that panics on an error (tests, constants).
func MustParse(selector string) *Selector {
	s, err := Parse([]byte(selector))
	if err != nil {
		panic(err)
	}
	return s
}

// Match reports whether doc (a decoded document: an Object) matches.
func (s *Selector) Match(doc any) bool {
	if s.root == nil {
		return true
	}
	if _, ok := doc.(Object); !ok {
		return false
	}
	return match(s.root, doc, false)
}

// MatchJSON decodes doc and matches it.
func (s *Selector) MatchJSON(doc []byte) (bool, error) {
	v, err := Decode(doc)
	if err != nil {
		return false, err
	}
	return s.Match(v), nil
}

// --- compiled form and matching (match/3) ---

type opcode uint8

const (
	opAnd opcode = iota
	opOr
	opNot
	opField
	opEq
	opNe
	opLt
	opLte
	opGt
	opGte
	opIn
	opNin
	opAll
	opExists
	opType
	opMod
	opRegex
	opSize
	opElemMatch
	opAllMatch
	opKeyMapMatch
	opBeginsWith
	opDefault
)

var opcodes = map[string]opcode{"$and": opAnd, "$or": opOr, "$not": opNot, "$eq": opEq, "$ne": opNe,
	"$lt": opLt, "$lte": opLte, "$gt": opGt, "$gte": opGte, "$in": opIn, "$nin": opNin, "$all": opAll,
	"$exists": opExists, "$type": opType, "$mod": opMod, "$regex": opRegex, "$size": opSize,
	"$elemMatch": opElemMatch, "$allMatch": opAllMatch, "$keyMapMatch": opKeyMapMatch,
	"$beginsWith": opBeginsWith, "$default": opDefault}

// node is one operator of a compiled selector. Its operand is in arg
// (the value compared, the list of $in/$nin/$all, the bool of $exists,
// the string of $type/$beginsWith, the *regexp.Regexp of $regex): a node
// is 96 bytes, and a per-user selector job holds two for as long as it
// lives.
type node struct {
	op   opcode
	id   bool    // the field is _id: compared byte by byte (cmp_raw)
	kids []*node // $and, $or
	kid  *node   // $not, $elemMatch, $allMatch, $keyMapMatch; a field's condition
	path []string
	arg  any
	d, r int64 // $mod's divisor and remainder, $size's length
}

// list is the operand of $in, $nin and $all.
func (n *node) list() []any { l, _ := n.arg.([]any); return l }

// flag is the operand of $exists.
func (n *node) flag() bool { b, _ := n.arg.(bool); return b }

// str is the operand of $type and $beginsWith.
func (n *node) str() string { s, _ := n.arg.(string); return s }

func compile(v any) (*node, error) {
	obj := v.(Object)
	k, a := obj[0].Key, obj[0].Value
	op, isOp := opcodes[k]
	if !isOp {
		if strings.HasPrefix(k, "$") { // a $nor normalization left in place
			return nil, fmt.Errorf("%w: %s below a negated $elemMatch, $allMatch or $keyMapMatch", ErrUnsupported, k)
		}
		n := &node{op: opField, id: k == "_id"}
		if k != "" {
			p, err := ParseField(k)
			if err != nil {
				return nil, err
			}
			n.path = p
		}
		var err error
		n.kid, err = compile(a)
		return n, err
	}
	n := &node{op: op}
	switch op {
	case opAnd, opOr:
		for _, x := range a.([]any) {
			kid, err := compile(x)
			if err != nil {
				return nil, err
			}
			n.kids = append(n.kids, kid)
		}
	case opNot, opElemMatch, opAllMatch, opKeyMapMatch:
		if o := a.(Object); len(o) == 0 {
			// {$elemMatch: {}} and the like normalize to $eq {}; an empty
			// object left here is the empty selector: matches anything.
			n.kid = &node{op: opAnd}
			break
		}
		kid, err := compile(a)
		if err != nil {
			return nil, err
		}
		n.kid = kid
	case opEq, opNe, opLt, opLte, opGt, opGte:
		n.arg = a
	case opIn, opNin, opAll:
		n.arg = a.([]any)
	case opExists:
		n.arg = a.(bool)
	case opType, opBeginsWith:
		n.arg = a.(string)
	case opMod:
		l := a.([]any)
		n.d, n.r = l[0].(Number).I, l[1].(Number).I
		if n.d == 0 {
			return nil, fmt.Errorf("%w: $mod by 0 (CouchDB fails the request)", ErrUnsupported)
		}
	case opRegex:
		re, err := regexp.Compile(a.(string))
		if err != nil {
			return nil, fmt.Errorf("%w: $regex %s: %w", ErrUnsupported, text(a), err)
		}
		n.arg = re
	case opSize:
		n.d = a.(Number).I
	}
	return n, nil
}

// ParseField splits a field name at its unescaped dots
// (mango_util:parse_field/1): "a.b" is [a b], "a\.b" is [a.b]; every
// backslash is then dropped. A name with an empty part ("a..b", "") is an
// ErrUnsupported: CouchDB fails the request when it matches with one
// (internal/replicate, which hashes the selector, rejects it).
func ParseField(f string) ([]string, error) {
	var parts []string
	if !strings.Contains(f, `\`) {
		parts = strings.Split(f, ".")
	} else {
		start := 0
		for i := 0; i < len(f); i++ {
			if f[i] == '.' && (i == 0 || f[i-1] != '\\') {
				parts = append(parts, f[start:i])
				start = i + 1
			}
		}
		parts = append(parts, f[start:])
		for i, p := range parts {
			if p != "" {
				parts[i] = strings.ReplaceAll(p, `\`, "")
			}
		}
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%w: invalid field name %q (CouchDB fails the request)", ErrUnsupported, f)
		}
	}
	return parts, nil
}

type lookup uint8

const (
	found lookup = iota
	notFound
	badPath
)

// getField is mango_doc:get_field/2.
func getField(v any, path []string) (any, lookup) {
	for _, name := range path {
		switch x := v.(type) {
		case Object:
			i := 0
			for i < len(x) && x[i].Key != name {
				i++
			}
			if i == len(x) {
				return nil, notFound
			}
			v = x[i].Value
		case []any:
			pos, err := strconv.Atoi(name)
			if err != nil || pos < 0 || pos >= len(x) {
				return nil, badPath
			}
			v = x[pos]
		default:
			return nil, badPath
		}
	}
	return v, found
}

func cmpWith(raw bool, a, b any) int {
	if raw {
		return compareRaw(a, b)
	}
	return compare(a, b)
}

func eqWith(raw bool, a, b any) bool {
	if raw {
		return compareRaw(a, b) == 0
	}
	return equal(a, b)
}

func match(n *node, v any, raw bool) bool {
	switch n.op {
	case opAnd:
		for _, k := range n.kids {
			if !match(k, v, raw) {
				return false
			}
		}
		return true
	case opOr:
		if len(n.kids) == 0 {
			return true
		}
		for _, k := range n.kids {
			if match(k, v, raw) {
				return true
			}
		}
		return false
	case opNot:
		return !match(n.kid, v, raw)
	case opAll:
		vals, ok := v.([]any)
		if len(n.list()) == 0 || !ok {
			return false
		}
		has := true
		for _, a := range n.list() {
			member := false
			for _, x := range vals {
				if exactEqual(a, x) {
					member = true
					break
				}
			}
			if !member {
				has = false
				break
			}
		}
		if has {
			return true
		}
		if len(n.list()) == 1 {
			if l, ok := n.list()[0].([]any); ok {
				return termEqual(l, vals)
			}
		}
		return false
	case opField:
		if n.path == nil {
			return match(n.kid, v, raw)
		}
		sub, res := getField(v, n.path)
		switch res {
		case notFound:
			return n.kid.op == opExists && !n.kid.flag()
		case badPath:
			return false
		}
		return match(n.kid, sub, raw || n.id)
	case opElemMatch:
		vals, ok := v.([]any)
		if !ok {
			return false
		}
		for _, x := range vals {
			if match(n.kid, x, raw) {
				return true
			}
		}
		return false
	case opAllMatch:
		vals, ok := v.([]any)
		if !ok || len(vals) == 0 {
			return false
		}
		for _, x := range vals {
			if !match(n.kid, x, raw) {
				return false
			}
		}
		return true
	case opKeyMapMatch:
		obj, ok := v.(Object)
		if !ok {
			return false
		}
		for _, m := range obj {
			if match(n.kid, m.Key, raw) {
				return true
			}
		}
		return false
	case opLt:
		return cmpWith(raw, v, n.arg) < 0
	case opLte:
		return cmpWith(raw, v, n.arg) <= 0
	case opEq:
		return eqWith(raw, v, n.arg)
	case opNe:
		return !eqWith(raw, v, n.arg)
	case opGte:
		return cmpWith(raw, v, n.arg) >= 0
	case opGt:
		return cmpWith(raw, v, n.arg) > 0
	case opIn:
		return in(n.list(), v, raw)
	case opNin:
		if len(n.list()) == 0 {
			return true
		}
		if _, ok := v.([]any); ok {
			return !in(n.list(), v, raw)
		}
		for _, a := range n.list() {
			if eqWith(raw, v, a) {
				return false
			}
		}
		return true
	case opExists:
		return n.flag()
	case opType:
		return n.str() == typeName(v)
	case opMod:
		x, ok := v.(Number)
		return ok && x.Int && x.I%n.d == n.r
	case opBeginsWith:
		s, ok := v.(string)
		return ok && strings.HasPrefix(s, n.str())
	case opRegex:
		s, ok := v.(string)
		return ok && n.arg.(*regexp.Regexp).MatchString(s)
	case opSize:
		vals, ok := v.([]any)
		return ok && int64(len(vals)) == n.d
	case opDefault:
		return true // $text: CouchDB trusts its text index here
	}
	return false
}

// in is $in: v (or, when v is an array, one of its elements) equals one
// of args.
func in(args []any, v any, raw bool) bool {
	vals, isList := v.([]any)
	for _, a := range args {
		if !isList {
			if eqWith(raw, v, a) {
				return true
			}
			continue
		}
		for _, x := range vals {
			if eqWith(raw, x, a) {
				return true
			}
		}
	}
	return false
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	}
	return "object"
}

// Equality is a condition every document a selector matches meets: the
// field at Path equals the string Value (for an index of many selectors:
// only those whose Value a document's field equals need evaluating).
type Equality struct {
	Path  []string
	Value string
	// Bytes: the field is _id, compared byte by byte; otherwise strings
	// collate (Keyed says when their bytes decide).
	Bytes bool
}

// Equality returns a string equality the selector requires at its root
// ({"owner": "alice", ...} or an $and holding one), when there is one
// whose value is printable ASCII (or any string for _id).
func (s *Selector) Equality() (Equality, bool) {
	if s.root == nil {
		return Equality{}, false
	}
	try := func(n *node) (Equality, bool) {
		if n.op != opField || n.path == nil || n.kid.op != opEq {
			return Equality{}, false
		}
		v, ok := n.kid.arg.(string)
		if !ok || !n.id && !printableASCII(v) {
			return Equality{}, false
		}
		return Equality{Path: n.path, Value: v, Bytes: n.id}, true
	}
	if e, ok := try(s.root); ok || s.root.op != opAnd {
		return e, ok
	}
	for _, k := range s.root.kids {
		if e, ok := try(k); ok {
			return e, true
		}
	}
	return Equality{}, false
}

// Keyed reports whether a field's string value v equals an Equality's
// value exactly when their bytes are equal (so a lookup by bytes decides):
// always for _id, for other fields when v is printable ASCII too.
func (e Equality) Keyed(v string) bool { return e.Bytes || printableASCII(v) }

// Lookup is the value at path in doc (mango_doc:get_field), and whether
// it is there.
func Lookup(doc any, path []string) (any, bool) {
	v, res := getField(doc, path)
	return v, res == found
}
