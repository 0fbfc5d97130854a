package couch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestParseEndpoint(t *testing.T) {
	basicHdr := "Basic " + "aGRyOmhkcnB3" // hdr:hdrpw
	tests := []struct {
		name       string
		in         string // JSON
		url        string
		user, pass string
		headers    map[string]string
		err        string
	}{
		{name: "plain string adds slash", in: `"http://h:5984/db"`, url: "http://h:5984/db/"},
		{name: "keeps slash", in: `"https://h/db/"`, url: "https://h/db/"},
		{name: "query keeps no slash", in: `"http://h/db?x=1"`, url: "http://h/db?x=1"},
		{name: "userinfo moves to credentials", in: `"http://u:p%40ss@h/db"`, url: "http://h/db/", user: "u", pass: "p@ss"},
		{name: "escaped db name kept", in: `"http://h/a%2Fb"`, url: "http://h/a%2Fb/"},
		{name: "object with headers", in: `{"url":"http://h/db","headers":{"x-foo":"bar"}}`, url: "http://h/db/", headers: map[string]string{"X-Foo": "bar"}},
		{name: "basic header moves to credentials", in: `{"url":"http://h/db","headers":{"Authorization":"` + basicHdr + `"}}`, url: "http://h/db/", user: "hdr", pass: "hdrpw"},
		{name: "userinfo beats header", in: `{"url":"http://u:p@h/db","headers":{"authorization":"` + basicHdr + `"}}`, url: "http://h/db/", user: "u", pass: "p"},
		{name: "auth.basic beats userinfo", in: `{"url":"http://u:p@h/db","auth":{"basic":{"username":"a","password":"b"}}}`, url: "http://h/db/", user: "a", pass: "b"},
		{name: "bearer header stays a header", in: `{"url":"http://h/db","headers":{"Authorization":"Bearer x"}}`, url: "http://h/db/", headers: map[string]string{"Authorization": "Bearer x"}},
		{name: "other auth plugins ignored", in: `{"url":"http://h/db","auth":{"other":{"k":"v"}}}`, url: "http://h/db/"},
		{name: "local name", in: `"mydb"`, err: "local endpoints are not supported"},
		{name: "bad scheme", in: `"ftp://h/db"`, err: "invalid url"},
		{name: "no host", in: `"http:///db"`, err: "no host"},
		{name: "missing url", in: `{"headers":{}}`, err: `missing field "url"`},
		{name: "url not string", in: `{"url":5}`, err: `field "url" must be a string, got a number`},
		{name: "headers not object", in: `{"url":"http://h/db","headers":[]}`, err: `field "headers" must be an object`},
		{name: "header value not string", in: `{"url":"http://h/db","headers":{"a":1}}`, err: `field "headers.a" must be a string`},
		{name: "auth not object", in: `{"url":"http://h/db","auth":"x"}`, err: `field "auth" must be an object`},
		{name: "basic without password", in: `{"url":"http://h/db","auth":{"basic":{"username":"a"}}}`, err: `missing field "auth.basic.password"`},
		{name: "basic username number", in: `{"url":"http://h/db","auth":{"basic":{"username":1,"password":"x"}}}`, err: `field "auth.basic.username" must be a string`},
		{name: "not an endpoint", in: `[1]`, err: "must be a URL string or an object"},
		{name: "null", in: `null`, err: "missing endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep, err := ParseEndpoint(json.RawMessage(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.Is(err, ErrInvalidEndpoint) {
					t.Fatalf("err = %v, want ErrInvalidEndpoint containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := ep.URL.String(); got != tt.url {
				t.Errorf("URL = %q, want %q", got, tt.url)
			}
			if ep.Username != tt.user || ep.Password != tt.pass {
				t.Errorf("credentials = %q/%q, want %q/%q", ep.Username, ep.Password, tt.user, tt.pass)
			}
			if len(ep.Headers) != len(tt.headers) {
				t.Errorf("headers = %v, want %v", ep.Headers, tt.headers)
			}
			for k, v := range tt.headers {
				if ep.Headers.Get(k) != v {
					t.Errorf("header %s = %q, want %q", k, ep.Headers.Get(k), v)
				}
			}
		})
	}
}

func TestEndpointNeverShowsCredentials(t *testing.T) {
	ep, err := ParseEndpoint(`http://user:s3cret@h:5984/db`)
	if err != nil {
		t.Fatal(err)
	}
	j, _ := json.Marshal(struct{ E Endpoint }{ep})
	for _, s := range []string{ep.Redacted(), ep.String(), fmt.Sprintf("%v %+v %#v %s", ep, ep, ep, ep), string(j)} {
		if strings.Contains(s, "s3cret") || strings.Contains(s, "user") {
			t.Errorf("credentials leaked: %s", s)
		}
	}
	if _, err := ParseEndpoint("http://u:s3cret@h:bad port/db"); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("parse error leaks or is missing: %v", err)
	}
}

func TestServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h/db":           "http://h/",
		"http://h/prefix/db/":   "http://h/prefix/",
		"http://h/a%2Fb":        "http://h/",
		"http://h/x/a%2Fb?q=1":  "http://h/x/",
		"https://u:p@h:6984/db": "https://h:6984/",
	} {
		ep, err := ParseEndpoint(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := ep.ServerURL().String(); got != want {
			t.Errorf("ServerURL(%s) = %s, want %s", in, got, want)
		}
	}
}

func TestEscapeDocID(t *testing.T) {
	for id, want := range map[string]string{
		"plain":         "plain",
		"a/b":           "a%2Fb",
		"a b":           "a%20b",
		"ü":             "%C3%BC",
		"a+b":           "a%2Bb",
		"100%":          "100%25",
		"_design/x":     "_design/x",
		"_design/x/y":   "_design/x%2Fy",
		"_local/r+1":    "_local/r%2B1",
		"_designer":     "_designer",
		"q?x=1&y#z":     "q%3Fx%3D1%26y%23z",
		"~tilde.-_":     "~tilde.-_",
		"_design/a b+c": "_design/a%20b%2Bc",
	} {
		if got := escapeDocID(id); got != want {
			t.Errorf("escapeDocID(%q) = %q, want %q", id, got, want)
		}
	}
}

func TestSeq(t *testing.T) {
	tests := []struct {
		raw      string
		zero     bool
		param    string
		n        int64
		numeric  bool
		equalsTo string
	}{
		{raw: "", zero: true, param: "0", n: 0, numeric: true, equalsTo: "0"},
		{raw: "0", zero: true, param: "0", n: 0, numeric: true, equalsTo: `"0"`},
		{raw: "42", param: "42", n: 42, numeric: true, equalsTo: " 42 "},
		{raw: `"42"`, param: "42", n: 42, numeric: true, equalsTo: `"42"`},
		{raw: `"3-g1AAAA_x"`, param: "3-g1AAAA_x", equalsTo: `"3-g1AAAA_x"`},
		{raw: `[1,"abc"]`, param: `[1,"abc"]`, equalsTo: `[1,"abc"]`},
	}
	for _, tt := range tests {
		s := SeqOf([]byte(tt.raw))
		if s.IsZero() != tt.zero {
			t.Errorf("%s: IsZero = %v", tt.raw, s.IsZero())
		}
		if s.Param() != tt.param {
			t.Errorf("%s: Param = %q, want %q", tt.raw, s.Param(), tt.param)
		}
		n, ok := s.Int()
		if ok != tt.numeric || n != tt.n {
			t.Errorf("%s: Int = %d, %v", tt.raw, n, ok)
		}
		if !s.Equal(SeqOf([]byte(tt.equalsTo))) {
			t.Errorf("%s: not Equal to %s", tt.raw, tt.equalsTo)
		}
		if s.Equal(Seq(`"other"`)) {
			t.Errorf("%s: Equal to \"other\"", tt.raw)
		}
		b, _ := json.Marshal(struct{ S Seq }{s})
		var back struct{ S Seq }
		if err := json.Unmarshal(b, &back); err != nil || !back.S.Equal(s) {
			t.Errorf("%s: JSON round trip gave %s (%v)", tt.raw, b, err)
		}
	}
}
