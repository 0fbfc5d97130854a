package couch

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/couchrep/couchrep/internal/redact"
)

// Endpoint is one database as a replication names it: its URL, extra
// headers and basic-auth credentials. The URL never carries userinfo; the
// credentials live only in Username and Password, and String, GoString and
// MarshalJSON all leave them out, so an Endpoint is safe to log.
type Endpoint struct {
	// URL is the database URL without userinfo. Its path ends in "/"
	// unless the URL has a query string (CouchDB's maybe_add_trailing_slash).
	URL *url.URL
	// Headers are the user's extra request headers, canonicalised, without
	// a basic Authorization header (that moves into Username/Password).
	Headers http.Header
	// Username and Password are the basic-auth credentials; empty for none.
	Username, Password string
	// Token, when set, is the endpoint's expiring credential ("auth":
	// {"iam": ...} or {"bearer": ...}), sent as a bearer token in place of
	// basic credentials.
	Token *TokenAuth
}

// ParseEndpoint parses a replication's "source" or "target" value as
// decoded from JSON: a URL string, or an object
// {"url": ..., "headers": {...}, "auth": {"basic": {"username": ..., "password": ...}}}.
// v may also be a json.RawMessage or []byte holding that JSON.
//
// Credentials follow CouchDB's precedence: auth.basic, then the URL's
// userinfo, then an "Authorization: Basic ..." header (which is removed
// from Headers). Errors wrap ErrInvalidEndpoint and name the bad field.
func ParseEndpoint(v any) (Endpoint, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return parseEndpointJSON(x)
	case []byte:
		return parseEndpointJSON(x)
	case string:
		return endpointFromParts(x, nil, nil)
	case map[string]any:
		return endpointFromObject(x)
	case Endpoint:
		return x, nil
	case nil:
		return Endpoint{}, fmt.Errorf("%w: missing endpoint", ErrInvalidEndpoint)
	default:
		return Endpoint{}, fmt.Errorf("%w: endpoint must be a URL string or an object, got %T", ErrInvalidEndpoint, v)
	}
}

func parseEndpointJSON(b []byte) (Endpoint, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return Endpoint{}, fmt.Errorf("%w: endpoint is not valid JSON: %v", ErrInvalidEndpoint, err)
	}
	if _, ok := v.([]byte); ok { // cannot happen; guards recursion
		return Endpoint{}, fmt.Errorf("%w: endpoint must be a URL string or an object", ErrInvalidEndpoint)
	}
	return ParseEndpoint(v)
}

func endpointFromObject(m map[string]any) (Endpoint, error) {
	rawURL, ok := m["url"]
	if !ok || rawURL == nil {
		return Endpoint{}, fmt.Errorf("%w: missing field \"url\"", ErrInvalidEndpoint)
	}
	s, ok := rawURL.(string)
	if !ok {
		return Endpoint{}, fmt.Errorf("%w: field \"url\" must be a string, got %s", ErrInvalidEndpoint, jsonType(rawURL))
	}
	var headers map[string]string
	if h, ok := m["headers"]; ok && h != nil {
		hm, ok := h.(map[string]any)
		if !ok {
			return Endpoint{}, fmt.Errorf("%w: field \"headers\" must be an object, got %s", ErrInvalidEndpoint, jsonType(h))
		}
		headers = make(map[string]string, len(hm))
		for k, v := range hm {
			vs, ok := v.(string)
			if !ok {
				return Endpoint{}, fmt.Errorf("%w: field \"headers.%s\" must be a string, got %s", ErrInvalidEndpoint, k, jsonType(v))
			}
			headers[k] = vs
		}
	}
	var basic *[2]string
	var tok *TokenAuth
	if a, ok := m["auth"]; ok && a != nil {
		am, ok := a.(map[string]any)
		if !ok {
			return Endpoint{}, fmt.Errorf("%w: field \"auth\" must be an object, got %s", ErrInvalidEndpoint, jsonType(a))
		}
		var err error
		if tok, err = ParseTokenAuth(am); err != nil {
			return Endpoint{}, err
		}
		// Other keys belong to auth plugins CouchDB may have; ignored as CouchDB's noop plugin does.
		if b, ok := am["basic"]; ok && b != nil {
			bm, ok := b.(map[string]any)
			if !ok {
				return Endpoint{}, fmt.Errorf("%w: field \"auth.basic\" must be an object, got %s", ErrInvalidEndpoint, jsonType(b))
			}
			var creds [2]string
			for i, f := range [2]string{"username", "password"} {
				fv, ok := bm[f]
				if !ok || fv == nil {
					return Endpoint{}, fmt.Errorf("%w: missing field \"auth.basic.%s\"", ErrInvalidEndpoint, f)
				}
				if creds[i], ok = fv.(string); !ok {
					return Endpoint{}, fmt.Errorf("%w: field \"auth.basic.%s\" must be a string, got %s", ErrInvalidEndpoint, f, jsonType(fv))
				}
			}
			basic = &creds
		}
	}
	ep, err := endpointFromParts(s, headers, basic)
	ep.Token = tok
	return ep, err
}

func endpointFromParts(raw string, headers map[string]string, basic *[2]string) (Endpoint, error) {
	if raw == "" {
		return Endpoint{}, fmt.Errorf("%w: field \"url\" is empty", ErrInvalidEndpoint)
	}
	lower := strings.ToLower(raw)
	if !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
		if !strings.Contains(raw, "://") {
			return Endpoint{}, fmt.Errorf("%w: local endpoints are not supported (%q is not an http:// or https:// URL)", ErrInvalidEndpoint, raw)
		}
		return Endpoint{}, fmt.Errorf("%w: endpoint has an invalid url (scheme must be http or https)", ErrInvalidEndpoint)
	}
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse's error quotes the input, credentials included: do not wrap it.
		return Endpoint{}, fmt.Errorf("%w: endpoint has an invalid url", ErrInvalidEndpoint)
	}
	if u.Host == "" {
		return Endpoint{}, fmt.Errorf("%w: endpoint has an invalid url (no host)", ErrInvalidEndpoint)
	}
	ep := Endpoint{Headers: http.Header{}}
	// Lowest precedence first; later sources overwrite.
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		v := headers[k]
		if http.CanonicalHeaderKey(k) == "Authorization" {
			if user, pass, ok := parseBasicAuth(v); ok {
				ep.Username, ep.Password = user, pass
				continue
			}
		}
		ep.Headers.Set(k, v)
	}
	if u.User != nil {
		ep.Username = u.User.Username()
		ep.Password, _ = u.User.Password()
		u.User = nil
	}
	if basic != nil {
		ep.Username, ep.Password = basic[0], basic[1]
	}
	u.Fragment, u.RawFragment = "", ""
	if u.RawQuery == "" && !u.ForceQuery && !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
		if u.RawPath != "" {
			u.RawPath += "/"
		}
	}
	ep.URL = u
	return ep, nil
}

func parseBasicAuth(v string) (user, pass string, ok bool) {
	const prefix = "basic "
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v[len(prefix):]))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(b), ":")
	return user, pass, ok
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// Redacted returns the URL for logs and APIs, through redact.URL (the URL
// carries no userinfo; a password query parameter is masked).
func (e Endpoint) Redacted() string {
	if e.URL == nil {
		return ""
	}
	return redact.URL(e.URL.String())
}

// String returns Redacted, so fmt never prints credentials.
func (e Endpoint) String() string { return e.Redacted() }

// GoString returns Redacted quoted, so %#v never prints credentials.
func (e Endpoint) GoString() string { return fmt.Sprintf("couch.Endpoint(%q)", e.Redacted()) }

// MarshalJSON encodes the redacted URL as a JSON string. Endpoint
// deliberately has no JSON form that carries credentials; store the
// replication's original source/target value instead.
func (e Endpoint) MarshalJSON() ([]byte, error) { return json.Marshal(e.Redacted()) }

// ServerURL returns the URL of the server root the database lives on: the
// database URL with its last path segment removed.
func (e Endpoint) ServerURL() *url.URL {
	if e.URL == nil {
		return nil
	}
	u := *e.URL
	u.User = nil
	u.RawQuery, u.ForceQuery = "", false
	p := strings.TrimSuffix(u.EscapedPath(), "/")
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[:i+1]
	} else {
		p = "/"
	}
	u.RawPath = p
	u.Path, _ = url.PathUnescape(p)
	return &u
}
