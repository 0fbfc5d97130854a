package replicate

import (
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"

	"github.com/couchrep/couchrep/internal/mango"
)

// ErrInvalidSelector is returned when a Mango selector cannot be normalised
// (CouchDB rejects the same selectors).
var ErrInvalidSelector = errors.New("replication: invalid selector")

// The selector term hashed into the replication id is
// mango_selector:normalize/1's, then mango_util:join_keys/1's (field paths
// as "a.b" binaries) and couch_replicator_filters:ejsort/1's. The
// normalisation is internal/mango's (the one the node's matching uses),
// run on the selector as jiffy decodes it (ejson) in mango's form with
// termForm's rules, then turned back into terms (objects are
// etfTuple{etfList{etfTuple{key, value}...}}).

// normalizeSelector returns the normal form of sel (ejson's term) with its
// field paths joined (join_keys), or an ErrInvalidSelector.
func normalizeSelector(sel any) (any, error) {
	if t, ok := sel.(etfTuple); ok && len(t) == 1 {
		if l, ok := t[0].(etfList); ok && len(l) == 0 {
			return sel, nil
		}
	}
	obj, ok := toMango(sel).(mango.Object)
	if !ok {
		return nil, fmt.Errorf("%w: a selector is an object", ErrInvalidSelector)
	}
	n, err := mango.Normalize(obj, termForm)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidSelector, strings.TrimPrefix(err.Error(), mango.ErrInvalid.Error()+": "))
	}
	return fromMango(n), nil
}

// bigInt is an integer beyond 64 bits in mango's form: an exact bignum to
// the id (a float to mango's matching, which never sees this form).
type bigInt struct{ *big.Int }

// termForm is mango.Form for terms: integers are exact (bignums too), and
// a field's path is its names parsed (mango_util:parse_field/1: split at
// unescaped dots, backslashes dropped; an empty part is invalid) and
// joined by "." (join_keys).
var termForm = mango.Form{
	IsInt: func(v any) bool {
		switch n := v.(type) {
		case mango.Number:
			return n.Int
		case bigInt:
			return true
		}
		return false
	},
	IsSize: func(v any) bool {
		switch n := v.(type) {
		case mango.Number:
			return n.Int && n.I >= 0
		case bigInt:
			return n.Sign() >= 0
		}
		return false
	},
	IsNumber: func(v any) bool {
		switch v.(type) {
		case mango.Number, bigInt:
			return true
		}
		return false
	},
	Field: func(path, name string) (string, error) {
		parts, err := mango.ParseField(name)
		if err != nil {
			return "", fmt.Errorf("%w: invalid field name %q", mango.ErrInvalid, name)
		}
		joined := strings.Join(parts, ".")
		if path == "" {
			return joined, nil
		}
		return path + "." + joined, nil
	},
}

// toMango is ejson's term v in mango's form (its numbers exact: bigInt
// beyond 64 bits).
func toMango(v any) any {
	switch t := v.(type) {
	case etfTuple:
		if len(t) == 1 {
			if props, ok := t[0].(etfList); ok {
				obj := make(mango.Object, 0, len(props))
				for _, p := range props {
					pt := p.(etfTuple)
					obj = append(obj, mango.Member{Key: string(pt[0].(etfBinary)), Value: toMango(pt[1])})
				}
				return obj
			}
		}
	case etfList:
		l := make([]any, len(t))
		for i, e := range t {
			l[i] = toMango(e)
		}
		return l
	case etfBinary:
		return string(t)
	case etfAtom:
		switch t {
		case "true":
			return true
		case "false":
			return false
		}
		return nil
	case float64:
		return mango.Number{F: t}
	case *big.Int:
		if t.IsInt64() {
			return mango.Number{I: t.Int64(), Int: true}
		}
		return bigInt{t}
	}
	return v
}

// fromMango is toMango's inverse: a normalised selector back as a term.
func fromMango(v any) any {
	switch t := v.(type) {
	case mango.Object:
		props := make(etfList, len(t))
		for i, m := range t {
			props[i] = etfTuple{etfBinary(m.Key), fromMango(m.Value)}
		}
		return etfTuple{props}
	case []any:
		l := make(etfList, len(t))
		for i, e := range t {
			l[i] = fromMango(e)
		}
		return l
	case string:
		return etfBinary(t)
	case bool:
		if t {
			return etfAtom("true")
		}
		return etfAtom("false")
	case nil:
		return etfAtom("null")
	case mango.Number:
		if t.Int {
			return big.NewInt(t.I)
		}
		return t.F
	case bigInt:
		return t.Int
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
