package replicate

import (
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// RepIDVersion is the replication-id algorithm implemented here
// (?REP_ID_VERSION in couch_replicator.hrl).
const RepIDVersion = 4

// DefaultUserAgent is the User-Agent CouchDB's replicator sends. A user header
// with exactly this value is dropped from the id, as CouchDB drops its own
// defaults (`Headers -- DefaultHeaders` in couch_replicator_ids).
const DefaultUserAgent = "CouchDB-Replicator/3.5.0"

// ErrFilterCodeNeeded is returned by ID for a named ("ddoc/name") filter when
// Params.FilterCode has not been filled in from the source design document.
var ErrFilterCodeNeeded = errors.New("replication: filter code not fetched")

// ID computes CouchDB's version-4 replication id for p: base is
// hex(md5(term_to_binary([ServerUUID, SrcInfo, TgtInfo | Filters]))) and ext
// is "+continuous" and/or "+create_target". The checkpoint document is
// _local/<base>; the job is known as base+ext.
//
// For a named filter, FilterCode must hold the function source from the
// source design document (see FetchFilterCode); it is trimmed as CouchDB trims
// it.
func ID(p Params, serverUUID string) (base, ext string, err error) {
	parts := etfList{etfBinary(serverUUID), endpointTerm(p.Source), endpointTerm(p.Target)}
	qp := any(etfTuple{etfList{}})
	if p.QueryParams != nil {
		if qp, err = ejson(p.QueryParams); err != nil {
			return "", "", fmt.Errorf("query_params: %w", err)
		}
	}
	switch {
	case p.Filter != "" && strings.HasPrefix(p.Filter, "_"):
		parts = append(parts, etfBinary(p.Filter), qp)
	case p.Filter != "":
		if !p.filterCodeSet {
			return "", "", ErrFilterCodeNeeded
		}
		parts = append(parts, etfBinary(trimFilterCode(p.FilterCode)), qp)
	case p.DocIDs != nil:
		ids := make(etfList, len(p.DocIDs))
		for i, id := range p.DocIDs {
			ids[i] = etfBinary(id)
		}
		parts = append(parts, ids)
	case p.Selector != nil:
		sel, err := ejson(p.Selector)
		if err != nil {
			return "", "", fmt.Errorf("selector: %w", err)
		}
		norm, err := normalizeSelector(sel)
		if err != nil {
			return "", "", err
		}
		parts = append(parts, ejsort(norm))
	}
	if p.WinningRevsOnly {
		parts = append(parts, etfBinary("winning_revs_only"))
	}
	if p.SinceSeq != nil {
		s, err := ejson(p.SinceSeq)
		if err != nil {
			return "", "", fmt.Errorf("since_seq: %w", err)
		}
		parts = append(parts, s)
	}
	bin, err := termToBinary(parts)
	if err != nil {
		return "", "", err
	}
	sum := md5.Sum(bin)
	base = hex.EncodeToString(sum[:])
	if p.Continuous {
		ext += "+continuous"
	}
	if p.CreateTarget {
		ext += "+create_target"
	}
	return base, ext, nil
}

// WithFilterCode returns p with the named filter's source code set (as read
// from the source design document's filters.<name>).
func (p Params) WithFilterCode(code string) Params {
	p.FilterCode, p.filterCodeSet = code, true
	return p
}

// trimFilterCode applies CouchDB's re:replace(Code, "^\s*(.*?)\s*$", "\\1"),
// where the Erlang string literal "\s" is a plain space and "." does not match
// a newline: leading/trailing spaces are removed only from single-line code
// (a final newline is kept).
func trimFilterCode(code string) string {
	body, nl := code, ""
	if strings.HasSuffix(body, "\n") {
		body, nl = body[:len(body)-1], "\n"
	}
	if strings.Contains(body, "\n") {
		// Try the other way: the match could also end at the very end.
		return code
	}
	return strings.Trim(body, " ") + nl
}

// endpointTerm builds {remote, User, Host, NonDefaultPort, Path, Headers,
// undefined} as couch_replicator_ids:get_v4_endpoint does after
// couch_replicator_utils:normalize_basic_auth.
func endpointTerm(ep EndpointParams) etfTuple {
	// lists:ukeymerge(1, UserHeaders, DefaultHeaders)
	defaults := []Header{{"Accept", "application/json"}, {"User-Agent", DefaultUserAgent}}
	headers := append([]Header(nil), ep.Headers...)
	for _, d := range defaults {
		found := false
		for _, h := range ep.Headers {
			if h.Name == d.Name {
				found = true
				break
			}
		}
		if !found {
			headers = append(headers, d)
		}
	}
	sort.SliceStable(headers, func(i, j int) bool { return headers[i].Name < headers[j].Name })

	headerUser, headers := removeBasicAuthFromHeaders(headers)
	urlUser, rawURL := extractCredsFromURL(ep.URL)
	var user any = etfAtom("undefined")
	switch {
	case ep.HasBasic:
		user = etfString(ep.BasicUser)
	case urlUser != nil:
		user = etfString(*urlUser)
	case headerUser != nil:
		user = etfString(*headerUser)
	}
	// Headers -- DefaultHeaders: remove the first exact occurrence of each.
	for _, d := range defaults {
		for i, h := range headers {
			if h == d {
				headers = append(headers[:i:i], headers[i+1:]...)
				break
			}
		}
	}
	hl := make(etfList, len(headers))
	for i, h := range headers {
		hl[i] = etfTuple{etfString(h.Name), etfString(h.Value)}
	}
	host, port, path := v4URLInfo(rawURL)
	return etfTuple{etfAtom("remote"), user, host, port, path, hl, etfAtom("undefined")}
}

// removeBasicAuthFromHeaders mirrors couch_replicator_utils'
// remove_basic_auth_from_headers: if an Authorization header exists the list
// goes through mochiweb_headers (names merged case-insensitively, sorted by
// lower-cased name); a "Basic <b64>" one is removed and decoded.
func removeBasicAuthFromHeaders(headers []Header) (*string, []Header) {
	auth, has := "", false
	for _, h := range headers {
		if strings.EqualFold(h.Name, "authorization") {
			if has {
				auth += ", " + h.Value
			} else {
				auth, has = h.Value, true
			}
		}
	}
	if !has {
		return nil, headers
	}
	// mochiweb_headers:make + to_list
	type entry struct {
		name  string
		value string
	}
	byKey := map[string]*entry{}
	var keys []string
	for _, h := range headers {
		k := strings.ToLower(h.Name)
		if e, ok := byKey[k]; ok {
			e.value += ", " + h.Value
			continue
		}
		byKey[k] = &entry{h.Name, h.Value}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	scheme, rest, _ := strings.Cut(auth, " ")
	isBasic := strings.ToLower(scheme) == "basic" && strings.HasPrefix(auth[len(scheme):], " ")
	var out []Header
	for _, k := range keys {
		if isBasic && k == "authorization" {
			continue
		}
		out = append(out, Header{byKey[k].name, byKey[k].value})
	}
	if !isBasic {
		return nil, out
	}
	dec, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, out
	}
	u, _, ok := strings.Cut(string(dec), ":")
	if !ok {
		return nil, out
	}
	return &u, out
}

// extractCredsFromURL returns the user from the URL's userinfo (split at the
// first ":"; no ":" means no credentials) and the URL without userinfo.
func extractCredsFromURL(u string) (*string, string) {
	i := strings.Index(u, "://")
	if i < 0 {
		return nil, u
	}
	authStart := i + 3
	authEnd := len(u)
	if j := strings.IndexAny(u[authStart:], "/?#"); j >= 0 {
		authEnd = authStart + j
	}
	at := strings.LastIndex(u[authStart:authEnd], "@")
	if at < 0 {
		return nil, u
	}
	userinfo := u[authStart : authStart+at]
	stripped := u[:authStart] + u[authStart+at+1:]
	user, _, ok := strings.Cut(userinfo, ":")
	if !ok {
		return nil, stripped
	}
	return &user, stripped
}

// v4URLInfo is get_v4_url_info: host, non-default port and path as
// ibrowse_lib:parse_url splits them (no scheme; 80/443/5984 are `default`).
func v4URLInfo(u string) (host, port, path any) {
	undef := etfAtom("undefined")
	fail := func() (any, any, any) { return etfString(u), undef, undef }
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok || scheme == "" {
		return fail()
	}
	var defPort int
	switch scheme {
	case "http":
		defPort = 80
	case "https":
		defPort = 443
	default:
		return fail()
	}
	end := strings.IndexAny(rest, "/?")
	hostport, p := rest, "/"
	if end >= 0 {
		hostport = rest[:end]
		if rest[end] == '?' {
			p = "/" + rest[end:]
		} else {
			p = rest[end:]
		}
	}
	h, portStr := hostport, ""
	if strings.HasPrefix(hostport, "[") {
		close := strings.Index(hostport, "]")
		if close < 0 {
			return fail()
		}
		h = hostport[1:close]
		after := hostport[close+1:]
		if after != "" {
			if !strings.HasPrefix(after, ":") {
				return fail()
			}
			portStr = after[1:]
		}
	} else if c := strings.Index(hostport, ":"); c >= 0 {
		h, portStr = hostport[:c], hostport[c+1:]
	}
	if h == "" {
		return fail()
	}
	n := defPort
	if portStr != "" {
		var err error
		if n, err = strconv.Atoi(portStr); err != nil {
			return fail()
		}
	}
	var portTerm any = n
	if (scheme == "https" && n == 443) || (scheme == "http" && (n == 80 || n == 5984)) {
		portTerm = etfAtom("default")
	}
	return etfString(h), portTerm, etfString(p)
}
