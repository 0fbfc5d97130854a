package mango

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// valueCase is one value of x and whether {"x": sel} matches {"x": value}.
type valueCase struct {
	want  bool
	value string
}

// TestMatchValues ports the eunit tests of CouchDB's mango_selector
// (check_selector/2 in src/mango/src/mango_selector.erl): each selector S
// is tried as {"x": S} against {"x": value}, and {"x": {"$not": S}} must
// give the opposite.
func TestMatchValues(t *testing.T) {
	for _, tc := range []struct {
		sel   string
		cases []valueCase
	}{
		// match_lt_test .. match_gte_test
		{`{"$lt": 5}`, []valueCase{{true, `4`}, {false, `5`}, {false, `6`}}},
		{`{"$lt": "hello"}`, []valueCase{{true, `"held"`}, {false, `"hello"`}, {false, `"help"`}}},
		{`{"$lt": [1, 2, 3]}`, []valueCase{{true, `[1, 2, 2]`}, {true, `[1, 2]`}, {false, `[1, 2, 3]`}, {false, `[1, 2, 4]`}, {false, `[1, 3]`}}},
		{`{"$lte": 5}`, []valueCase{{true, `4`}, {true, `5`}, {false, `6`}}},
		{`{"$lte": "hello"}`, []valueCase{{true, `"held"`}, {true, `"hello"`}, {false, `"help"`}}},
		{`{"$lte": [1, 2, 3]}`, []valueCase{{true, `[1, 2, 2]`}, {true, `[1, 2]`}, {true, `[1, 2, 3]`}, {false, `[1, 2, 4]`}, {false, `[1, 3]`}}},
		{`{"$gt": 5}`, []valueCase{{false, `4`}, {false, `5`}, {true, `6`}}},
		{`{"$gt": "hello"}`, []valueCase{{false, `"held"`}, {false, `"hello"`}, {true, `"help"`}}},
		{`{"$gt": [1, 2, 3]}`, []valueCase{{false, `[1, 2, 2]`}, {false, `[1, 2]`}, {false, `[1, 2, 3]`}, {true, `[1, 2, 4]`}, {true, `[1, 3]`}}},
		{`{"$gte": 5}`, []valueCase{{false, `4`}, {true, `5`}, {true, `6`}}},
		{`{"$gte": "hello"}`, []valueCase{{false, `"held"`}, {true, `"hello"`}, {true, `"help"`}}},
		{`{"$gte": [1, 2, 3]}`, []valueCase{{false, `[1, 2, 2]`}, {false, `[1, 2]`}, {true, `[1, 2, 3]`}, {true, `[1, 2, 4]`}, {true, `[1, 3]`}}},
		// match_eq_test, match_ne_test
		{`{"$eq": 5}`, []valueCase{{true, `5`}, {false, `6`}}},
		{`{"$eq": "hello"}`, []valueCase{{true, `"hello"`}, {false, `"help"`}}},
		{`{"$eq": [1, [2, 3, 4], 5]}`, []valueCase{{true, `[1, [2, 3, 4], 5]`}, {false, `[1, [2, 3, 4]]`}, {false, `[1, [2, 3, 4], 5, 6]`}, {false, `[1, [2, 7, 4], 5]`}}},
		{`{"$eq": {"a": {"b": {"c": 7}}}}`, []valueCase{{true, `{"a": {"b": {"c": 7}}}`}, {false, `{"a": {"b": {"c": 8}}}`}, {false, `{"a": {"b": {"d": 7}}}`}, {false, `{"a": {"d": {"c": 7}}}`}}},
		{`{"$ne": 5}`, []valueCase{{false, `5`}, {true, `6`}}},
		{`{"$ne": "hello"}`, []valueCase{{false, `"hello"`}, {true, `"help"`}}},
		{`{"$ne": [1, [2, 3, 4], 5]}`, []valueCase{{false, `[1, [2, 3, 4], 5]`}, {true, `[1, [2, 3, 4]]`}, {true, `[1, [2, 3, 4], 5, 6]`}, {true, `[1, [2, 7, 4], 5]`}}},
		{`{"$ne": {"a": {"b": {"c": 7}}}}`, []valueCase{{false, `{"a": {"b": {"c": 7}}}`}, {true, `{"a": {"b": {"c": 8}}}`}, {true, `{"a": {"b": {"d": 7}}}`}, {true, `{"a": {"d": {"c": 7}}}`}}},
		// match_in_test, match_nin_test
		{`{"$in": []}`, []valueCase{{false, `0`}, {false, `true`}, {false, `"foo"`}}},
		{`{"$in": [42, false, "bar", [["nested"], "list"], {"b": 2}]}`, []valueCase{
			{true, `42`}, {true, `false`}, {true, `"bar"`}, {true, `{"b": 2}`},
			{false, `43`}, {false, `true`}, {false, `"bars"`}, {false, `{"b": 2, "c": 3}`},
			{true, `[0, 42]`}, {true, `[0, false]`}, {true, `[0, "bar"]`}, {true, `[0, {"b": 2}]`},
			{false, `[["nested"], "list"]`}, {true, `[0, [["nested"], "list"]]`}}},
		{`{"$nin": []}`, []valueCase{{true, `0`}, {true, `true`}, {true, `"foo"`}}},
		{`{"$nin": [42, false, "bar", [["nested"], "list"], {"b": 2}]}`, []valueCase{
			{false, `42`}, {false, `false`}, {false, `"bar"`}, {false, `{"b": 2}`},
			{true, `43`}, {true, `true`}, {true, `"bars"`}, {true, `{"b": 2, "c": 3}`},
			{false, `[0, 42]`}, {false, `[0, false]`}, {false, `[0, "bar"]`}, {false, `[0, {"b": 2}]`},
			{true, `[["nested"], "list"]`}, {false, `[0, [["nested"], "list"]]`}}},
		// match_all_test
		{`{"$all": []}`, []valueCase{{false, `[]`}, {false, `[42]`}, {false, `{}`}, {false, `"foo"`}}},
		{`{"$all": [1, 2, 3, 4]}`, []valueCase{{true, `[3, 2, 4, 1]`}, {true, `[0, 4, 3, 5, 2, 1, 6]`}, {false, `[3, 2, 4]`}, {false, `[]`}}},
		{`{"$not": {"$all": [1, 2, 3, 4]}}`, []valueCase{{true, `[2, 4, 1]`}, {false, `[2, 4, 1, 3]`}, {true, `[]`}}},
		{`{"$all": [[1, 2, 3, 4]]}`, []valueCase{{true, `[1, 2, 3, 4]`}, {false, `[4, 3, 2, 1]`}, {false, `[1, 3, 4]`}, {false, `[]`},
			{true, `[5, [1, 2, 3, 4], 6]`}, {false, `[5, [1, 3, 4], 6]`}, {false, `[5, [1, 3, 2, 4], 6]`}}},
		{`{"$all": ["hello"]}`, []valueCase{{false, `"hello"`}, {true, `["hello"]`}, {true, `[0, "hello", 1]`}, {false, `[]`}}},
		{`{"$all": [{"a": 1}]}`, []valueCase{{true, `[{"a": 1}]`}, {false, `[{"a": 1, "b": 2}]`}}},
		// $all is Erlang's exact membership: 1 is not 1.0 (but $eq says it is)
		{`{"$all": [1]}`, []valueCase{{true, `[1]`}, {false, `[1.0]`}}},
		{`{"$eq": 1}`, []valueCase{{true, `1.0`}, {true, `1`}}},
		// match_exists_test (x itself must exist: {"x": {"x": ...}})
		{`{"x": {"$exists": true}}`, []valueCase{{true, `{"x": 0}`}, {false, `{"y": 0}`}, {false, `{}`}}},
		{`{"x": {"$exists": false}}`, []valueCase{{false, `{"x": 0}`}, {true, `{"y": 0}`}, {true, `{}`}}},
		{`{"x": {"$not": {"$exists": true, "$eq": 0}}}`, []valueCase{{true, `{"x": 1}`}, {false, `{"x": 0}`}, {true, `{}`}}},
		// match_type_test
		{`{"$type": "null"}`, []valueCase{{true, `null`}, {false, `false`}, {false, `{}`}}},
		{`{"$type": "boolean"}`, []valueCase{{true, `true`}, {true, `false`}, {false, `0`}}},
		{`{"$type": "number"}`, []valueCase{{true, `42`}, {true, `3.14`}, {true, `0`}, {false, `true`}, {false, `[1]`}, {false, `"1"`}}},
		{`{"$type": "string"}`, []valueCase{{true, `""`}, {true, `"hello"`}, {false, `[]`}}},
		{`{"$type": "array"}`, []valueCase{{true, `[]`}, {true, `[1, 2]`}, {false, `{}`}, {false, `"hi"`}}},
		{`{"$type": "object"}`, []valueCase{{true, `{}`}, {true, `{"a": 1}`}, {false, `[{"a": 1}]`}, {false, `null`}}},
		// match_regex_test, match_beginswith_test
		{`{"$regex": "^[0-9a-f]+$"}`, []valueCase{{false, `""`}, {true, `"3a0df5e"`}, {false, `"3a0gf5e"`}, {false, `42`}}},
		{`{"$regex": "b"}`, []valueCase{{true, `"abc"`}}}, // re:run searches, unanchored
		{`{"$beginsWith": "foo"}`, []valueCase{{true, `"foo"`}, {true, `"food"`}, {true, `"fool me once"`}, {false, `"more food"`}, {false, `"fo"`}, {false, `42`}}},
		{`{"$beginsWith": ""}`, []valueCase{{true, `"x"`}, {false, `1`}}},
		// match_mod_test, match_size_test
		{`{"$mod": [28, 1]}`, []valueCase{{true, `1`}, {true, `29`}, {true, `57`}, {false, `58`}, {false, `"57"`}, {false, `29.0`}}},
		{`{"$mod": [3, -1]}`, []valueCase{{true, `-1`}, {true, `-4`}, {false, `2`}}}, // rem: the sign of the dividend
		{`{"$size": 3}`, []valueCase{{false, `3`}, {false, `"fun"`}, {true, `[0, 0, 0]`}, {false, `[0, 0]`}, {false, `[0, 0, 0, 0]`}}},
		// match_allmatch_test, match_elemmatch_test, match_keymapmatch_test
		{`{"$allMatch": {"$eq": 0}}`, []valueCase{{false, `[]`}, {true, `[0]`}, {false, `[1]`}, {false, `[0, 1]`}}},
		{`{"$elemMatch": {"$ne": 0}}`, []valueCase{{false, `[]`}, {false, `[0]`}, {true, `[1]`}, {true, `[0, 1]`}}},
		{`{"$elemMatch": {"$eq": 0}}`, []valueCase{{false, `[]`}, {true, `[0]`}, {false, `[1]`}, {true, `[0, 1]`}}},
		{`{"$elemMatch": {"$gte": 80, "$lt": 85}}`, []valueCase{{true, `[79, 82]`}, {false, `[79, 85]`}, {false, `82`}}},
		{`{"$elemMatch": {"name": "b", "n": {"$gt": 1}}}`, []valueCase{{true, `[{"name": "a", "n": 5}, {"name": "b", "n": 2}]`}, {false, `[{"name": "a", "n": 5}, {"name": "b", "n": 1}]`}}},
		{`{"$keyMapMatch": {"$regex": "^[a-z]+$"}}`, []valueCase{{true, `{"hello": 0}`}, {true, `{"a": 1, "b": 2}`}, {true, `{"a": 1, "b4": 2}`}, {false, `{"b4": 2}`}, {false, `{}`}}},
		// collation across types: null < false < true < numbers < strings < arrays < objects
		{`{"$gt": 5}`, []valueCase{{true, `"a string"`}, {true, `[]`}, {true, `{}`}, {false, `null`}, {false, `true`}}},
		{`{"$lt": true}`, []valueCase{{true, `null`}, {true, `false`}, {false, `true`}, {false, `0`}}},
		{`{"$lt": []}`, []valueCase{{true, `"zzz"`}, {false, `[0]`}, {false, `{}`}}},
		{`{"$lt": {"a": 1}}`, []valueCase{{true, `{}`}, {true, `{"a": 0}`}, {false, `{"a": 1, "b": 0}`}, {false, `{"b": 0}`}, {true, `[9]`}}},
		// strings by ICU's root collation: "a" < "A" < "aa" < "b" < "B"
		{`{"$gt": "a"}`, []valueCase{{true, `"A"`}, {true, `"aa"`}, {true, `"B"`}, {false, `""`}}},
		{`{"$lt": "b"}`, []valueCase{{true, `"A"`}, {true, `"aa"`}, {false, `"B"`}, {true, `"ä"`}}},
		{`{"$lt": "B"}`, []valueCase{{true, `"b"`}, {false, `"c"`}}},
		{`{"$eq": "é"}`, []valueCase{{true, `"e\u0301"`}, {false, `"e"`}}}, // canonically equivalent
		// numbers by value, integers and floats alike
		{`{"$gt": 1}`, []valueCase{{true, `1.5`}, {false, `1.0`}, {true, `9007199254740993`}}},
		{`{"$lt": 9007199254740993}`, []valueCase{{true, `9007199254740992`}, {true, `9007199254740992.0`}, {false, `9007199254740993`}}},
	} {
		pos, err := Parse([]byte(`{"x": ` + tc.sel + `}`))
		if err != nil {
			t.Errorf("%s: %v", tc.sel, err)
			continue
		}
		neg, err := Parse([]byte(`{"x": {"$not": ` + tc.sel + `}}`))
		if err != nil {
			t.Errorf("$not %s: %v", tc.sel, err)
			continue
		}
		for _, c := range tc.cases {
			doc, err := Decode([]byte(`{"x": ` + c.value + `}`))
			if err != nil {
				t.Fatalf("%s: %v", c.value, err)
			}
			if got := pos.Match(doc); got != c.want {
				t.Errorf("{x: %s} on {x: %s} = %v, want %v", tc.sel, c.value, got, c.want)
			}
			if got := neg.Match(doc); got != !c.want {
				t.Errorf("{x: {$not: %s}} on {x: %s} = %v, want %v", tc.sel, c.value, got, !c.want)
			}
		}
	}
}

// TestMatchDocs checks whole selectors on whole documents: the rest of
// mango_selector's eunit tests (match_demo, match_ne, match_object,
// match_and, match_or, match_nor) and the fields, paths and special fields
// a replication filter meets.
func TestMatchDocs(t *testing.T) {
	const testDoc = `{"_id": "foo", "_rev": "bar", "user_id": 11}`
	for _, tc := range []struct {
		sel, doc string
		want     bool
	}{
		// match_demo_test
		{`{"user_id": 11}`, testDoc, true},
		{`{"_id": "foo"}`, testDoc, true},
		{`{"_id": "foo", "_rev": "bar"}`, testDoc, true},
		{`{"user_id": 1234}`, testDoc, false},
		{`{"user_id": "11"}`, testDoc, false},
		{`{"_id": "foo", "_rev": "quux"}`, testDoc, false},
		// match_beginswith_errors_test
		{`{"_id": {"$beginsWith": "f"}}`, testDoc, true},
		{`{"user_id": {"$beginsWith": "f"}}`, testDoc, false},
		// match_ne_test: $ne (and so $not $eq) needs the field
		{`{"x": {"$ne": 5}}`, `{}`, false},
		{`{"$not": {"x": 5}}`, `{}`, false},
		{`{"x": {"$not": {"$eq": 0}}}`, `{}`, false},
		{`{"x": 0}`, `{}`, false},
		// match_object_test
		{`{}`, `{}`, true},
		{`{}`, `{"x": []}`, true},
		{`{"x": {}}`, `{}`, false},
		{`{"x": {}}`, `{"x": {}}`, true},
		{`{"x": {}}`, `{"x": {"a": 1}}`, false},
		{`{"x": {}}`, `{"x": []}`, false},
		{`{"$not": {"x": {}}}`, `{}`, false},
		{`{"$not": {"x": {}}}`, `{"x": {}}`, false},
		{`{"$not": {"x": {}}}`, `{"x": {"a": 1}}`, true},
		{`{"$not": {"x": {}}}`, `{"x": []}`, true},
		{`{"x": {"a": 1}}`, `{"x": {}}`, false},
		{`{"x": {"a": 1}}`, `{"x": {"a": 1}}`, true},
		{`{"x": {"a": 1}}`, `{"x": {"a": 1, "b": 2}}`, true},
		{`{"x": {"a": 1}}`, `{"x": []}`, false},
		{`{"x": {"a": 1, "b": 2}}`, `{"x": {"a": 1}}`, false},
		{`{"x": {"a": 1, "b": 2}}`, `{"x": {"a": 1, "b": 2}}`, true},
		{`{"x.b": 2}`, `{"x": {"a": 1, "b": 2}}`, true},
		{`{"x.b": 2}`, `{"x": {"a": 1}}`, false},
		// match_and_test
		{`{"x": {"$and": []}}`, `{"x": 0}`, true},
		{`{"x": {"$and": []}}`, `{}`, true},
		{`{"x": {"$not": {"$and": []}}}`, `{"x": false}`, true},
		{`{"x": {"$not": {"$and": []}}}`, `{}`, true},
		{`{"x": {"$and": [{"$gt": 3}, {"$lt": 7}]}}`, `{"x": 6}`, true},
		{`{"x": {"$and": [{"$gt": 3}, {"$lt": 7}]}}`, `{"x": 2}`, false},
		{`{"x": {"$and": [{"$gt": 3}, {"$lt": 7}]}}`, `{"x": 9}`, false},
		{`{"x": {"$and": [{"$gt": 3}, {"$lt": 7}]}}`, `{}`, false},
		{`{"x": {"$not": {"$and": [{"$gt": 3}, {"$lt": 7}]}}}`, `{"x": 6}`, false},
		{`{"x": {"$not": {"$and": [{"$gt": 3}, {"$lt": 7}]}}}`, `{"x": 2}`, true},
		{`{"x": {"$not": {"$and": [{"$gt": 3}, {"$lt": 7}]}}}`, `{}`, false},
		// match_or_test
		{`{"x": {"$or": []}}`, `{"x": []}`, true},
		{`{"x": {"$or": []}}`, `{}`, true},
		{`{"x": {"$not": {"$or": []}}}`, `{"x": 0}`, true},
		{`{"x": {"$not": {"$or": []}}}`, `{}`, true},
		{`{"x": {"$or": [{"$lt": 3}, {"$gt": 7}]}}`, `{"x": 6}`, false},
		{`{"x": {"$or": [{"$lt": 3}, {"$gt": 7}]}}`, `{"x": 2}`, true},
		{`{"x": {"$or": [{"$lt": 3}, {"$gt": 7}]}}`, `{}`, false},
		{`{"x": {"$not": {"$or": [{"$lt": 3}, {"$gt": 7}]}}}`, `{"x": 6}`, true},
		{`{"x": {"$not": {"$or": [{"$lt": 3}, {"$gt": 7}]}}}`, `{"x": 9}`, false},
		{`{"x": {"$not": {"$or": [{"$lt": 3}, {"$gt": 7}]}}}`, `{}`, false},
		// match_nor_test
		{`{"x": {"$nor": []}}`, `{"x": 0}`, true},
		{`{"x": {"$nor": []}}`, `{}`, true},
		{`{"x": {"$nor": [{"$lt": 3}, {"$gt": 7}]}}`, `{"x": 6}`, true},
		{`{"x": {"$nor": [{"$lt": 3}, {"$gt": 7}]}}`, `{"x": 2}`, false},
		{`{"x": {"$nor": [{"$lt": 3}, {"$gt": 7}]}}`, `{}`, false},
		{`{"$nor": [{"a": 1}, {"b": 1}]}`, `{"a": 2, "b": 2}`, true},
		{`{"$nor": [{"a": 1}, {"b": 1}]}`, `{"a": 2, "b": 1}`, false},
		// top-level $or, implicit $and
		{`{"$or": [{"owner": "alice"}, {"shared": true}]}`, `{"owner": "bob", "shared": true}`, true},
		{`{"$or": [{"owner": "alice"}, {"shared": true}]}`, `{"owner": "bob"}`, false},
		{`{"type": "note", "owner": "alice"}`, `{"type": "note", "owner": "alice"}`, true},
		{`{"type": "note", "owner": "alice"}`, `{"type": "note", "owner": "bob"}`, false},
		// field paths: nested, array positions, escaped dots, first of duplicate names
		{`{"a.b.c": 1}`, `{"a": {"b": {"c": 1}}}`, true},
		{`{"a": {"b": {"c": 1}}}`, `{"a": {"b": {"c": 1}}}`, true},
		{`{"a.1": "y"}`, `{"a": ["x", "y"]}`, true},
		{`{"a.2": "y"}`, `{"a": ["x", "y"]}`, false},
		{`{"a.2": {"$exists": false}}`, `{"a": ["x", "y"]}`, false}, // bad_path, not not_found
		{`{"a.b": {"$exists": false}}`, `{"a": {}}`, true},
		{`{"a.b": {"$exists": false}}`, `{"a": 1}`, false}, // bad_path
		{`{"a\\.b": 1}`, `{"a.b": 1}`, true},
		{`{"a\\.b": 1}`, `{"a": {"b": 1}}`, false},
		{`{"a.b\\.c": 1}`, `{"a": {"b.c": 1}}`, true},
		{`{"a": 1}`, `{"a": 1, "a": 2}`, true},
		{`{"a": 2}`, `{"a": 1, "a": 2}`, false},
		// _id is compared byte by byte (cmp_raw); other strings collate
		{`{"_id": {"$gt": "a"}}`, `{"_id": "B"}`, false},
		{`{"other": {"$gt": "a"}}`, `{"other": "B"}`, true},
		{`{"_id": {"$gt": 5}}`, `{"_id": "a"}`, true},
		{`{"_id": {"$in": ["x", "y"]}}`, `{"_id": "y"}`, true},
		{`{"_id": {"$regex": "^user:"}}`, `{"_id": "user:alice"}`, true},
		// deleted documents as CouchDB's filter sees them: {_id, _rev, _deleted: true}
		{`{"owner": "alice"}`, `{"_id": "d", "_rev": "2-x", "_deleted": true}`, false},
		{`{"_deleted": true}`, `{"_id": "d", "_rev": "2-x", "_deleted": true}`, true},
		{`{"_deleted": {"$exists": false}}`, `{"_id": "d", "_rev": "1-x"}`, true},
		// $text matches (CouchDB trusts its text index there)
		{`{"$text": "anything"}`, `{}`, true},
		// an $elemMatch of a not-array, $keyMapMatch of a not-object
		{`{"a": {"$elemMatch": {"$eq": 1}}}`, `{"a": {"0": 1}}`, false},
		{`{"a": {"$keyMapMatch": {"$eq": "k"}}}`, `{"a": ["k"]}`, false},
		{`{"a": {"$keyMapMatch": {"$eq": "k"}}}`, `{"a": {"k": 0}}`, true},
	} {
		s, err := Parse([]byte(tc.sel))
		if err != nil {
			t.Errorf("%s: %v", tc.sel, err)
			continue
		}
		got, err := s.MatchJSON([]byte(tc.doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.doc, err)
		}
		if got != tc.want {
			t.Errorf("%s on %s = %v, want %v", tc.sel, tc.doc, got, tc.want)
		}
	}
}

// TestParseErrors: what CouchDB rejects (ErrInvalid, naming the operator
// or field) and what the node leaves to the server (ErrUnsupported).
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		sel  string
		err  error
		want string // in the message
	}{
		{`{"a": {"$in": 1}}`, ErrInvalid, "$in"},
		{`{"a": {"$nin": "x"}}`, ErrInvalid, "$nin"},
		{`{"$and": {}}`, ErrInvalid, "$and"},
		{`{"$or": 1}`, ErrInvalid, "$or"},
		{`{"$nor": null}`, ErrInvalid, "$nor"},
		{`{"a": {"$not": 1}}`, ErrInvalid, "$not"},
		{`{"a": {"$exists": 1}}`, ErrInvalid, "$exists"},
		{`{"a": {"$type": 1}}`, ErrInvalid, "$type"},
		{`{"a": {"$mod": [1.5, 1]}}`, ErrInvalid, "$mod"},
		{`{"a": {"$mod": [2]}}`, ErrInvalid, "$mod"},
		{`{"a": {"$regex": 1}}`, ErrInvalid, "$regex"},
		{`{"a": {"$all": 1}}`, ErrInvalid, "$all"},
		{`{"a": {"$elemMatch": []}}`, ErrInvalid, "$elemMatch"},
		{`{"a": {"$allMatch": 1}}`, ErrInvalid, "$allMatch"},
		{`{"a": {"$keyMapMatch": "k"}}`, ErrInvalid, "$keyMapMatch"},
		{`{"a": {"$size": -1}}`, ErrInvalid, "$size"},
		{`{"a": {"$size": 1.0}}`, ErrInvalid, "$size"},
		{`{"a": {"$beginsWith": 1}}`, ErrInvalid, "$beginsWith"},
		{`{"$text": {}}`, ErrInvalid, "$text"},
		{`{"a": {"$where": "x"}}`, ErrInvalid, "$where"},
		{`{"a": {"$near": 1}}`, ErrInvalid, "$near"},
		{`{"a": {"$bogus": 1}}`, ErrInvalid, "$bogus"},
		{`{"$eq": 1}`, ErrInvalid, "missing a field name"},
		{`{"a": {"$text": "x"}}`, ErrInvalid, "field normalization"},
		{`{"$not": {"$text": "x"}}`, ErrInvalid, "$not"},
		{`[1]`, ErrInvalid, "JSON object"},
		{`{"a": 1`, ErrInvalid, "bad JSON"},
		{`{"a": {"$regex": "(a)\\1"}}`, ErrUnsupported, "$regex"},
		{`{"a": {"$regex": "(?=x)"}}`, ErrUnsupported, "$regex"},
		{`{"a": {"$mod": [0, 1]}}`, ErrUnsupported, "$mod"},
		{`{"a..b": 1}`, ErrUnsupported, `"a..b"`},
		{`{"$not": {"a": {"$elemMatch": {"$nor": [{"b": 1}]}}}}`, ErrUnsupported, "$nor"},
	} {
		_, err := Parse([]byte(tc.sel))
		if !errors.Is(err, tc.err) || !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("Parse(%s) = %v, want %v naming %s", tc.sel, err, tc.err, tc.want)
		}
	}
}

// TestDecode: documents decode with their members in order and numbers
// as jiffy decodes them, and Encode writes them back.
func TestDecode(t *testing.T) {
	for _, tc := range []struct{ in, out string }{
		{`{"b": 1, "a": [1.5, -2, 1e2, "x\"y\u00e9", true, false, null, {}], "a": 3}`, `{"b":1,"a":[1.5,-2,100,"x\"yé",true,false,null,{}],"a":3}`},
		{` [ ] `, `[]`},
		{`12345678901234567890`, `1.2345678901234567e+19`}, // beyond 64 bits: a float
	} {
		v, err := Decode([]byte(tc.in))
		if err != nil {
			t.Fatalf("Decode(%s): %v", tc.in, err)
		}
		if got := string(Encode(v)); got != tc.out {
			t.Errorf("Decode(%s) = %s, want %s", tc.in, got, tc.out)
		}
	}
	for _, bad := range []string{``, `{`, `{"a"}`, `[1,]`, `01`, `"\x01"`, `tru`, `1 2`, `{"a":1,}`, `-`, `"abc`} {
		if _, err := Decode([]byte(bad)); !errors.Is(err, ErrBadJSON) {
			t.Errorf("Decode(%q) = %v, want ErrBadJSON", bad, err)
		}
	}
}

// FuzzMatch: any selector that parses evaluates any document without a
// panic, and a decoded document survives Encode and Decode.
func FuzzMatch(f *testing.F) {
	f.Add(`{"a": {"$gt": 1}}`, `{"a": 2}`)
	f.Add(`{"a": {"$elemMatch": {"b": {"$in": [1, "x"]}}}}`, `{"a": [{"b": "x"}]}`)
	f.Add(`{"$or": [{"a.0": {"$regex": "^x"}}, {"b": {"$all": [[1]]}}]}`, `{"a": ["xy"], "b": [1]}`)
	f.Fuzz(func(t *testing.T, sel, doc string) {
		s, err := Parse([]byte(sel))
		if err != nil {
			return
		}
		v, err := Decode([]byte(doc))
		if err != nil {
			return
		}
		s.Match(v)
		w, err := Decode(Encode(v))
		if err != nil || !exactEqual(v, w) {
			t.Fatalf("round trip of %s: %v", doc, err)
		}
	})
}

// TestNodeSize: a compiled operator stays at 96 bytes (a per-user selector
// job holds two as long as it lives, parked or not).
func TestNodeSize(t *testing.T) {
	if s := unsafe.Sizeof(node{}); s > 96 {
		t.Fatalf("node is %d bytes, want at most 96", s)
	}
}
