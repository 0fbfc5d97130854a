package httpapi_test

import (
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/httpapi"
)

var (
	requestIDRe = regexp.MustCompile(`^[0-9a-f]{10}$`)
	// What tools that detect CouchDB by the Server header match.
	couchDBTokenRe = regexp.MustCompile(`CouchDB/\d+\.\d+\.\d+`)
)

// TestDefaultHeaders: every answer of the API — successes, errors (unknown
// endpoint, wrong method, bad body, missing credentials), the status page
// and its data, metrics — carries CouchDB's default headers
// (chttpd:basic_headers): X-Couch-Request-ID (10 hex digits, new for each
// request), X-CouchDB-Body-Time, a Server header with a CouchDB/<version>
// token, Cache-Control; JSON answers are application/json.
func TestDefaultHeaders(t *testing.T) {
	e := newEnv(t, map[string]string{"admin": "secret"})
	cases := []struct {
		name, method, path string
		body               string
		auth               bool
		status             int
		json               bool
		cacheControl       string
	}{
		{"welcome", "GET", "/", "", false, http.StatusOK, true, "must-revalidate"},
		{"up", "GET", "/_up", "", false, http.StatusOK, true, "must-revalidate"},
		{"scheduler jobs", "GET", "/_scheduler/jobs", "", true, http.StatusOK, true, "must-revalidate"},
		{"scheduler docs", "GET", "/_scheduler/docs", "", true, http.StatusOK, true, "must-revalidate"},
		{"active tasks", "GET", "/_active_tasks", "", true, http.StatusOK, true, "must-revalidate"},
		{"unknown job", "GET", "/_scheduler/jobs/nope", "", true, http.StatusNotFound, true, "must-revalidate"},
		{"unknown endpoint", "GET", "/_nope", "", true, http.StatusNotFound, true, "must-revalidate"},
		{"wrong method", "DELETE", "/_replicate", "", true, http.StatusMethodNotAllowed, true, "must-revalidate"},
		{"bad body", "POST", "/_replicate", "{", true, http.StatusBadRequest, true, "must-revalidate"},
		{"no credentials", "GET", "/_scheduler/jobs", "", false, http.StatusUnauthorized, true, "must-revalidate"},
		{"status data", "GET", "/_status/data", "", true, http.StatusOK, true, "no-store"},
		{"status page", "GET", "/_status", "", true, http.StatusOK, false, "no-cache"},
		{"metrics", "GET", "/metrics", "", true, http.StatusOK, false, "must-revalidate"},
	}
	seen := map[string]string{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var auth []string
			if c.auth {
				auth = []string{"admin", "secret"}
			}
			ctype := ""
			if c.body != "" {
				ctype = "application/json"
			}
			r := e.do(c.method, c.path, ctype, []byte(c.body), auth...)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			h := r.header
			id := h.Get("X-Couch-Request-ID")
			if !requestIDRe.MatchString(id) {
				t.Errorf("X-Couch-Request-ID %q, want 10 hex digits", id)
			}
			if prev, dup := seen[id]; dup {
				t.Errorf("X-Couch-Request-ID %q repeats that of %s", id, prev)
			}
			seen[id] = c.name
			if got := h.Get("X-CouchDB-Body-Time"); got != "0" {
				t.Errorf("X-CouchDB-Body-Time %q, want 0", got)
			}
			srv := h.Get("Server")
			if srv != httpapi.ServerHeader || !strings.HasPrefix(srv, "couchrep/") || !couchDBTokenRe.MatchString(srv) {
				t.Errorf("Server %q, want %q (couchrep first, with a CouchDB/<version> token)", srv, httpapi.ServerHeader)
			}
			if got := h.Get("Cache-Control"); got != c.cacheControl {
				t.Errorf("Cache-Control %q, want %q", got, c.cacheControl)
			}
			if ct := h.Get("Content-Type"); c.json && ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
		})
	}
}

// TestRequestIDFromClient: a client's X-Couch-Request-ID is echoed when
// CouchDB would keep it (at most 36 of [0-9A-Za-z_-]), else replaced by a
// new one (chttpd:nonce/1).
func TestRequestIDFromClient(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		name, sent string
		kept       bool
	}{
		{"uuid-like", "3f2a9c1e-4b7d-4e8a-9f10-aa55bb66cc77", true},
		{"underscore", "trace_42", true},
		{"too long", strings.Repeat("a", 37), false},
		{"bad characters", "a b/c", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Couch-Request-ID", c.sent)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := resp.Header.Get("X-Couch-Request-ID")
			switch {
			case c.kept && got != c.sent:
				t.Errorf("X-Couch-Request-ID %q, want the client's %q", got, c.sent)
			case !c.kept && !requestIDRe.MatchString(got):
				t.Errorf("X-Couch-Request-ID %q for the invalid %q, want a new one of 10 hex digits", got, c.sent)
			}
		})
	}
}
