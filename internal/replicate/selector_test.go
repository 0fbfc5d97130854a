package replicate

import (
	"reflect"
	"testing"
)

// TestNormalizeNegations checks mango_selector:normalize/1's negation rules
// (norm_negations/1, negate/1 in src/mango/src/mango_selector.erl) by
// pairs of selectors that must normalise to the same term: each input and
// the selector CouchDB rewrites it into.
func TestNormalizeNegations(t *testing.T) {
	for _, tc := range []struct{ name, in, same string }{
		{"not of a field", `{"$not":{"a":{"$gt":1}}}`, `{"a":{"$lte":1}}`},
		{"not not", `{"$not":{"$not":{"a":1}}}`, `{"a":1}`},
		{"nor", `{"$nor":[{"a":1},{"b":2}]}`, `{"$and":[{"a":{"$ne":1}},{"b":{"$ne":2}}]}`},
		{"not nor", `{"$not":{"$nor":[{"a":1},{"b":2}]}}`, `{"$or":[{"a":1},{"b":2}]}`},
		{"not and", `{"$not":{"$and":[{"a":{"$lt":1}},{"b":{"$in":[1]}}]}}`, `{"$or":[{"a":{"$gte":1}},{"b":{"$nin":[1]}}]}`},
		{"not or", `{"$not":{"$or":[{"a":{"$eq":1}},{"b":{"$gte":2}}]}}`, `{"$and":[{"a":{"$ne":1}},{"b":{"$lt":2}}]}`},
		{"not exists", `{"$not":{"a":{"$exists":true}}}`, `{"a":{"$exists":false}}`},
		{"not without a negated operator", `{"$not":{"a":{"$regex":"x"}}}`, `{"a":{"$not":{"$regex":"x"}}}`},
		{"inside and", `{"$and":[{"$not":{"a":1}},{"b":1}]}`, `{"$and":[{"a":{"$ne":1}},{"b":1}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := normalized(t, tc.in), normalized(t, tc.same)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("normalize(%s) = %v, want %v (the normal form of %s)", tc.in, got, want, tc.same)
			}
		})
	}
}

func normalized(t *testing.T, sel string) any {
	t.Helper()
	v, err := ejson([]byte(sel))
	if err != nil {
		t.Fatalf("ejson(%s): %v", sel, err)
	}
	n, err := normalizeSelector(v)
	if err != nil {
		t.Fatalf("normalizeSelector(%s): %v", sel, err)
	}
	return ejsort(n)
}
