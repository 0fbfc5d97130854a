package couch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"
)

// Auth plugin names of CouchDB's [replicator] auth_plugins.
const (
	// AuthPluginSession is cookie authentication against /_session.
	AuthPluginSession = "couch_replicator_auth_session"
	// AuthPluginNoop sends the credentials as Basic auth on every request.
	AuthPluginNoop = "couch_replicator_auth_noop"
)

// DefaultAuthPlugins is CouchDB's auth_plugins default.
var DefaultAuthPlugins = []string{AuthPluginSession, AuthPluginNoop}

// Session defaults, as couch_replicator_auth_session's.
const (
	// DefaultSessionRefresh is session_refresh_interval_sec: how often a
	// cookie without Max-Age is renewed.
	DefaultSessionRefresh = 550 * time.Second
	// DefaultSessionMinUpdate is session_min_update_interval: a cookie
	// younger than this that is refused is not renewed at once.
	DefaultSessionMinUpdate = 5 * time.Second
)

// ErrSession: cookie authentication could not start (/_session refused the
// credentials, or answered without a cookie). The message never holds the
// credentials.
var ErrSession = errors.New("couch: session authentication failed")

// SessionOptions configure cookie authentication
// (couch_replicator_auth_session) for an endpoint with credentials.
type SessionOptions struct {
	// Fallback sends Basic auth when the server has no /_session (404),
	// as CouchDB's noop plugin after the session plugin does. Without it
	// such an endpoint fails.
	Fallback bool
	// RefreshInterval renews a cookie without Max-Age this often; a
	// cookie with one is renewed at 0.9 × Max-Age. Zero is 550 s.
	RefreshInterval time.Duration
	// MinUpdateInterval: a refused cookie younger than this is renewed
	// only once it is this old (the request fails meanwhile). Zero is 5 s;
	// negative is none.
	MinUpdateInterval time.Duration
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// Shared, when set, shares the session (its cookie) with the other
	// DBs of the process that reach the same server's /_session with the
	// same credentials and options (Sessions).
	Shared *Sessions
}

// Sessions shares cookie sessions among the DBs of a process (a node's
// jobs: SessionOptions.Shared): the DBs that reach one server's /_session
// with the same credentials and session options use one cookie, obtained
// once and renewed once, instead of one POST /_session per DB (each of
// which makes CouchDB hash the password). A session no DB uses any more
// is dropped. Safe for concurrent use.
type Sessions struct {
	mu sync.Mutex
	m  map[[sha256.Size]byte]weak.Pointer[session]
}

// NewSessions returns an empty Sessions.
func NewSessions() *Sessions {
	return &Sessions{m: map[[sha256.Size]byte]weak.Pointer[session]{}}
}

// get returns the session under key, or the one made by mk, registered.
func (ss *Sessions) get(key [sha256.Size]byte, mk func() *session) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.m[key].Value(); s != nil {
		return s
	}
	s := mk()
	ss.m[key] = weak.Make(s)
	runtime.AddCleanup(s, func(k [sha256.Size]byte) {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.m[k].Value() == nil {
			delete(ss.m, k)
		}
	}, key)
	return s
}

// len is how many sessions are registered (tests).
func (ss *Sessions) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.m)
}

// sessionMode is what a session found out about its endpoint.
type sessionMode int

const (
	sessionUnknown sessionMode = iota // /_session not asked yet
	sessionCookie                     // AuthSession cookies
	sessionBasic                      // no /_session: Basic auth
)

// session is one endpoint's cookie authentication: the cookie, its epoch
// (bumped on every new cookie, so a request refused with an old cookie is
// retried at once instead of renewing again) and when to renew it.
type session struct {
	opts       SessionOptions
	sessionURL string
	user, pass string

	mu               sync.Mutex
	mode             sessionMode
	cookie           string
	epoch            int
	obtained         time.Time
	nextRefresh      time.Time // zero: not scheduled
	requireValidUser bool
}

func newSession(d *DB, o SessionOptions) *session {
	if o.RefreshInterval <= 0 {
		o.RefreshInterval = DefaultSessionRefresh
	}
	if o.MinUpdateInterval == 0 {
		o.MinUpdateInterval = DefaultSessionMinUpdate
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	u := *d.ep.URL
	u.User, u.RawQuery, u.ForceQuery, u.Fragment = nil, "", false, ""
	u.Path, u.RawPath = "/_session", ""
	mk := func() *session {
		return &session{opts: o, sessionURL: u.String(), user: d.ep.Username, pass: d.ep.Password}
	}
	if o.Shared == nil {
		return mk()
	}
	// The key is a digest: the credentials stay out of the map's keys.
	key := sha256.Sum256(fmt.Appendf(nil, "%s\x00%s\x00%s\x00%t\x00%d\x00%d",
		u.String(), d.ep.Username, d.ep.Password, o.Fallback, o.RefreshInterval, o.MinUpdateInterval))
	return o.Shared.get(key, mk)
}

// authorize sets the request's credentials: the session cookie (getting or
// renewing it first when due), or Basic auth when the server has no
// /_session. It returns the cookie's epoch for handle.
func (s *session) authorize(ctx context.Context, d *DB, req *http.Request) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	if s.mode == sessionUnknown || (s.mode == sessionCookie && !s.nextRefresh.IsZero() && !now.Before(s.nextRefresh)) {
		if err := s.refresh(ctx, d); err != nil {
			return 0, err
		}
	}
	switch s.mode {
	case sessionCookie:
		req.Header.Set("Cookie", "AuthSession="+s.cookie)
	case sessionBasic:
		req.SetBasicAuth(s.user, s.pass)
	}
	return s.epoch, nil
}

// refresh POSTs the credentials to /_session (s.mu is held).
func (s *session) refresh(ctx context.Context, d *DB) error {
	s.nextRefresh = time.Time{}
	code, h, err := s.post(ctx, d)
	if err != nil {
		return err
	}
	if code == http.StatusUnauthorized && h.Get("WWW-Authenticate") != "" && !s.requireValidUser {
		// The server wants Basic auth even for /_session
		// (require_valid_user): ask again with it, and keep doing so.
		s.requireValidUser = true
		if code, h, err = s.post(ctx, d); err != nil {
			return err
		}
	}
	switch {
	case code == http.StatusOK:
		if !s.update(h) {
			if s.mode == sessionUnknown {
				return fmt.Errorf("%w: POST %s: 200 without an AuthSession cookie", ErrSession, s.sessionURL)
			}
			// Keep the old cookie; try again after the refresh interval.
			s.nextRefresh = s.opts.Now().Add(s.opts.RefreshInterval)
		}
		s.mode = sessionCookie
		return nil
	case code == http.StatusNotFound && s.mode == sessionUnknown:
		if !s.opts.Fallback {
			return fmt.Errorf("%w: POST %s: 404, the server has no /_session and no other auth plugin is configured", ErrSession, s.sessionURL)
		}
		d.log.Info().Str("url", s.sessionURL).Msg("couch: no /_session on this server; using basic auth")
		s.mode = sessionBasic
		return nil
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return &HTTPError{Method: http.MethodPost, URL: s.sessionURL, Status: code,
			ErrorName: "unauthorized", Reason: "session: the server refused the credentials of user " + strconv.Quote(s.user)}
	default:
		return &HTTPError{Method: http.MethodPost, URL: s.sessionURL, Status: code,
			Reason: "session: unexpected answer from /_session"}
	}
}

// post sends the credentials as a form, as CouchDB's plugin does.
func (s *session) post(ctx context.Context, d *DB) (int, http.Header, error) {
	body := url.Values{"name": {s.user}, "password": {s.pass}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.sessionURL, strings.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s", ErrSession, s.sessionURL)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", d.headers.Get("User-Agent"))
	if s.requireValidUser {
		req.SetBasicAuth(s.user, s.pass)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	drain(resp)
	return resp.StatusCode, resp.Header, nil
}

// update adopts an AuthSession cookie of h, if any (s.mu is held), and
// schedules its renewal: at 0.9 × Max-Age, or after RefreshInterval.
func (s *session) update(h http.Header) bool {
	cookie, maxAge, ok := parseAuthSession(h)
	if !ok {
		return false
	}
	if cookie == s.cookie && s.mode == sessionCookie {
		return true
	}
	now := s.opts.Now()
	s.cookie, s.epoch, s.obtained = cookie, s.epoch+1, now
	next := now.Add(s.opts.RefreshInterval)
	if maxAge >= 0 {
		next = now.Add(time.Duration(float64(maxAge)*0.9) * time.Second)
	}
	s.schedule(next)
	return true
}

// schedule moves the next renewal earlier, never later (s.mu is held).
func (s *session) schedule(t time.Time) {
	if s.nextRefresh.IsZero() || t.Before(s.nextRefresh) {
		s.nextRefresh = t
	}
}

// handle looks at a response to a request sent with epoch's cookie: a new
// cookie in a 2xx is adopted; a 401 or 403 renews the cookie and asks for
// the request to be sent again (retry), unless the cookie is younger than
// MinUpdateInterval, in which case the renewal waits and the answer stands.
func (s *session) handle(code int, h http.Header, epoch int) (retry bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode != sessionCookie {
		return false
	}
	switch {
	case code/100 == 2:
		s.update(h)
		return false
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		if epoch < s.epoch {
			return true // sent with an older cookie: the current one may do
		}
		now := s.opts.Now()
		if now.Sub(s.obtained) < s.opts.MinUpdateInterval {
			s.schedule(s.obtained.Add(s.opts.MinUpdateInterval))
			return false
		}
		s.schedule(now)
		return true
	}
	return false
}

// parseAuthSession finds the AuthSession cookie among h's Set-Cookie
// headers and its Max-Age (-1 when absent or not a non-negative integer).
func parseAuthSession(h http.Header) (cookie string, maxAge int, ok bool) {
	for _, line := range h.Values("Set-Cookie") {
		parts := strings.Split(line, ";")
		name, value, found := strings.Cut(strings.TrimSpace(parts[0]), "=")
		if !found || !strings.EqualFold(strings.TrimSpace(name), "AuthSession") {
			continue
		}
		maxAge = -1
		for _, attr := range parts[1:] {
			k, v, _ := strings.Cut(strings.TrimSpace(attr), "=")
			if strings.EqualFold(strings.TrimSpace(k), "Max-Age") {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
					maxAge = n
				}
			}
		}
		return strings.Trim(strings.TrimSpace(value), `"`), maxAge, true
	}
	return "", -1, false
}
