package httpapi

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// sessionCookie is the cookie's name, CouchDB's.
const sessionCookie = "AuthSession"

// DefaultSessionTimeout is how long a session cookie is valid when
// UsersOptions.SessionTimeout is zero: CouchDB's [chttpd_auth] timeout.
const DefaultSessionTimeout = 600 * time.Second

// Errors of a session cookie.
var (
	// ErrBadCookie: the cookie is not one couchrep signed (malformed, or
	// its signature does not match).
	ErrBadCookie = errors.New("httpapi: session cookie not signed by this cluster")
	// ErrCookieExpired: the cookie was signed, but its time is up.
	ErrCookieExpired = errors.New("httpapi: session cookie expired")
)

// sessionDomain separates the cookie's HMAC from any other use of the
// secret.
const sessionDomain = "couchrep-session-v1\x00"

// sessions signs and checks couchrep's own AuthSession cookies:
// base64url(JSON {name, roles, issued}) "." base64url(HMAC-SHA256). The
// secret comes from the job store (cluster.SessionSecret), so every node
// sharing it accepts every node's cookies. Since couchrep keeps no user
// database, the cookie carries the roles the auth server gave at login;
// like CouchDB's, it is valid for timeout after it was issued and renewed
// (a new cookie on an answer) once a tenth of that has passed.
type sessions struct {
	timeout  time.Duration
	now      func() time.Time
	secretFn func(context.Context) ([]byte, error)

	mu     sync.Mutex
	secret []byte
}

type sessionPayload struct {
	Name   string   `json:"n"`
	Roles  []string `json:"r"`
	Issued int64    `json:"t"`
}

func newSessions(timeout time.Duration, secret func(context.Context) ([]byte, error)) *sessions {
	if timeout <= 0 {
		timeout = DefaultSessionTimeout
	}
	if secret == nil {
		// No store to share it (a lone server in tests): one of this
		// process.
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			panic(fmt.Sprintf("httpapi: no randomness for the session secret: %v", err))
		}
		secret = func(context.Context) ([]byte, error) { return b, nil }
	}
	return &sessions{timeout: timeout, now: time.Now, secretFn: secret}
}

// key returns the secret, read once from where it is kept.
func (s *sessions) key(ctx context.Context) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.secret != nil {
		return s.secret, nil
	}
	b, err := s.secretFn(ctx)
	if err != nil {
		return nil, err
	}
	if len(b) < 16 {
		return nil, fmt.Errorf("httpapi: session secret of %d bytes, want at least 16", len(b))
	}
	s.secret = b
	return b, nil
}

func mac(key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(sessionDomain))
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// sign returns the cookie value for u, issued at issued.
func (s *sessions) sign(ctx context.Context, u UserCtx, issued time.Time) (string, error) {
	key, err := s.key(ctx)
	if err != nil {
		return "", err
	}
	roles := u.Roles
	if roles == nil {
		roles = []string{}
	}
	b, err := json.Marshal(sessionPayload{Name: u.Name, Roles: roles, Issued: issued.Unix()})
	if err != nil {
		return "", fmt.Errorf("httpapi: encode session: %w", err)
	}
	p := base64.RawURLEncoding.EncodeToString(b)
	return p + "." + base64.RawURLEncoding.EncodeToString(mac(key, p)), nil
}

// ours reports whether a cookie value has the shape of couchrep's (CouchDB's
// own are base64url without a ".").
func ours(value string) bool { return strings.Contains(value, ".") }

// verify checks a cookie value and returns its user and when it was issued.
func (s *sessions) verify(ctx context.Context, value string) (UserCtx, time.Time, error) {
	p, sig, ok := strings.Cut(value, ".")
	if !ok {
		return UserCtx{}, time.Time{}, ErrBadCookie
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return UserCtx{}, time.Time{}, ErrBadCookie
	}
	key, err := s.key(ctx)
	if err != nil {
		return UserCtx{}, time.Time{}, err
	}
	if !hmac.Equal(got, mac(key, p)) {
		return UserCtx{}, time.Time{}, ErrBadCookie
	}
	b, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return UserCtx{}, time.Time{}, ErrBadCookie
	}
	var pl sessionPayload
	if err := json.Unmarshal(b, &pl); err != nil || pl.Name == "" {
		return UserCtx{}, time.Time{}, ErrBadCookie
	}
	issued := time.Unix(pl.Issued, 0)
	if !s.now().Before(issued.Add(s.timeout)) {
		return UserCtx{}, time.Time{}, ErrCookieExpired
	}
	if pl.Roles == nil {
		pl.Roles = []string{}
	}
	return UserCtx{Name: pl.Name, Roles: pl.Roles, handler: "cookie"}, issued, nil
}

// stale reports whether a cookie issued at issued should be renewed: a
// tenth of its time has passed (CouchDB: TimeLeft < Timeout * 0.9).
func (s *sessions) stale(issued time.Time) bool {
	return s.now().Sub(issued) > s.timeout/10
}

// cookie is the Set-Cookie of a session value (empty: one that clears it),
// with CouchDB's attributes: Path=/, HttpOnly, Max-Age of the timeout,
// Secure over TLS.
func (s *sessions) cookie(r *http.Request, value string) *http.Cookie {
	c := &http.Cookie{Name: sessionCookie, Value: value, Path: "/", HttpOnly: true, Secure: r.TLS != nil}
	if value == "" {
		c.MaxAge = -1 // "Max-Age=0": the browser drops it
		return c
	}
	c.MaxAge = int(s.timeout / time.Second)
	c.Expires = s.now().Add(s.timeout).UTC()
	return c
}

// setCookie replaces any Set-Cookie of the answer with c.
func setCookie(w http.ResponseWriter, c *http.Cookie) {
	w.Header().Set("Set-Cookie", c.String())
}

// maxLoginBody bounds a POST /_session body.
const maxLoginBody = 64 << 10

// session is CouchDB's /_session: POST logs in (a form or JSON with name
// or username, and password) and sets a cookie every node of the cluster
// accepts; GET says who the request is; DELETE clears the cookie.
func (s *Server) session(w http.ResponseWriter, r *http.Request, _ string) error {
	switch r.Method {
	case http.MethodPost:
		return s.login(w, r)
	case http.MethodDelete:
		setCookie(w, s.users.sessions.cookie(r, ""))
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
		return nil
	}
	u, aerr := s.identify(w, r)
	if aerr != nil {
		return s.authFailed(w, aerr, false)
	}
	if u.Name == "" && r.URL.Query().Get("basic") == "true" {
		return s.authFailed(w, errorf(http.StatusUnauthorized, "unauthorized", "Please login."), true)
	}
	var name any
	if u.Name != "" {
		name = u.Name
	}
	roles := u.Roles
	if roles == nil {
		roles = []string{}
	}
	info := map[string]any{"authentication_handlers": []string{"cookie", "default"}}
	if u.handler != "" {
		info["authenticated"] = u.handler
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "userCtx": map[string]any{"name": name, "roles": roles}, "info": info})
	return nil
}

// login is POST /_session.
func (s *Server) login(w http.ResponseWriter, r *http.Request) error {
	client := clientOf(r)
	if aerr := s.blocked(client); aerr != nil {
		return s.authFailed(w, aerr, false)
	}
	name, password, aerr := loginForm(r)
	if aerr != nil {
		return aerr
	}
	u, aerr := s.checkPassword(r.Context(), client, name, password)
	if aerr != nil {
		if aerr.status == http.StatusUnauthorized {
			setCookie(w, s.users.sessions.cookie(r, ""))
		}
		return s.authFailed(w, aerr, false)
	}
	value, err := s.users.sessions.sign(r.Context(), u, s.users.sessions.now())
	if err != nil {
		s.log.Error().Err(err).Msg("POST /_session: cannot sign a session cookie")
		return errorf(http.StatusServiceUnavailable, "service_unavailable", "the job store is unavailable: cannot read the session secret")
	}
	setCookie(w, s.users.sessions.cookie(r, value))
	roles := u.Roles
	if roles == nil {
		roles = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "name": u.Name, "roles": roles})
	return nil
}

// loginForm reads the name and password of a POST /_session body, as
// CouchDB does: a form or a JSON object, "name" or "username" (both only
// if equal), "password" (empty if absent).
func loginForm(r *http.Request) (name, password string, _ *apiError) {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "application/x-www-form-urlencoded" && mt != "application/json" {
		return "", "", errorf(http.StatusUnsupportedMediaType, "bad_content_type", "Content-Type must be 'application/x-www-form-urlencoded' or 'application/json'")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxLoginBody+1))
	if err != nil {
		return "", "", errorf(http.StatusBadRequest, "bad_request", "cannot read the request body: %v", err)
	}
	if len(body) > maxLoginBody {
		return "", "", errorf(http.StatusRequestEntityTooLarge, "too_large", "the request body is more than the limit of %d bytes", maxLoginBody)
	}
	form := map[string]string{}
	if mt == "application/json" {
		if aerr := checkJSONBody(body); aerr != nil {
			return "", "", aerr
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			return "", "", errorf(http.StatusBadRequest, "bad_request", "invalid JSON: %v", err)
		}
		for _, k := range []string{"name", "username", "password"} {
			switch v := m[k].(type) {
			case nil:
			case string:
				form[k] = v
			default:
				return "", "", errorf(http.StatusBadRequest, "bad_request", "%s must be a string", k)
			}
		}
	} else {
		q, err := url.ParseQuery(string(body))
		if err != nil {
			return "", "", errorf(http.StatusBadRequest, "bad_request", "invalid form body")
		}
		for _, k := range []string{"name", "username", "password"} {
			if q.Has(k) {
				form[k] = q.Get(k)
			}
		}
	}
	n, hasName := form["name"]
	un, hasUsername := form["username"]
	switch {
	case !hasName && !hasUsername:
		return "", "", errorf(http.StatusBadRequest, "bad_request", "request body must contain a username")
	case hasName && hasUsername && n != un:
		return "", "", errorf(http.StatusBadRequest, "bad_request", "request body contains different usernames")
	case hasUsername:
		n = un
	}
	return n, form["password"], nil
}

// authFailed writes an authentication failure: Retry-After on a 429, and
// WWW-Authenticate on a 401 when challenge is set.
func (s *Server) authFailed(w http.ResponseWriter, aerr *apiError, challenge bool) *apiError {
	if aerr.status == http.StatusUnauthorized && challenge {
		w.Header().Set("WWW-Authenticate", `Basic realm="couchrep"`)
	}
	if aerr.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(aerr.retryAfter.Round(time.Second)/time.Second)+1))
	}
	return aerr
}
