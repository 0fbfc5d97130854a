package couch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// sessionServer is a CouchDB-like server for cookie authentication: POST
// /_session with the right form issues a new AuthSession cookie (with
// maxAge, if set); every other request needs the current cookie or valid
// Basic credentials, else 401. Tests expire the cookie at will.
type sessionServer struct {
	*httptest.Server
	mu          sync.Mutex
	n           int    // cookies issued
	valid       string // the cookie currently accepted
	maxAge      int    // -1: no Max-Age
	noSession   bool   // /_session answers 404
	wantBasic   bool   // /_session requires Basic auth (require_valid_user)
	rotateOnGet bool   // the next GET answers with a fresh Set-Cookie
	posts       int
	withCookie  int
	withBasic   int
}

func newSessionServer(t *testing.T) *sessionServer {
	s := &sessionServer{maxAge: -1}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *sessionServer) issue(w http.ResponseWriter) {
	s.n++
	s.valid = fmt.Sprintf("cookie-%d", s.n)
	c := "AuthSession=" + s.valid + "; Version=1; Path=/; HttpOnly"
	if s.maxAge >= 0 {
		c += fmt.Sprintf("; Max-Age=%d", s.maxAge)
	}
	w.Header().Add("Set-Cookie", c)
}

func (s *sessionServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	user, pass, basic := r.BasicAuth()
	basicOK := basic && user == "bob" && pass == "hunter2"
	if r.URL.Path == "/_session" && r.Method == http.MethodPost {
		s.posts++
		if s.noSession {
			writeJSON(w, 404, `{"error":"not_found","reason":"missing"}`)
			return
		}
		if s.wantBasic && !basicOK {
			w.Header().Set("WWW-Authenticate", `Basic realm="server"`)
			writeJSON(w, 401, `{"error":"unauthorized","reason":"Authentication required."}`)
			return
		}
		_ = r.ParseForm()
		if r.PostForm.Get("name") != "bob" || r.PostForm.Get("password") != "hunter2" {
			writeJSON(w, 401, `{"error":"unauthorized","reason":"Name or password is incorrect."}`)
			return
		}
		s.issue(w)
		writeJSON(w, 200, `{"ok":true,"name":"bob","roles":["_admin"]}`)
		return
	}
	c, err := r.Cookie("AuthSession")
	switch {
	case err == nil && c.Value == s.valid && s.valid != "":
		s.withCookie++
	case basicOK:
		s.withBasic++
	default:
		writeJSON(w, 401, `{"error":"unauthorized","reason":"You are not authorized to access this db."}`)
		return
	}
	if basic && err == nil {
		writeJSON(w, 400, `{"error":"bad_request","reason":"both cookie and basic auth sent"}`)
		return
	}
	if s.rotateOnGet && r.Method == http.MethodGet {
		s.rotateOnGet = false
		s.issue(w)
	}
	writeJSON(w, 200, `{"db_name":"db","update_seq":0,"instance_start_time":"0"}`)
}

func (s *sessionServer) expire() {
	s.mu.Lock()
	s.valid = ""
	s.mu.Unlock()
}

func (s *sessionServer) counts() (posts, cookie, basic int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posts, s.withCookie, s.withBasic
}

// clock is a settable clock for the session's timers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestSessionCookies(t *testing.T) {
	type step struct {
		do      func(s *sessionServer, c *clock)
		wantErr bool
	}
	info := func(wantErr bool) step { return step{wantErr: wantErr} }
	then := func(f func(s *sessionServer, c *clock), wantErr bool) step { return step{do: f, wantErr: wantErr} }
	for _, tc := range []struct {
		name               string
		setup              func(s *sessionServer)
		opts               SessionOptions
		steps              []step
		posts, cookie, bas int
	}{
		{"one POST /_session, then the cookie", nil, SessionOptions{Fallback: true},
			[]step{info(false), info(false), info(false)}, 1, 3, 0},
		{"expired cookie: renewed and the request sent again", nil, SessionOptions{Fallback: true},
			[]step{info(false), then(func(s *sessionServer, c *clock) { s.expire(); c.add(10 * time.Second) }, false), info(false)}, 2, 3, 0},
		{"a young cookie refused: no renewal storm, renewed once min_update passed", nil, SessionOptions{Fallback: true},
			[]step{info(false), then(func(s *sessionServer, c *clock) { s.expire(); c.add(time.Second) }, true),
				then(func(s *sessionServer, c *clock) { c.add(5 * time.Second) }, false)}, 2, 2, 0},
		{"Max-Age: renewed at 0.9 x Max-Age", func(s *sessionServer) { s.maxAge = 100 }, SessionOptions{Fallback: true},
			[]step{info(false), then(func(_ *sessionServer, c *clock) { c.add(89 * time.Second) }, false),
				then(func(_ *sessionServer, c *clock) { c.add(2 * time.Second) }, false)}, 2, 3, 0},
		{"no Max-Age: renewed after session_refresh_interval_sec", nil, SessionOptions{Fallback: true, RefreshInterval: 550 * time.Second},
			[]step{info(false), then(func(_ *sessionServer, c *clock) { c.add(549 * time.Second) }, false),
				then(func(_ *sessionServer, c *clock) { c.add(2 * time.Second) }, false)}, 2, 3, 0},
		{"a new cookie in a 2xx is adopted", func(s *sessionServer) { s.rotateOnGet = true }, SessionOptions{Fallback: true},
			[]step{info(false), info(false), info(false)}, 1, 3, 0},
		{"/_session 404: basic auth", func(s *sessionServer) { s.noSession = true }, SessionOptions{Fallback: true},
			[]step{info(false), info(false)}, 1, 0, 2},
		{"/_session 404 without the noop plugin: an error", func(s *sessionServer) { s.noSession = true }, SessionOptions{},
			[]step{info(true)}, 1, 0, 0},
		{"/_session wants basic auth (require_valid_user)", func(s *sessionServer) { s.wantBasic = true }, SessionOptions{Fallback: true},
			[]step{info(false), info(false)}, 2, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSessionServer(t)
			if tc.setup != nil {
				tc.setup(s)
			}
			c := &clock{t: time.Unix(1_000_000, 0)}
			o := tc.opts
			o.Now = c.now
			ep, err := ParseEndpoint(map[string]any{"url": s.URL + "/db",
				"auth": map[string]any{"basic": map[string]any{"username": "bob", "password": "hunter2"}}})
			if err != nil {
				t.Fatal(err)
			}
			db := NewDB(ep, Options{HTTPClient: s.Client(), Session: &o, Retries: 2, RetryBackoff: time.Millisecond})
			for i, st := range tc.steps {
				if st.do != nil {
					st.do(s, c)
				}
				_, err := db.Info(context.Background())
				if (err != nil) != st.wantErr {
					t.Fatalf("step %d: Info = %v, want error %v", i, err, st.wantErr)
				}
				if err != nil && strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("step %d: error %q shows the password", i, err)
				}
			}
			if p, ck, b := s.counts(); p != tc.posts || ck != tc.cookie || b != tc.bas {
				t.Errorf("server saw %d POST /_session, %d cookie and %d basic requests; want %d, %d, %d", p, ck, b, tc.posts, tc.cookie, tc.bas)
			}
		})
	}
}

func TestSessionWrongPassword(t *testing.T) {
	s := newSessionServer(t)
	ep, _ := ParseEndpoint(map[string]any{"url": s.URL + "/db",
		"auth": map[string]any{"basic": map[string]any{"username": "bob", "password": "wrong-pass"}}})
	_, err := NewDB(ep, Options{HTTPClient: s.Client(), Session: &SessionOptions{Fallback: true}}).Info(context.Background())
	if !errors.Is(err, ErrUnauthorized) || strings.Contains(err.Error(), "wrong-pass") || !strings.Contains(err.Error(), "/_session") {
		t.Fatalf("Info = %v, want 401 on /_session without the password", err)
	}
}

func TestParseAuthSession(t *testing.T) {
	for _, tc := range []struct {
		headers []string
		cookie  string
		maxAge  int
		ok      bool
	}{
		{[]string{"AuthSession=abc; Version=1; Path=/; HttpOnly"}, "abc", -1, true},
		{[]string{"Other=x", "authsession=abc; max-age=600; Path=/"}, "abc", 600, true},
		{[]string{"AuthSession=\"q\"; Max-Age=-3"}, "q", -1, true},
		{[]string{"AuthSession=abc; Max-Age=soon"}, "abc", -1, true},
		{[]string{"Other=x"}, "", -1, false},
		{nil, "", -1, false},
	} {
		h := http.Header{}
		for _, v := range tc.headers {
			h.Add("Set-Cookie", v)
		}
		c, m, ok := parseAuthSession(h)
		if c != tc.cookie || m != tc.maxAge || ok != tc.ok {
			t.Errorf("parseAuthSession(%q) = %q, %d, %v; want %q, %d, %v", tc.headers, c, m, ok, tc.cookie, tc.maxAge, tc.ok)
		}
	}
}

// TestSessionsShared: DBs of one server and user with SessionOptions.Shared
// use one cookie (one POST /_session for all of them, other databases of
// the server included); other credentials get a session of their own,
// and so does a DB without Shared. A session no DB holds is dropped.
func TestSessionsShared(t *testing.T) {
	s := newSessionServer(t)
	shared := NewSessions()
	db := func(path, user, pass string, sh *Sessions) *DB {
		ep, err := ParseEndpoint(map[string]any{"url": s.URL + path,
			"auth": map[string]any{"basic": map[string]any{"username": user, "password": pass}}})
		if err != nil {
			t.Fatal(err)
		}
		return NewDB(ep, Options{HTTPClient: s.Client(), Session: &SessionOptions{Fallback: true, Shared: sh}})
	}
	ctx := context.Background()
	for _, path := range []string{"/a", "/b", "/a", "/c"} {
		if _, err := db(path, "bob", "hunter2", shared).Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if p, _, _ := s.counts(); p != 1 {
		t.Errorf("4 DBs of one server and user sent %d POST /_session, want 1", p)
	}
	if _, err := db("/a", "bob", "wrong", shared).Info(ctx); !errors.Is(err, ErrUnauthorized) {
		t.Errorf("other credentials: %v, want ErrUnauthorized (a session of their own)", err)
	}
	if _, err := db("/a", "bob", "hunter2", nil).Info(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := s.counts(); p != 3 {
		t.Errorf("%d POST /_session in all, want 3 (other credentials, no Shared: one each)", p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for shared.len() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions still registered with no DB left", shared.len())
		}
		runtime.GC() // the cleanups run after a collection: wait for them
		time.Sleep(10 * time.Millisecond)
	}
}
