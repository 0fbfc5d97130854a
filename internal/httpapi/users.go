package httpapi

import (
	"container/list"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
)

// UserCtx is who a request acts as, CouchDB's user_ctx: a name ("" for an
// anonymous request) and roles. The role "_admin" makes a server admin.
type UserCtx struct {
	Name  string
	Roles []string
	// handler is how the user was authenticated, as GET /_session shows it:
	// "cookie", "default" (Basic credentials) or "" (not at all).
	handler string
}

// Role names with a meaning of their own, as in CouchDB.
const (
	RoleAdmin   = "_admin"
	RoleMetrics = "_metrics"
)

// IsAdmin reports whether u is a server admin.
func (u UserCtx) IsAdmin() bool { return slices.Contains(u.Roles, RoleAdmin) }

func (u UserCtx) has(role string) bool { return slices.Contains(u.Roles, role) }

type userKey struct{}

func withUser(ctx context.Context, u UserCtx) context.Context {
	return context.WithValue(ctx, userKey{}, u)
}

// userOf is the request's user name ("" when anonymous).
func userOf(ctx context.Context) string { return userCtxOf(ctx).Name }

func userCtxOf(ctx context.Context) UserCtx { u, _ := ctx.Value(userKey{}).(UserCtx); return u }

// Errors of the auth server.
var (
	// ErrBadCredentials: the auth server does not know the name and
	// password (or the cookie).
	ErrBadCredentials = errors.New("httpapi: name or password is incorrect")
	// ErrAuthServer: the auth server could not be asked, or gave an answer
	// that is neither a user nor a refusal.
	ErrAuthServer = errors.New("httpapi: auth server unavailable")
)

// maxSessionAnswer bounds what is read of the auth server's GET /_session.
const maxSessionAnswer = 64 << 10

// DefaultAuthServerTimeout bounds one question to the auth server when
// Options.AuthClient has no timeout of its own.
const DefaultAuthServerTimeout = 10 * time.Second

// authServer asks a CouchDB server who a request's credentials are:
// GET /_session with them, the way CouchDB itself decides.
type authServer struct {
	url    string // ".../_session", without userinfo
	client *http.Client
}

func newAuthServer(server string, client *http.Client) (*authServer, error) {
	u, err := url.Parse(server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("httpapi: auth server %q: not an http(s) URL", redact.URL(server))
	}
	// The server's own credentials (a watch URL may carry them) are never
	// sent with a user's.
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	u.Path = strings.TrimSuffix(u.Path, "/") + "/_session"
	u.RawPath = ""
	if client == nil {
		client = &http.Client{Timeout: DefaultAuthServerTimeout}
	}
	return &authServer{url: u.String(), client: client}, nil
}

// basic asks who name/password are.
func (a *authServer) basic(ctx context.Context, name, password string) (UserCtx, error) {
	return a.ask(ctx, func(h *http.Request) { h.SetBasicAuth(name, password) })
}

// cookie asks who a CouchDB AuthSession cookie is.
func (a *authServer) cookie(ctx context.Context, value string) (UserCtx, error) {
	return a.ask(ctx, func(h *http.Request) { h.AddCookie(&http.Cookie{Name: sessionCookie, Value: value}) })
}

func (a *authServer) ask(ctx context.Context, with func(*http.Request)) (UserCtx, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		return UserCtx{}, fmt.Errorf("%w: %w", ErrAuthServer, err)
	}
	req.Header.Set("Accept", "application/json")
	with(req)
	resp, err := a.client.Do(req)
	if err != nil {
		// url.Error names the URL (no userinfo) and the cause, never the
		// request's headers.
		return UserCtx{}, fmt.Errorf("%w: %s", ErrAuthServer, redact.Text(err.Error()))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSessionAnswer))
	if err != nil {
		return UserCtx{}, fmt.Errorf("%w: reading GET %s: %w", ErrAuthServer, a.url, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return UserCtx{}, ErrBadCredentials
	case resp.StatusCode != http.StatusOK:
		return UserCtx{}, fmt.Errorf("%w: GET %s answered %d", ErrAuthServer, a.url, resp.StatusCode)
	}
	var s struct {
		UserCtx *struct {
			Name  *string  `json:"name"`
			Roles []string `json:"roles"`
		} `json:"userCtx"`
	}
	if err := json.Unmarshal(body, &s); err != nil || s.UserCtx == nil {
		return UserCtx{}, fmt.Errorf("%w: GET %s: not a CouchDB session answer", ErrAuthServer, a.url)
	}
	if s.UserCtx.Name == nil || *s.UserCtx.Name == "" {
		// Credentials the server ignored: as good as wrong ones.
		return UserCtx{}, ErrBadCredentials
	}
	roles := s.UserCtx.Roles
	if roles == nil {
		roles = []string{}
	}
	return UserCtx{Name: *s.UserCtx.Name, Roles: roles}, nil
}

// authCacheSize bounds the auth server's answers remembered.
const authCacheSize = 1024

// authCache remembers the auth server's answers for a short while, so that
// a client sending Basic credentials with every request does not cost a
// round trip each. An entry is keyed by an HMAC of the credentials under a
// key of this process (so that neither the password nor a hash one could
// test guesses against offline is kept); it holds only the user_ctx. The
// cache is bounded: the least recently used entry goes first.
type authCache struct {
	ttl time.Duration
	max int
	now func() time.Time
	key [32]byte

	mu      sync.Mutex
	entries map[[32]byte]*list.Element
	lru     *list.List // of *cacheEntry, most recently used first
}

type cacheEntry struct {
	key     [32]byte
	user    UserCtx
	expires time.Time
}

func newAuthCache(ttl time.Duration, max int) *authCache {
	c := &authCache{ttl: ttl, max: max, now: time.Now, entries: map[[32]byte]*list.Element{}, lru: list.New()}
	if _, err := rand.Read(c.key[:]); err != nil {
		panic(fmt.Sprintf("httpapi: no randomness for the auth cache: %v", err))
	}
	return c
}

// credKey is the cache key of credentials of one kind ("basic", "cookie").
func (c *authCache) credKey(kind string, parts ...string) [32]byte {
	m := hmac.New(sha256.New, c.key[:])
	m.Write([]byte(kind))
	for _, p := range parts {
		// Length-prefixed, so that ("a:b", "c") and ("a", "b:c") differ.
		fmt.Fprintf(m, "\x00%d:", len(p))
		m.Write([]byte(p))
	}
	var k [32]byte
	copy(k[:], m.Sum(nil))
	return k
}

func (c *authCache) get(k [32]byte) (UserCtx, bool) {
	if c.ttl <= 0 {
		return UserCtx{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return UserCtx{}, false
	}
	e := el.Value.(*cacheEntry)
	if !c.now().Before(e.expires) {
		c.lru.Remove(el)
		delete(c.entries, k)
		return UserCtx{}, false
	}
	c.lru.MoveToFront(el)
	return e.user, true
}

func (c *authCache) put(k [32]byte, u UserCtx) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	exp := c.now().Add(c.ttl)
	u.Roles = slices.Clone(u.Roles)
	if el, ok := c.entries[k]; ok {
		e := el.Value.(*cacheEntry)
		e.user, e.expires = u, exp
		c.lru.MoveToFront(el)
		return
	}
	for c.lru.Len() >= c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.entries, old.Value.(*cacheEntry).key)
	}
	c.entries[k] = c.lru.PushFront(&cacheEntry{key: k, user: u, expires: exp})
}

func (c *authCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
