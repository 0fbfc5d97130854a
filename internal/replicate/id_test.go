package replicate

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The expected ids below were computed with Erlang/OTP's own
// term_to_binary(Parts, [{minor_version, 1}]) and crypto:hash(md5, ...) by
// testdata/repid_vectors.erl, which builds Parts exactly as
// couch_replicator_ids:replication_id(Rep, 4) does and splits URLs with the
// real ibrowse_lib:parse_url/1 (apache/couchdb-ibrowse). Each case names the
// CouchDB source its expected endpoint tuple comes from:
//   - "v4_*": the rows of http_v4_endpoint_test_ in
//     src/couch_replicator/src/couch_replicator_ids.erl (apache/couchdb
//     a6778e5d), each giving {User, Host, Port, Path, Headers} for an input
//     {Url, Headers, Auth}; CouchDB adds the trailing "/" in
//     couch_replicator_parse:maybe_add_trailing_slash/1, so "/a/b" is "/a/b/".
//   - filter/selector/winning_revs_only/since_seq: maybe_append_filters/2 in
//     the same file, couch_replicator_filters:parse/1 and ejsort/1, and
//     mango_selector:normalize/1 (the normalised forms are the examples in
//     that module's comments).
const testUUID = "7d9c2a6b3f1e4d5c8a9b0c1d2e3f4a5b"

func basicHeader(user, pass string) string {
	return `"Authorization":"Basic ` + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + `"`
}

func TestIDMatchesCouchDB(t *testing.T) {
	tgt := `"target":"http://localhost:5984/tgt"`
	src := `"source":"http://127.0.0.1:5984/source"`
	tests := []struct {
		name, doc, uuid, base string
	}{
		{"v4_http_host", `{"source":"http://host",` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_https_host", `{"source":"https://host",` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_http_5984", `{"source":"http://host:5984",` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_http_port1", `{"source":"http://host:1",` + tgt + `}`, "", "367b7ba4a2e7dc704a2c91b48a2feb31"},
		{"v4_https_port2", `{"source":"https://host:2",` + tgt + `}`, "", "f22b61404f0a7da1977a81f737dbf025"},
		{"v4_header_hv", `{"source":{"url":"http://host","headers":{"h":"v"}},` + tgt + `}`, "", "5bd442ca22ee575e2a4ce48a44db37b2"},
		{"v4_path_ab", `{"source":"http://host/a/b",` + tgt + `}`, "", "dca7325236404c27e71496630efd14b2"},
		{"v4_user", `{"source":"http://user:pass@host",` + tgt + `}`, "", "7d7c88fab0737752fa9c074d40ff8332"},
		{"v4_user_port3", `{"source":"http://user:pass@host:3",` + tgt + `}`, "", "ebcd42a61e87fbbdba5f1c3cf15ccdfa"},
		{"v4_user_newpass", `{"source":"http://user:newpass@host",` + tgt + `}`, "", "7d7c88fab0737752fa9c074d40ff8332"},
		{"v4_basic_header", `{"source":{"url":"http://host","headers":{` + basicHeader("user", "pass") + `}},` + tgt + `}`, "", "7d7c88fab0737752fa9c074d40ff8332"},
		{"v4_basic_header_newpass", `{"source":{"url":"http://host","headers":{` + basicHeader("user", "newpass") + `}},` + tgt + `}`, "", "7d7c88fab0737752fa9c074d40ff8332"},
		{"v4_auth_beats_url_and_header", `{"source":{"url":"http://user1:pass1@host","headers":{` + basicHeader("user2", "pass2") + `},"auth":{"basic":{"username":"user3","password":"pass3"}}},` + tgt + `}`, "", "94160df9420c21bd653b272df416f6f3"},
		{"v4_auth_beats_header_keeps_h", `{"source":{"url":"http://host","headers":{"h":"v",` + basicHeader("user", "pass") + `},"auth":{"basic":{"username":"user2","password":"pass2"}}},` + tgt + `}`, "", "065fab2170422032dcee76f45293e0dd"},
		{"v4_auth_props", `{"source":{"url":"http://host","headers":{"h":"v"},"auth":{"basic":{"username":"user","password":"pass"}}},` + tgt + `}`, "", "099bba5945357dff71303578c42b7a43"},
		{"v4_bad_basic_header", `{"source":{"url":"http://host","headers":{"Authorization":"Basic bad"}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_default_headers_dropped", `{"source":{"url":"http://host","headers":{"Accept":"application/json"}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		// CouchDB 3.4.3's get_v4_endpoint takes only the basic user of
		// "auth" (couch_replicator_utils:get_basic_auth_creds): an expiring
		// credential (auth.iam, auth.bearer), whatever its key, token or
		// command, leaves the id of the same endpoint without it.
		{"v4_auth_iam", `{"source":{"url":"http://host","auth":{"iam":{"api_key":"key-1"}}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_auth_iam_other_key", `{"source":{"url":"http://host","auth":{"iam":{"api_key":"key-2"}}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_auth_bearer_command", `{"source":{"url":"http://host","auth":{"bearer":{"command":["mint","--ttl","60"]}}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_auth_bearer_file", `{"source":{"url":"http://host","auth":{"bearer":{"token_file":"/run/tok"}}},` + tgt + `}`, "", "a572013737e49389f3c04d2959bd1168"},
		{"v4_auth_iam_url_user", `{"source":{"url":"http://user:pass@host","auth":{"iam":{"api_key":"key-1"}}},` + tgt + `}`, "", "7d7c88fab0737752fa9c074d40ff8332"},
		{"plain", `{` + src + `,` + tgt + `}`, "", "ce06d2c1e44a4baefaed3eb7034dc191"},
		{"other_uuid", `{` + src + `,` + tgt + `}`, "another-server-uuid", "0b573c55b0a5d53bd77f9f89eed03be4"},
		{"https_8443_query", `{"source":"https://example.org:8443/db?x=1",` + tgt + `}`, "", "41dbfc2fdcb8101546f5dfdfc4bd1b3e"},
		{"ipv6", `{"source":"http://[::1]:15984/db",` + tgt + `}`, "", "263a75813c9b4eb438150f46fac3f217"},
		{"doc_ids_unquoted_sorted", `{` + src + `,` + tgt + `,"doc_ids":["c","a%2Fb","a+b","\u00fc","c"]}`, "", "084c48cf7e9bc56b9a6ad8c677eb8300"},
		{"filter_view", `{` + src + `,` + tgt + `,"filter":"_view","query_params":{"view":"d/v","n":1}}`, "", "bc42d09804441fe3abc5a022eb323409"},
		{"filter_builtin_no_qp", `{` + src + `,` + tgt + `,"filter":"_design"}`, "", "1995af1af09415bd9a7c409fc75711f4"},
		{"selector_implicit_eq", `{` + src + `,` + tgt + `,"selector":{"type":"a"}}`, "", "338c3da83b17db37a037cc50f2c9ac19"},
		{"selector_nested_fields_and", `{` + src + `,` + tgt + `,"selector":{"a":{"b":{"$gt":5}},"c":true}}`, "", "17c550211e0717f6ba506e48cab8f9ec"},
		{"selector_not_pushed_down", `{` + src + `,` + tgt + `,"selector":{"$not":{"n":{"$gt":10}}}}`, "", "8403a0fd8929c171ba2e5292510b6d8d"},
		{"winning_revs_only", `{` + src + `,` + tgt + `,"winning_revs_only":true}`, "", "428cc63a0a56855b843a4fca6524d779"},
		{"winning_revs_only_false", `{` + src + `,` + tgt + `,"winning_revs_only":false}`, "", "ce06d2c1e44a4baefaed3eb7034dc191"},
		{"since_seq_int", `{` + src + `,` + tgt + `,"since_seq":42}`, "", "f34ff504248d09cb46d9bc5b221849df"},
		{"since_seq_str", `{` + src + `,` + tgt + `,"since_seq":"42-g1AAAA"}`, "", "56614332faf57ae1457fa17aa7b72d17"},
		{"since_seq_bignum", `{` + src + `,` + tgt + `,"since_seq":12345678901234567890}`, "", "de3be9ff1070ac5fd4c1c7d5493b5c4e"},
		{"winning_and_since", `{` + src + `,` + tgt + `,"since_seq":7,"winning_revs_only":true}`, "", "b5c4cc07ca7a476e61ef12ef19faff77"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParseParams([]byte(tc.doc))
			if err != nil {
				t.Fatalf("ParseParams: %v", err)
			}
			uuid := tc.uuid
			if uuid == "" {
				uuid = testUUID
			}
			base, ext, err := ID(p, uuid)
			if err != nil {
				t.Fatalf("ID: %v", err)
			}
			if base != tc.base || ext != "" {
				t.Errorf("ID = %q%q, want %q", base, ext, tc.base)
			}
		})
	}
}

func TestIDUserFilter(t *testing.T) {
	doc := `{"source":"http://127.0.0.1:5984/source","target":"http://localhost:5984/tgt","filter":"f/by_type","query_params":{"t":"x"}}`
	p, err := ParseParams([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ID(p, testUUID); !errors.Is(err, ErrFilterCodeNeeded) {
		t.Fatalf("ID without code: err = %v, want ErrFilterCodeNeeded", err)
	}
	tests := []struct{ name, code, qp, want string }{
		// single-line code: surrounding spaces are trimmed
		{"trimmed", "  function(doc, req) { return doc.type === req.query.t; }  ", `{"t":"x"}`, "479e011a0ba318a9158500579b3752df"},
		{"no_query_params", "function(doc) { return true; }", "", "832bbd6b30a69e3548c2044815c46463"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := p
			p.QueryParams = nil
			if tc.qp != "" {
				p.QueryParams = []byte(tc.qp)
			}
			base, _, err := ID(p.WithFilterCode(tc.code), testUUID)
			if err != nil {
				t.Fatal(err)
			}
			if base != tc.want {
				t.Errorf("base = %s, want %s", base, tc.want)
			}
		})
	}
}

func TestIDExtension(t *testing.T) {
	tests := []struct{ opts, ext string }{
		{``, ``},
		{`,"continuous":true`, `+continuous`},
		{`,"create_target":true`, `+create_target`},
		{`,"create_target":true,"continuous":true`, `+continuous+create_target`},
	}
	for _, tc := range tests {
		p, err := ParseParams([]byte(`{"source":"http://127.0.0.1:5984/source","target":"http://localhost:5984/tgt"` + tc.opts + `}`))
		if err != nil {
			t.Fatal(err)
		}
		base, ext, err := ID(p, testUUID)
		if err != nil {
			t.Fatal(err)
		}
		// The extension does not change the base (checkpoints are shared).
		if base != "ce06d2c1e44a4baefaed3eb7034dc191" || ext != tc.ext {
			t.Errorf("%s: got %s%s, want ce06d2c1e44a4baefaed3eb7034dc191%s", tc.opts, base, ext, tc.ext)
		}
	}
}

func TestTrimFilterCode(t *testing.T) {
	tests := []struct{ in, want string }{
		{"  f()  ", "f()"},
		{"f() \n", "f()\n"},
		{"\tf()\t", "\tf()\t"}, // Erlang's "\s" is a space only
		{"function(doc) {\n  return true;\n}  ", "function(doc) {\n  return true;\n}  "},
	}
	for _, tc := range tests {
		if got := trimFilterCode(tc.in); got != tc.want {
			t.Errorf("trimFilterCode(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestTermToBinary(t *testing.T) {
	// Bytes printed by Erlang/OTP 25: term_to_binary([<<"u">>, {remote,
	// undefined, "host", default, "/", [], undefined}, 1, 300, -5, 1.5,
	// 99999999999, <<"winning_revs_only">>, {[{<<"a">>, null}]}],
	// [{minor_version,1}]).
	want := []byte{131, 108, 0, 0, 0, 9, 109, 0, 0, 0, 1, 117, 104, 7, 100, 0, 6, 114, 101, 109, 111, 116, 101, 100, 0, 9, 117, 110, 100, 101, 102, 105, 110, 101, 100, 107, 0, 4, 104, 111, 115, 116, 100, 0, 7, 100, 101, 102, 97, 117, 108, 116, 107, 0, 1, 47, 106, 100, 0, 9, 117, 110, 100, 101, 102, 105, 110, 101, 100, 97, 1, 98, 0, 0, 1, 44, 98, 255, 255, 255, 251, 70, 63, 248, 0, 0, 0, 0, 0, 0, 110, 5, 0, 255, 231, 118, 72, 23, 109, 0, 0, 0, 17, 119, 105, 110, 110, 105, 110, 103, 95, 114, 101, 118, 115, 95, 111, 110, 108, 121, 104, 1, 108, 0, 0, 0, 1, 104, 2, 109, 0, 0, 0, 1, 97, 100, 0, 4, 110, 117, 108, 108, 106, 106}
	u := etfAtom("undefined")
	obj, err := ejson([]byte(`{"a":null}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := termToBinary(etfList{etfBinary("u"),
		etfTuple{etfAtom("remote"), u, etfString("host"), etfAtom("default"), etfString("/"), etfList{}, u},
		1, 300, -5, 1.5, int64(99999999999), etfBinary("winning_revs_only"), obj})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("termToBinary:\n got %v\nwant %v", got, want)
	}
	// The large forms, from the ETF specification: LARGE_TUPLE_EXT (105)
	// with a four-byte arity past 255 elements, LARGE_BIG_EXT (111) with a
	// four-byte length past 255 bytes of magnitude (sign, then little-endian
	// digits).
	tuple := make(etfTuple, 256)
	wantTuple := []byte{131, 105, 0, 0, 1, 0}
	for i := range tuple {
		tuple[i] = 7
		wantTuple = append(wantTuple, 97, 7)
	}
	huge := new(big.Int).Lsh(big.NewInt(1), 8*255) // 256 bytes of magnitude
	wantBig := append([]byte{131, 111, 0, 0, 1, 0, 1}, make([]byte, 255)...)
	wantBig = append(wantBig, 1)
	for _, tc := range []struct {
		name string
		term any
		want []byte
	}{
		{"large tuple", tuple, wantTuple},
		{"large negative bignum", new(big.Int).Neg(huge), wantBig},
	} {
		if got, err := termToBinary(tc.term); err != nil || string(got) != string(tc.want) {
			t.Errorf("%s: termToBinary = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := termToBinary(struct{}{}); err == nil || !strings.Contains(err.Error(), "unsupported") {
		t.Errorf("unsupported type: err = %v", err)
	}
}

// TestSelectorIDsPinned pins the replication ids of 800 selectors (the
// selectors of internal/mango's and integration's tests, each also as
// {"x": S} and {"x": {"$not": S}}, and edge cases: escaped dots, bignums,
// floats, $text, $size, every operator's bad arguments) to those the
// id's own normaliser gave before internal/mango's became the one
// normaliser of both (testdata/selector_ids.json): the same id, or
// invalid for the same selectors.
func TestSelectorIDsPinned(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "selector_ids.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Selector string `json:"selector"`
		ID       string `json:"id"`
		Invalid  bool   `json:"invalid"`
	}
	if err := json.Unmarshal(raw, &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		p, err := ParseParams([]byte(`{"source":"http://a/s","target":"http://b/t","selector":` + r.Selector + `}`))
		var id string
		if err == nil {
			var base, ext string
			base, ext, err = ID(p, "0d5b6a3c9e1f4a7b8c2d3e4f5a6b7c8d")
			id = base + ext
		}
		switch {
		case r.Invalid && err == nil:
			t.Errorf("%s: id %s, want it rejected", r.Selector, id)
		case !r.Invalid && err != nil:
			t.Errorf("%s: %v, want id %s", r.Selector, err, r.ID)
		case !r.Invalid && id != r.ID:
			t.Errorf("%s: id %s, want %s", r.Selector, id, r.ID)
		}
	}
	if len(rows) < 800 {
		t.Errorf("%d selectors pinned, want at least 800", len(rows))
	}
}
