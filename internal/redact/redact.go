// Package redact is couchrep's one home for credential redaction: every
// output path (log lines, HTTP API answers, admin answers, errors, the
// status page) shows credentials through it. It depends on nothing of ours,
// so the job store backends and the logger use it too.
package redact

import (
	"io"
	"net/url"
	"regexp"
	"strings"
)

// This file is couchrep's one home for credential redaction. Every output
// path (log lines, HTTP API answers, admin answers, errors, the status page)
// shows credentials through one policy: a secret is replaced by Mask, the
// user name and everything else stay readable (as CouchDB shows endpoint
// URLs). The forms covered: URL userinfo (endpoints, proxies, postgres://
// store URLs), "password=" settings and query parameters, JSON/Go-printed
// password fields (auth.basic, BasicPass), API keys and tokens as settings
// or JSON members (auth.iam.api_key, an IAM answer's access_token, a
// credential command's token), Authorization and Proxy-Authorization header
// values, bearer tokens and JWTs in free text, Cookie/Set-Cookie values and
// AuthSession cookies.

// Mask is what every credential is shown as.
const Mask = "*****"

// URL returns u (an endpoint, proxy or store URL) with the password
// of its userinfo and any "password" query parameter shown as Mask, the
// user name kept. A string that does not parse as a URL has everything
// between "://" and the last "@" of its authority masked. Strings without
// credentials come back unchanged.
func URL(u string) string {
	if !strings.Contains(u, "@") && !containsFold(u, "pass") {
		return u // the common case, without allocating
	}
	pu, err := url.Parse(u)
	if err == nil && pu.Scheme == "" {
		return Text(u) // a key=value connection string, a bare name
	}
	if err != nil {
		i := strings.Index(u, "://")
		if i < 0 {
			return Text(u)
		}
		rest := u[i+3:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
			return u[:i+3] + Mask + Text(rest[at:])
		}
		return Text(u)
	}
	changed := false
	user := ""
	if pu.User != nil {
		if _, has := pu.User.Password(); has {
			user = url.User(pu.User.Username()).String()
			pu.User = nil
			changed = true
		}
	}
	if q := secretSetting.ReplaceAllString(pu.RawQuery, "${1}"+Mask); q != pu.RawQuery {
		pu.RawQuery, changed = q, true
	}
	if !changed {
		return u
	}
	plain := pu.String()
	if i := strings.Index(plain, "://"); i >= 0 && user != "" {
		return plain[:i+3] + user + ":" + Mask + "@" + plain[i+3:]
	}
	return plain
}

// StripUserinfo returns u without the userinfo of its authority (whatever
// follows "://" up to the last "@" before the first "/"). It is the
// identity of an endpoint, not a display form: replication job ids hash
// it, so its result must never change.
func StripUserinfo(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		rest := u[i+3:]
		host := rest
		if slash := strings.IndexByte(rest, '/'); slash >= 0 {
			host = rest[:slash]
		}
		if at := strings.LastIndexByte(host, '@'); at >= 0 {
			u = u[:i+3] + rest[at+1:]
		}
	}
	return u
}

var (
	// textUserinfo matches the userinfo of URLs inside free text; the
	// password runs to the last "@" before the path.
	textUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^/@\s"':]*):([^/\s"']*)@`)
	// authHeader matches Authorization header values (any scheme).
	authHeader = regexp.MustCompile(`(?i)((?:proxy-)?authorization["']?\s*[:=]\s*["']?(?:[A-Za-z-]+\s+)?)[^\s"',;]+`)
	// cookieHeader matches Cookie and Set-Cookie header values.
	cookieHeader = regexp.MustCompile(`(?i)((?:set-)?cookie["']?\s*[:=]\s*["']?)[^"'\r\n]+`)
	// authSession matches CouchDB session cookies wherever they appear.
	authSession = regexp.MustCompile(`(?i)(AuthSession=)[^;\s"',]+`)
	// secretSetting matches password settings: key=value (libpq), "key":"value"
	// (JSON, auth.basic) and Key:value (Go's %+v of BasicPass).
	secretSetting = regexp.MustCompile(`(?i)(\b(?:basic_?)?(?:password|passwd|pass)["']?\s*[:=]\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&,;}\])]+)`)
	// secretJSON matches API key and token members of JSON objects
	// (auth.iam.api_key, an IAM answer's access_token, a command's token).
	secretJSON = regexp.MustCompile(`(?i)("(?:api_?key|(?:access_|refresh_|id_)?token)"\s*:\s*)"(?:[^"\\]|\\.)*"`)
	// secretForm matches API key and token settings and form fields
	// (apikey=..., token=...).
	secretForm = regexp.MustCompile(`(?i)(\b(?:api_?key|(?:access_|refresh_|id_)?token)=)[^\s&,;"']+`)
	// bearerToken matches a bearer token in free text ("Bearer <token>").
	bearerToken = regexp.MustCompile(`(?i)(\bbearer\s+)[A-Za-z0-9._~+/-]+=*`)
	// jwt matches a JSON Web Token anywhere (header.payload.signature,
	// the header a base64url JSON object).
	jwt = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*`)
)

// Text masks every credential appearing in s (an error message, a log
// line, a crash reason, a connection string): see the forms listed at the
// top of this file. Text without credentials comes back unchanged.
func Text(s string) string {
	if !mayHoldSecret(s) {
		return s
	}
	s = textUserinfo.ReplaceAllString(s, "${1}${2}:"+Mask+"@")
	s = authHeader.ReplaceAllString(s, "${1}"+Mask)
	s = cookieHeader.ReplaceAllString(s, "${1}"+Mask)
	s = authSession.ReplaceAllString(s, "${1}"+Mask)
	s = bearerToken.ReplaceAllStringFunc(s, func(m string) string {
		sub := bearerToken.FindStringSubmatch(m)
		if strings.HasPrefix(m[len(sub[1]):], Mask) {
			return m
		}
		return sub[1] + Mask
	})
	s = jwt.ReplaceAllString(s, Mask)
	s = secretJSON.ReplaceAllString(s, `${1}"`+Mask+`"`)
	s = secretForm.ReplaceAllString(s, "${1}"+Mask)
	return secretSetting.ReplaceAllStringFunc(s, func(m string) string {
		sub := secretSetting.FindStringSubmatch(m)
		v := sub[2]
		if v == Mask || v == `"`+Mask+`"` || v == "'"+Mask+"'" {
			return m
		}
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') {
			return sub[1] + v[:1] + Mask + v[:1]
		}
		return sub[1] + Mask
	})
}

// mayHoldSecret is Redact's prefilter: false when no pattern of Redact can
// match s (no "@", "auth", "cookie", "pass", "key", "token", "bearer" or
// "eyj" in any case).
func mayHoldSecret[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '@' {
			return true
		}
	}
	return containsFold(s, "auth") || containsFold(s, "cookie") || containsFold(s, "pass") ||
		containsFold(s, "key") || containsFold(s, "token") || containsFold(s, "bearer") || containsFold(s, "eyj")
}

// containsFold reports whether s contains sub (ASCII lower-case letters) in
// any case.
func containsFold[T string | []byte](s T, sub string) bool {
	lo, up := sub[0], sub[0]-'a'+'A'
	for i := 0; i+len(sub) <= len(s); i++ {
		if c := s[i]; (c == lo || c == up) && strings.EqualFold(string(s[i:i+len(sub)]), sub) {
			return true
		}
	}
	return false
}

// Writer returns w with everything written passed through Redact:
// the node's logger writes through it (internal/log.New), so no log line
// can print a credential, whichever path its text took.
func Writer(w io.Writer) io.Writer { return redactWriter{w} }

type redactWriter struct{ w io.Writer }

// Write writes Text(p) and reports p as written in full; p without
// anything Redact would change is written as it is, without allocating.
func (r redactWriter) Write(p []byte) (int, error) {
	if !mayHoldSecret(p) {
		return r.w.Write(p)
	}
	if _, err := io.WriteString(r.w, Text(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Error returns err with its text passed through Redact, for errors
// that leave the node (admin answers); errors.Is and errors.As still see
// err. Nil stays nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	return redactedError{err}
}

type redactedError struct{ err error }

func (e redactedError) Error() string { return Text(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }
