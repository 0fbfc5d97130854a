package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

// TestAuthCache: entries live for the TTL, the cache holds at most max
// (least recently used out first), a TTL of zero keeps nothing, and no
// entry holds the name's password or anything it could be recovered from
// but the user_ctx.
func TestAuthCache(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := newAuthCache(10*time.Second, 3)
	c.now = clk.now
	joe := UserCtx{Name: "joe", Roles: []string{"erlanger"}}
	kJoe := c.credKey("basic", "joe", "erly-secret")
	c.put(kJoe, joe)

	for _, tc := range []struct {
		name string
		key  [32]byte
		ok   bool
	}{
		{"same credentials", c.credKey("basic", "joe", "erly-secret"), true},
		{"other password", c.credKey("basic", "joe", "erly"), false},
		{"split differently", c.credKey("basic", "joe:erly", "-secret"), false},
		{"a cookie of the same text", c.credKey("cookie", "joe", "erly-secret"), false},
	} {
		if u, ok := c.get(tc.key); ok != tc.ok || (ok && u.Name != "joe") {
			t.Errorf("%s: get = %v, %v; want ok %v", tc.name, u, ok, tc.ok)
		}
	}

	// Nothing in the cache is the password (or name:password, or its
	// base64 as sent in the header).
	dump := fmt.Sprintf("%#v", c.entries)
	for el := c.lru.Front(); el != nil; el = el.Next() {
		dump += fmt.Sprintf("%#v", *el.Value.(*cacheEntry))
	}
	for _, secret := range []string{"erly-secret", "am9lOmVybHktc2VjcmV0"} {
		if strings.Contains(dump, secret) {
			t.Fatalf("the cache holds %q: %s", secret, dump)
		}
	}
	if !strings.Contains(dump, `"joe"`) {
		t.Fatalf("the dump does not show the entry at all (the check above proves nothing): %s", dump)
	}

	// A caller changing its roles slice does not change the cached entry.
	roles := []string{"a"}
	kR := c.credKey("basic", "r", "pw")
	c.put(kR, UserCtx{Name: "r", Roles: roles})
	roles[0] = "_admin"
	if u, _ := c.get(kR); u.IsAdmin() {
		t.Fatal("the cache shares the caller's roles slice")
	}

	// Expiry.
	clk.t = clk.t.Add(10 * time.Second)
	if _, ok := c.get(kJoe); ok {
		t.Fatal("an entry outlived its TTL")
	}

	// Bounded, least recently used out first: r's entry, then u1 and u2;
	// u0, older than both but used again, stays.
	keys := make([][32]byte, 5)
	for i := range keys {
		keys[i] = c.credKey("basic", fmt.Sprint("u", i), "pw")
		c.put(keys[i], UserCtx{Name: fmt.Sprint("u", i)})
		if i == 2 {
			c.get(keys[0]) // u0 used again
		}
	}
	if n := c.len(); n != 3 {
		t.Fatalf("cache holds %d entries, want its bound 3", n)
	}
	for i, want := range []bool{true, false, false, true, true} {
		if _, ok := c.get(keys[i]); ok != want {
			t.Errorf("u%d cached = %v, want %v", i, ok, want)
		}
	}

	// TTL zero: nothing kept.
	none := newAuthCache(0, 3)
	none.put(kJoe, joe)
	if _, ok := none.get(kJoe); ok || none.len() != 0 {
		t.Fatal("a cache with TTL 0 kept an entry")
	}
}

// TestSessionCookie: a cookie verifies with the secret it was signed with,
// for timeout after it was issued; a changed payload or signature, another
// cluster's secret or CouchDB's own cookie format does not; the renewal
// point is a tenth of the timeout; the Set-Cookie has CouchDB's attributes.
func TestSessionCookie(t *testing.T) {
	ctx := context.Background()
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	secret := []byte("0123456789abcdef0123456789abcdef")
	newS := func(sec []byte) *sessions {
		s := newSessions(600*time.Second, func(context.Context) ([]byte, error) { return sec, nil })
		s.now = clk.now
		return s
	}
	s := newS(secret)
	joe := UserCtx{Name: "joe", Roles: []string{"erlanger"}}
	v, err := s.sign(ctx, joe, clk.t)
	if err != nil {
		t.Fatal(err)
	}
	if !ours(v) {
		t.Fatalf("cookie %q is not recognised as couchrep's", v)
	}
	u, issued, err := s.verify(ctx, v)
	if err != nil || u.Name != "joe" || len(u.Roles) != 1 || u.Roles[0] != "erlanger" || !issued.Equal(clk.t) || u.handler != "cookie" {
		t.Fatalf("verify = %+v %v %v", u, issued, err)
	}
	if u2, _, err := newS(append([]byte(nil), secret...)).verify(ctx, v); err != nil || u2.Name != "joe" {
		t.Fatalf("another node with the same secret: %v %v", u2, err)
	}

	payload, sig, _ := strings.Cut(v, ".")
	forged, err := newS([]byte("another cluster's secret, 32 b..")).sign(ctx, UserCtx{Name: "joe", Roles: []string{"_admin"}}, clk.t)
	if err != nil {
		t.Fatal(err)
	}
	forgedPayload, _, _ := strings.Cut(forged, ".")
	for _, tc := range []struct {
		name, value string
		want        error
	}{
		{"another cluster's secret", forged, ErrBadCookie},
		{"payload swapped (roles raised)", forgedPayload + "." + sig, ErrBadCookie},
		{"signature cut", payload + "." + sig[:len(sig)-2], ErrBadCookie},
		{"signature not base64", payload + ".!!!", ErrBadCookie},
		{"no signature", payload, ErrBadCookie},
		{"empty", "", ErrBadCookie},
		// CouchDB's: base64url("joe:5F3A2B1C:<hmac>").
		{"CouchDB's cookie", "am9lOjVGM0EyQjFDOsKlwqzDow", ErrBadCookie},
	} {
		if _, _, err := s.verify(ctx, tc.value); !errors.Is(err, tc.want) {
			t.Errorf("%s: verify = %v, want %v", tc.name, err, tc.want)
		}
	}
	if ours("am9lOjVGM0EyQjFDOsKlwqzDow") {
		t.Error("CouchDB's cookie format taken for couchrep's")
	}

	// Renewal after a tenth, expiry at the timeout.
	clk.t = clk.t.Add(60 * time.Second)
	if s.stale(issued) {
		t.Error("stale at exactly a tenth")
	}
	clk.t = clk.t.Add(time.Second)
	if !s.stale(issued) {
		t.Error("not stale past a tenth")
	}
	clk.t = issued.Add(599 * time.Second)
	if _, _, err := s.verify(ctx, v); err != nil {
		t.Errorf("valid until the timeout: %v", err)
	}
	clk.t = issued.Add(600 * time.Second)
	if _, _, err := s.verify(ctx, v); !errors.Is(err, ErrCookieExpired) {
		t.Errorf("at the timeout: %v, want ErrCookieExpired", err)
	}

	// The secret is read once; an error to read it is not a bad cookie.
	calls := 0
	failing := newSessions(0, func(context.Context) ([]byte, error) { calls++; return nil, errors.New("store down") })
	if _, _, err := failing.verify(ctx, v); err == nil || errors.Is(err, ErrBadCookie) {
		t.Errorf("verify with the store down = %v, want the store's error", err)
	}
	if failing.timeout != DefaultSessionTimeout {
		t.Errorf("default timeout %v", failing.timeout)
	}
	reads := 0
	once := newSessions(0, func(context.Context) ([]byte, error) { reads++; return secret, nil })
	for range 3 {
		if _, err := once.sign(ctx, joe, clk.t); err != nil {
			t.Fatal(err)
		}
	}
	if reads != 1 {
		t.Errorf("secret read %d times, want once", reads)
	}
}

// TestSessionCookieRenewed: an answer to a request whose cookie is past a
// tenth of its time carries a new cookie; a young cookie gets none.
func TestSessionCookieRenewed(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := New(Options{Admins: map[string]string{"admin": "pw"}, Users: UsersOptions{SessionTimeout: 600 * time.Second}})
	s.users.sessions.now = clk.now
	v, err := s.users.sessions.sign(context.Background(), UserCtx{Name: "admin", Roles: []string{RoleAdmin}}, clk.t)
	if err != nil {
		t.Fatal(err)
	}
	get := func() *http.Response {
		req := httptest.NewRequest(http.MethodGet, "/_session", nil)
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: v})
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"name":"admin"`) {
			t.Fatalf("GET /_session with the cookie: %d %s", w.Code, w.Body)
		}
		return w.Result()
	}
	for _, tc := range []struct {
		age   time.Duration
		renew bool
	}{{0, false}, {60 * time.Second, false}, {61 * time.Second, true}, {599 * time.Second, true}} {
		clk.t = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(tc.age)
		var got *http.Cookie
		for _, c := range get().Cookies() {
			if c.Name == sessionCookie {
				got = c
			}
		}
		if (got != nil) != tc.renew {
			t.Fatalf("cookie %v old: renewed %v, want %v", tc.age, got != nil, tc.renew)
		}
		if got != nil {
			u, issued, err := s.users.sessions.verify(context.Background(), got.Value)
			if err != nil || u.Name != "admin" || !issued.Equal(clk.t) || got.MaxAge != 600 {
				t.Fatalf("renewed cookie: %+v %v %v Max-Age %d", u, issued, err, got.MaxAge)
			}
		}
	}
}
