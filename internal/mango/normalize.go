package mango

import (
	"fmt"
	"strings"
)

// Normalisation (mango_selector:normalize/1), shared by the two forms a
// selector takes in couchrep: this package's decoded JSON, which Parse
// compiles for matching (JSONForm), and internal/replicate's Erlang terms,
// whose normal form is hashed into the replication id. The forms differ
// in their numbers (CouchDB's bignums are floats here, exact integers in
// the id) and in how a field's path is written (kept as written here, its
// escapes read at compile time; parsed and joined in the id): Form says.

// Form is what Normalize needs to know of a selector's leaves beyond this
// package's types (Object, []any, string, bool, nil), and how it joins a
// field's path.
type Form struct {
	// IsInt reports whether v is an integer ($mod's arguments), IsSize
	// whether it is a non-negative one ($size's), IsNumber whether it is a
	// number ($text's argument may be one).
	IsInt, IsSize, IsNumber func(v any) bool
	// Field returns the path of field name under path (path "" at the
	// top: the name alone), or an ErrInvalid for a name the form rejects.
	Field func(path, name string) (string, error)
}

// JSONForm is the form of Decode's values, which Parse compiles: a path
// is the field names joined by "." as written (their escapes are read
// when the selector is compiled).
var JSONForm = Form{
	IsInt:    func(v any) bool { n, ok := v.(Number); return ok && n.Int },
	IsSize:   func(v any) bool { n, ok := v.(Number); return ok && n.Int && n.I >= 0 },
	IsNumber: func(v any) bool { _, ok := v.(Number); return ok },
	Field: func(path, name string) (string, error) {
		if path == "" {
			return name, nil
		}
		return path + "." + name, nil
	},
}

// normalizer is Normalize for one form.
type normalizer struct{ f Form }

func obj1(k string, v any) Object { return Object{{k, v}} }

func badArg(op string, arg any) error {
	return fmt.Errorf("%w: bad argument for operator %s: %s", ErrInvalid, op, text(arg))
}

// Normalize is mango_selector:normalize/1 on a selector (a non-empty
// Object whose leaves are of form f): implicit operators made explicit
// ($and of a multi-field object, $eq of a value), each operator's argument
// checked, field names moved down to their conditions (joined by f.Field),
// and negations pushed down to the conditions with De Morgan's laws. Its
// errors are ErrInvalid's (CouchDB rejects the same selectors).
func Normalize(sel Object, f Form) (Object, error) {
	nz := normalizer{f}
	v, err := nz.normOps(sel)
	if err != nil {
		return nil, err
	}
	if v, err = nz.normFieldsTop(v); err != nil {
		return nil, err
	}
	if v, err = nz.normNegations(v); err != nil {
		return nil, err
	}
	obj := v.(Object)
	for _, m := range obj {
		if m.Key == "" {
			return nil, fmt.Errorf("%w: one or more conditions is missing a field name", ErrInvalid)
		}
	}
	return obj, nil
}

// normOps validates each operator's argument and makes implicit operators
// explicit (norm_ops/1).
func (nz normalizer) normOps(v any) (any, error) {
	obj, isObj := v.(Object)
	if isObj && len(obj) >= 2 {
		and := make([]any, len(obj))
		for i, m := range obj {
			n, err := nz.normOps(Object{m})
			if err != nil {
				return nil, err
			}
			and[i] = n
		}
		return obj1("$and", and), nil
	}
	if !isObj || len(obj) == 0 {
		return obj1("$eq", v), nil
	}
	k, a := obj[0].Key, obj[0].Value
	switch k {
	case "$and", "$or", "$nor":
		l, ok := a.([]any)
		if !ok {
			return nil, badArg(k, a)
		}
		out := make([]any, len(l))
		for i, x := range l {
			n, err := nz.normOps(x)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return obj1(k, out), nil
	case "$not", "$elemMatch", "$allMatch", "$keyMapMatch":
		if _, ok := a.(Object); !ok {
			return nil, badArg(k, a)
		}
		n, err := nz.normOps(a)
		if err != nil {
			return nil, err
		}
		return obj1(k, n), nil
	case "$in", "$nin", "$all":
		if _, ok := a.([]any); !ok {
			return nil, badArg(k, a)
		}
		return obj, nil
	case "$exists":
		if _, ok := a.(bool); !ok {
			return nil, badArg(k, a)
		}
		return obj, nil
	case "$type", "$regex":
		if _, ok := a.(string); !ok {
			return nil, badArg(k, a)
		}
		return obj, nil
	case "$mod":
		if l, ok := a.([]any); !ok || len(l) != 2 || !nz.f.IsInt(l[0]) || !nz.f.IsInt(l[1]) {
			return nil, badArg(k, a)
		}
		return obj, nil
	case "$size":
		if !nz.f.IsSize(a) {
			return nil, badArg(k, a)
		}
		return obj, nil
	case "$text":
		switch a.(type) {
		case string, bool:
			return obj1("$default", obj1("$text", a)), nil
		}
		if nz.f.IsNumber(a) {
			return obj1("$default", obj1("$text", a)), nil
		}
		return nil, badArg(k, a)
	case "$beginsWith":
		if _, ok := a.(string); !ok {
			return nil, fmt.Errorf("%w: invalid operator: %s (its argument must be a string, not %s)", ErrInvalid, k, text(a))
		}
		return obj, nil
	case "$default", "$lt", "$lte", "$eq", "$ne", "$gte", "$gt":
		return obj, nil
	case "$where", "$geoWithin", "$geoIntersects", "$near", "$nearSphere":
		return nil, fmt.Errorf("%w: unsupported operator: %s", ErrInvalid, k)
	}
	if strings.HasPrefix(k, "$") {
		return nil, fmt.Errorf("%w: invalid operator: %s", ErrInvalid, k)
	}
	c, err := nz.normOps(a)
	if err != nil {
		return nil, err
	}
	return obj1(k, c), nil
}

func badField(v any) error {
	return fmt.Errorf("%w: invalid field normalization on selector: %s", ErrInvalid, text(v))
}

func (nz normalizer) normFieldsTop(v any) (any, error) {
	if o, ok := v.(Object); ok && len(o) == 0 {
		return v, nil
	}
	return nz.normFields(v, "")
}

// normFields moves field names down to the conditions they apply to
// (norm_fields/2): {a: {b: {$gt: 1}}} is {"a.b": {$gt: 1}}.
func (nz normalizer) normFields(v any, path string) (any, error) {
	obj, ok := v.(Object)
	if !ok || len(obj) != 1 {
		return nil, badField(v)
	}
	k, a := obj[0].Key, obj[0].Value
	switch k {
	case "$and", "$or", "$nor":
		l := a.([]any)
		out := make([]any, len(l))
		for i, x := range l {
			n, err := nz.normFields(x, path)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return obj1(k, out), nil
	case "$not":
		n, err := nz.normFields(a, path)
		if err != nil {
			return nil, err
		}
		return obj1(k, n), nil
	case "$elemMatch", "$allMatch", "$keyMapMatch":
		n, err := nz.normFieldsTop(a)
		if err != nil {
			return nil, err
		}
		return obj1(path, obj1(k, n)), nil
	case "$default":
		if t, ok := a.(Object); path == "" && ok && len(t) == 1 && t[0].Key == "$text" {
			return v, nil
		}
		return nil, badField(v)
	}
	if strings.HasPrefix(k, "$") {
		return obj1(path, v), nil
	}
	p, err := nz.f.Field(path, k)
	if err != nil {
		return nil, err
	}
	return nz.normFields(a, p)
}

// normNegations moves negations down to the conditions (norm_negations/1).
func (nz normalizer) normNegations(v any) (any, error) {
	obj := v.(Object)
	if len(obj) != 1 {
		return v, nil
	}
	k, a := obj[0].Key, obj[0].Value
	switch k {
	case "$not":
		return nz.negate(a)
	case "$nor":
		return nz.mapArgs("$and", a, nz.negate)
	case "$and", "$or":
		return nz.mapArgs(k, a, nz.normNegations)
	case "$elemMatch", "$allMatch", "$keyMapMatch":
		n, err := nz.normNegations(a)
		if err != nil {
			return nil, err
		}
		return obj1(k, n), nil
	}
	return v, nil
}

func (nz normalizer) mapArgs(op string, args any, f func(any) (any, error)) (any, error) {
	l := args.([]any)
	out := make([]any, len(l))
	for i, x := range l {
		n, err := f(x)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return obj1(op, out), nil
}

var negated = map[string]string{"$lt": "$gte", "$lte": "$gt", "$eq": "$ne", "$ne": "$eq", "$gte": "$lt", "$gt": "$lte", "$in": "$nin", "$nin": "$in"}

// negate is negate/1: De Morgan, and each comparison turned around.
func (nz normalizer) negate(v any) (any, error) {
	obj := v.(Object)
	if len(obj) != 1 {
		return obj1("$not", v), nil
	}
	k, a := obj[0].Key, obj[0].Value
	switch k {
	case "$not":
		return nz.normNegations(a)
	case "$nor":
		return nz.mapArgs("$or", a, nz.normNegations)
	case "$and":
		return nz.mapArgs("$or", a, nz.negate)
	case "$or":
		return nz.mapArgs("$and", a, nz.negate)
	case "$default":
		return nil, badArg("$not", v)
	case "$exists":
		return obj1(k, !a.(bool)), nil
	}
	if op, ok := negated[k]; ok {
		return obj1(op, a), nil
	}
	if strings.HasPrefix(k, "$") {
		return obj1("$not", v), nil
	}
	n, err := nz.negate(a)
	if err != nil {
		return nil, err
	}
	return obj1(k, n), nil
}
