package replicate

import (
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"unicode/utf8"
)

// ErrInvalidSelector is returned when a Mango selector cannot be normalised
// (CouchDB rejects the same selectors).
var ErrInvalidSelector = errors.New("replication: invalid selector")

// This file ports the parts of mango_selector:normalize/1,
// mango_util:join_keys/1 and couch_replicator_filters:ejsort/1 that shape the
// selector term hashed into the replication id. Terms are in the EJSON shape
// produced by ejson (objects are etfTuple{etfList{etfTuple{key, value}...}}).

// fieldPath is a field name split into its parts (a list of binaries in Erlang).
type fieldPath []string

func selErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidSelector, fmt.Sprintf(format, a...))
}

func objProps(v any) (etfList, bool) {
	t, ok := v.(etfTuple)
	if !ok || len(t) != 1 {
		return nil, false
	}
	l, ok := t[0].(etfList)
	return l, ok
}

// single returns the key and value of a one-property object.
func single(v any) (key, val any, ok bool) {
	props, ok := objProps(v)
	if !ok || len(props) != 1 {
		return nil, nil, false
	}
	p, ok := props[0].(etfTuple)
	if !ok || len(p) != 2 {
		return nil, nil, false
	}
	return p[0], p[1], true
}

func obj1(k, v any) etfTuple { return etfTuple{etfList{etfTuple{k, v}}} }

func opName(k any) (string, bool) {
	b, ok := k.(etfBinary)
	if !ok || !strings.HasPrefix(string(b), "$") {
		return "", false
	}
	return string(b), true
}

func isBool(v any) bool { return v == etfAtom("true") || v == etfAtom("false") }

func isInt(v any) bool { _, ok := v.(*big.Int); return ok }

func normalizeSelector(sel any) (any, error) {
	if props, ok := objProps(sel); ok && len(props) == 0 {
		return sel, nil
	}
	s, err := normOps(sel)
	if err != nil {
		return nil, err
	}
	if s, err = normFields(s); err != nil {
		return nil, err
	}
	if s, err = normNegations(s); err != nil {
		return nil, err
	}
	props, ok := objProps(s)
	if !ok {
		return nil, selErr("bad selector")
	}
	for _, p := range props {
		if pt, ok := p.(etfTuple); ok && len(pt) == 2 {
			if fp, ok := pt[0].(fieldPath); ok && len(fp) == 0 {
				return nil, selErr("missing field name")
			}
		}
	}
	return s, nil
}

func mapList(v any, f func(any) (any, error)) (etfList, error) {
	l, ok := v.(etfList)
	if !ok {
		return nil, selErr("expected an array, got %T", v)
	}
	out := make(etfList, len(l))
	for i, e := range l {
		var err error
		if out[i], err = f(e); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// wrap returns {k: f(arg)}.
func wrap(k, arg any, f func(any) (any, error)) (any, error) {
	c, err := f(arg)
	if err != nil {
		return nil, err
	}
	return obj1(k, c), nil
}

// wrapEach returns {k: [f(e) for each e of the list arg]}.
func wrapEach(k, arg any, f func(any) (any, error)) (any, error) {
	l, err := mapList(arg, f)
	if err != nil {
		return nil, err
	}
	return obj1(k, l), nil
}

func normOps(v any) (any, error) {
	props, isObj := objProps(v)
	if isObj && len(props) >= 2 {
		args := make(etfList, len(props))
		for i, p := range props {
			var err error
			if args[i], err = normOps(etfTuple{etfList{p}}); err != nil {
				return nil, err
			}
		}
		return obj1(etfBinary("$and"), args), nil
	}
	k, arg, ok := single(v)
	if !ok {
		return obj1(etfBinary("$eq"), v), nil
	}
	op, isOp := opName(k)
	if !isOp {
		return wrap(k, arg, normOps)
	}
	bad := func() (any, error) { return nil, selErr("bad argument for %s", op) }
	switch op {
	case "$and", "$or", "$nor":
		l, err := mapList(arg, normOps)
		if err != nil {
			return bad()
		}
		return obj1(k, l), nil
	case "$not", "$elemMatch", "$allMatch", "$keyMapMatch":
		if _, ok := objProps(arg); !ok {
			return bad()
		}
		return wrap(k, arg, normOps)
	case "$in", "$nin", "$all":
		if _, ok := arg.(etfList); !ok {
			return bad()
		}
		return v, nil
	case "$exists":
		if !isBool(arg) {
			return bad()
		}
		return v, nil
	case "$type", "$regex":
		if _, ok := arg.(etfBinary); !ok {
			return bad()
		}
		return v, nil
	case "$beginsWith":
		if b, ok := arg.(etfBinary); !ok || !utf8.ValidString(string(b)) {
			return bad()
		}
		return v, nil
	case "$mod":
		if l, ok := arg.(etfList); !ok || len(l) != 2 || !isInt(l[0]) || !isInt(l[1]) {
			return bad()
		}
		return v, nil
	case "$size":
		if n, ok := arg.(*big.Int); !ok || n.Sign() < 0 {
			return bad()
		}
		return v, nil
	case "$text":
		switch arg.(type) {
		case etfBinary, *big.Int, float64:
		default:
			if !isBool(arg) {
				return bad()
			}
		}
		return obj1(etfBinary("$default"), obj1(etfBinary("$text"), arg)), nil
	case "$default", "$lt", "$lte", "$eq", "$ne", "$gte", "$gt":
		return v, nil
	case "$where", "$geoWithin", "$geoIntersects", "$near", "$nearSphere":
		return nil, selErr("operator %s is not supported", op)
	}
	return nil, selErr("invalid operator %s", op)
}

func normFields(v any) (any, error) {
	if props, ok := objProps(v); ok && len(props) == 0 {
		return v, nil
	}
	return normFieldsAt(v, fieldPath{})
}

func normFieldsAt(v any, path fieldPath) (any, error) {
	if props, ok := objProps(v); ok && len(props) == 0 {
		return etfTuple{path, v}, nil // CouchDB returns {Path, {[]}} here
	}
	k, arg, ok := single(v)
	if !ok {
		return nil, selErr("bad field")
	}
	if op, isOp := opName(k); isOp {
		atPath := func(a any) (any, error) { return normFieldsAt(a, path) }
		switch op {
		case "$and", "$or", "$nor":
			return wrapEach(k, arg, atPath)
		case "$not":
			return wrap(k, arg, atPath)
		case "$elemMatch", "$allMatch", "$keyMapMatch":
			c, err := normFields(arg)
			if err != nil {
				return nil, err
			}
			return obj1(path, obj1(k, c)), nil
		case "$default":
			if ik, _, ok := single(arg); ok && ik == etfBinary("$text") && len(path) == 0 {
				return v, nil
			}
			return nil, selErr("bad field $default")
		}
		return obj1(path, v), nil
	}
	switch f := k.(type) {
	case etfBinary:
		parts, err := parseField(string(f))
		if err != nil {
			return nil, err
		}
		return normFieldsAt(arg, append(append(fieldPath{}, path...), parts...))
	case fieldPath:
		return normFieldsAt(arg, append(append(fieldPath{}, path...), f...))
	}
	return nil, selErr("bad field")
}

// parseField is mango_util:parse_field/1.
func parseField(f string) ([]string, error) {
	if !strings.Contains(f, `\`) {
		parts := strings.Split(f, ".")
		for _, p := range parts {
			if p == "" {
				return nil, selErr("invalid field name %q", f)
			}
		}
		return parts, nil
	}
	var parts []string
	start := 0
	for i := 0; i < len(f); i++ {
		if f[i] == '.' && (i == 0 || f[i-1] != '\\') {
			parts = append(parts, f[start:i])
			start = i + 1
		}
	}
	parts = append(parts, f[start:])
	for i, p := range parts {
		if p == "" {
			return nil, selErr("invalid field name %q", f)
		}
		parts[i] = strings.ReplaceAll(p, `\`, "")
	}
	return parts, nil
}

func normNegations(v any) (any, error) {
	k, arg, ok := single(v)
	if !ok {
		return v, nil
	}
	op, _ := opName(k)
	switch op {
	case "$not":
		return negate(arg)
	case "$nor":
		return wrapEach(etfBinary("$and"), arg, negate)
	case "$and", "$or":
		return wrapEach(k, arg, normNegations)
	case "$elemMatch", "$allMatch", "$keyMapMatch":
		return wrap(k, arg, normNegations)
	}
	return v, nil
}

var negatedOps = map[string]string{
	"$lt": "$gte", "$lte": "$gt", "$eq": "$ne", "$ne": "$eq", "$gte": "$lt", "$gt": "$lte",
	"$in": "$nin", "$nin": "$in",
}

func negate(v any) (any, error) {
	k, arg, ok := single(v)
	if !ok {
		return nil, selErr("cannot negate %v", v)
	}
	op, isOp := opName(k)
	if !isOp {
		return wrap(k, arg, negate)
	}
	switch op {
	case "$not":
		return normNegations(arg)
	case "$nor":
		return wrapEach(etfBinary("$or"), arg, normNegations)
	case "$and", "$or":
		other := etfBinary("$or")
		if op == "$or" {
			other = "$and"
		}
		return wrapEach(other, arg, negate)
	case "$default":
		return nil, selErr("bad argument for $not")
	case "$exists":
		if arg == etfAtom("true") {
			return obj1(k, etfAtom("false")), nil
		}
		if arg == etfAtom("false") {
			return obj1(k, etfAtom("true")), nil
		}
		return nil, selErr("bad argument for $exists")
	}
	if n, ok := negatedOps[op]; ok {
		return obj1(etfBinary(n), arg), nil
	}
	return obj1(etfBinary("$not"), v), nil
}

// joinKeys is mango_util:join_keys/1: field paths become "a.b" binaries.
func joinKeys(v any) any {
	if props, ok := objProps(v); ok {
		out := etfList{}
		for _, p := range props {
			pt, ok := p.(etfTuple)
			if !ok || len(pt) != 2 {
				continue
			}
			k := pt[0]
			if fp, ok := k.(fieldPath); ok {
				k = etfBinary(strings.Join(fp, "."))
			}
			out = append(out, etfTuple{k, joinKeys(pt[1])})
		}
		return etfTuple{out}
	}
	if l, ok := v.(etfList); ok {
		return each(l, joinKeys)
	}
	return pathTerms(v)
}

// pathTerms turns any remaining fieldPath into a list of binaries.
func pathTerms(v any) any {
	switch t := v.(type) {
	case fieldPath:
		l := make(etfList, len(t))
		for i, s := range t {
			l[i] = etfBinary(s)
		}
		return l
	case etfTuple:
		return each(t, pathTerms)
	}
	return v
}

// ejsort is couch_replicator_filters:ejsort/1: object properties sorted by
// key (stable), recursively.
func ejsort(v any) any {
	if t, ok := v.(etfTuple); ok && len(t) == 1 {
		if props, ok := t[0].(etfList); ok {
			out := make(etfList, len(props))
			for i, p := range props {
				pt := p.(etfTuple)
				out[i] = etfTuple{pt[0], ejsort(pt[1])}
			}
			// ejsort_props accumulates in reverse before lists:keysort.
			for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
				out[i], out[j] = out[j], out[i]
			}
			sort.SliceStable(out, func(i, j int) bool {
				return termLess(out[i].(etfTuple)[0], out[j].(etfTuple)[0])
			})
			return etfTuple{out}
		}
	}
	if l, ok := v.(etfList); ok {
		return each(l, ejsort)
	}
	return v
}

// each returns a list or tuple of f applied to every element of s.
func each[S etfList | etfTuple](s S, f func(any) any) S {
	out := make(S, len(s))
	for i, e := range s {
		out[i] = f(e)
	}
	return out
}

// termLess orders object keys; after join_keys they are binaries.
func termLess(a, b any) bool {
	ab, aok := a.(etfBinary)
	bb, bok := b.(etfBinary)
	if aok && bok {
		return ab < bb
	}
	return fmt.Sprint(a) < fmt.Sprint(b)
}
