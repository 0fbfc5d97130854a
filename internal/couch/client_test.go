package couch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fake is an httptest server answering with handler; it records requests.
type fake struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Method, Path, RawPath, Query string
	Header                       http.Header
	Body                         []byte
}

func newFake(t *testing.T, handler func(w http.ResponseWriter, r *http.Request, body []byte)) *fake {
	t.Helper()
	f := &fake{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Clone(), body})
		f.mu.Unlock()
		handler(w, r, body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fake) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

// db returns a client for database "db" on f, with fast retries.
func (f *fake) db(t *testing.T, opts Options) *DB {
	t.Helper()
	ep, err := ParseEndpoint(strings.Replace(f.URL, "http://", "http://alice:s3cret@", 1) + "/db")
	if err != nil {
		t.Fatal(err)
	}
	if opts.RetryBackoff == 0 {
		opts.RetryBackoff = time.Millisecond
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = f.Client()
	}
	return NewDB(ep, opts)
}

func writeJSON(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

type countingLimiter struct {
	waits, successes, failures atomic.Int32
}

func (l *countingLimiter) Wait(ctx context.Context, _ LimitKey) error {
	l.waits.Add(1)
	return ctx.Err()
}
func (l *countingLimiter) Success(LimitKey) { l.successes.Add(1) }
func (l *countingLimiter) Failure(LimitKey) { l.failures.Add(1) }

func TestRetries(t *testing.T) {
	tests := []struct {
		name      string
		statuses  []int // answers in order; the last repeats
		retries   int
		limiter   bool
		wantCalls int
		wantErr   error // nil: success
		wantLimit [2]int32
	}{
		{name: "500 then ok", statuses: []int{500, 200}, retries: 5, wantCalls: 2},
		{name: "408 and 503 then ok", statuses: []int{408, 503, 200}, retries: 5, wantCalls: 3},
		{name: "5xx exhausts retries", statuses: []int{502}, retries: 3, wantCalls: 4, wantErr: &HTTPError{Status: 502}},
		{name: "no retries", statuses: []int{500, 200}, retries: 0, wantCalls: 1, wantErr: &HTTPError{Status: 500}},
		{name: "404 not retried", statuses: []int{404, 200}, retries: 5, wantCalls: 1, wantErr: ErrNotFound},
		{name: "401 not retried", statuses: []int{401, 200}, retries: 5, wantCalls: 1, wantErr: ErrUnauthorized},
		{name: "429 with limiter uses no retry", statuses: []int{429, 429, 429, 200}, retries: 0, limiter: true, wantCalls: 4, wantLimit: [2]int32{1, 3}},
		{name: "429 without limiter is a retry", statuses: []int{429, 429, 200}, retries: 1, wantCalls: 2, wantErr: ErrRateLimited},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				i := int(calls.Add(1)) - 1
				code := tt.statuses[min(i, len(tt.statuses)-1)]
				if code == 200 {
					writeJSON(w, 200, `{"db_name":"db","update_seq":"5-abc","doc_count":3,"instance_start_time":"0"}`)
					return
				}
				writeJSON(w, code, `{"error":"e","reason":"r"}`)
			})
			opts := Options{Retries: tt.retries}
			var lim *countingLimiter
			if tt.limiter {
				lim = &countingLimiter{}
				opts.Limiter = lim
			}
			info, err := f.db(t, opts).Info(context.Background())
			if got := int(calls.Load()); got != tt.wantCalls {
				t.Errorf("calls = %d, want %d", got, tt.wantCalls)
			}
			if tt.wantErr == nil {
				if err != nil || !info.UpdateSeq.Equal(Seq(`"5-abc"`)) || info.DocCount != 3 {
					t.Fatalf("Info = %+v, %v", info, err)
				}
			} else {
				var want *HTTPError
				if errors.As(tt.wantErr, &want) {
					var got *HTTPError
					if !errors.As(err, &got) || got.Status != want.Status {
						t.Fatalf("err = %v, want status %d", err, want.Status)
					}
				} else if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			}
			if lim != nil {
				if got := [2]int32{lim.successes.Load(), lim.failures.Load()}; got != tt.wantLimit {
					t.Errorf("limiter successes/failures = %v, want %v", got, tt.wantLimit)
				}
				if lim.waits.Load() != int32(tt.wantCalls) {
					t.Errorf("limiter waits = %d, want %d", lim.waits.Load(), tt.wantCalls)
				}
			}
		})
	}
}

func TestRetryConnectionError(t *testing.T) {
	var calls atomic.Int32
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if calls.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // connection reset before any answer
			}
			return
		}
		writeJSON(w, 201, `{"ok":true,"instance_start_time":"0"}`)
	})
	ist, err := f.db(t, Options{Retries: 2}).EnsureFullCommit(context.Background())
	if err != nil || ist != "0" || calls.Load() != 2 {
		t.Fatalf("EnsureFullCommit = %q, %v after %d calls", ist, err, calls.Load())
	}
}

func TestLimiterAbort(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, 200, `{}`) })
	stop := errors.New("max backoff")
	_, err := f.db(t, Options{Limiter: abortLimiter{stop}}).GetLocal(context.Background(), "x")
	if !errors.Is(err, stop) || len(f.requests()) != 0 {
		t.Fatalf("err = %v after %d requests, want the limiter's error and none sent", err, len(f.requests()))
	}
}

type abortLimiter struct{ err error }

func (a abortLimiter) Wait(context.Context, LimitKey) error { return a.err }
func (abortLimiter) Success(LimitKey)                       {}
func (abortLimiter) Failure(LimitKey)                       {}

func TestErrorsAndLogsHideCredentials(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "s3cret" {
			writeJSON(w, 401, `{"error":"unauthorized","reason":"bad creds"}`)
			return
		}
		writeJSON(w, 503, `{"error":"unavailable","reason":"try later"}`)
	})
	var logs bytes.Buffer
	d := f.db(t, Options{Retries: 2, Logger: zerolog.New(&logs)})
	_, err := d.GetLocal(context.Background(), "cp")
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 503 || he.ErrorName != "unavailable" || he.Reason != "try later" || he.Method != "GET" {
		t.Fatalf("err = %#v", err)
	}
	msg := err.Error()
	for _, want := range []string{"GET", f.URL + "/db/_local/cp", "503", "unavailable: try later"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Count(logs.String(), "retrying") != 2 {
		t.Errorf("want 2 retry warnings, got:\n%s", logs.String())
	}
	for _, s := range []string{msg, logs.String(), d.String()} {
		if strings.Contains(s, "s3cret") || strings.Contains(s, "alice") {
			t.Errorf("credentials leaked: %s", s)
		}
	}
}

func TestHTTPErrorIs(t *testing.T) {
	tests := []struct {
		status int
		name   string
		is     error
	}{
		{404, "not_found", ErrNotFound},
		{401, "unauthorized", ErrUnauthorized},
		{403, "forbidden", ErrForbidden},
		{409, "conflict", ErrConflict},
		{412, "file_exists", ErrExists},
		{412, "missing_stub", ErrMissingStub},
		{413, "too_large", ErrTooLarge},
		{429, "too_many_requests", ErrRateLimited},
	}
	all := []error{ErrNotFound, ErrUnauthorized, ErrForbidden, ErrConflict, ErrExists, ErrMissingStub, ErrTooLarge, ErrRateLimited}
	for _, tt := range tests {
		e := &HTTPError{Status: tt.status, ErrorName: tt.name}
		for _, s := range all {
			if got := errors.Is(e, s); got != (s == tt.is) {
				t.Errorf("%d %s: Is(%v) = %v", tt.status, tt.name, s, got)
			}
		}
	}
}

func TestSimpleEndpoints(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		switch r.Method + " " + r.URL.EscapedPath() {
		case "GET /":
			writeJSON(w, 200, `{"couchdb":"Welcome","version":"3.3.3","uuid":"85fb71bf700c17267fef77535820e371","features":["access-ready"],"vendor":{"name":"The Apache Software Foundation"}}`)
		case "PUT /db/":
			if r.URL.RawQuery == "n=1&q=4" {
				writeJSON(w, 201, `{"ok":true}`)
			} else {
				writeJSON(w, 412, `{"error":"file_exists","reason":"The database could not be created, the file already exists."}`)
			}
		case "GET /db/_local/a%2Bb":
			writeJSON(w, 200, `{"_id":"_local/a+b","_rev":"0-3","x":1}`)
		case "PUT /db/_local/new":
			if !strings.Contains(string(body), `"x":2`) {
				writeJSON(w, 400, `{"error":"bad_request","reason":"body"}`)
				return
			}
			writeJSON(w, 201, `{"ok":true,"id":"_local/new","rev":"0-1"}`)
		case "GET /db/_local/none":
			writeJSON(w, 404, `{"error":"not_found","reason":"missing"}`)
		case "POST /db/_revs_diff":
			var req map[string][]string
			if json.Unmarshal(body, &req) != nil || len(req["d1"]) != 2 {
				writeJSON(w, 400, `{"error":"bad_request","reason":"body"}`)
				return
			}
			writeJSON(w, 200, `{"d1":{"missing":["2-b"],"possible_ancestors":["1-a"]}}`)
		case "GET /db/_design/f":
			writeJSON(w, 200, `{"_id":"_design/f","filters":{"f":"function(){}"}}`)
		default:
			writeJSON(w, 500, `{"error":"unexpected","reason":"`+r.Method+` `+r.URL.EscapedPath()+`"}`)
		}
	})
	d := f.db(t, Options{})
	ctx := context.Background()
	si, err := d.ServerInfo(ctx)
	if err != nil || si.UUID != "85fb71bf700c17267fef77535820e371" || si.CouchDB != "Welcome" || si.VendorName != "The Apache Software Foundation" || si.Version != "3.3.3" {
		t.Errorf("ServerInfo = %+v, %v", si, err)
	}
	if err := d.Create(ctx, map[string][]string{"q": {"4"}, "n": {"1"}}); err != nil {
		t.Errorf("Create: %v", err)
	}
	if err := d.Create(ctx, nil); !errors.Is(err, ErrExists) {
		t.Errorf("Create existing: %v, want ErrExists", err)
	}
	if b, err := d.GetLocal(ctx, "_local/a+b"); err != nil || !strings.Contains(string(b), `"0-3"`) {
		t.Errorf("GetLocal = %s, %v", b, err)
	}
	if _, err := d.GetLocal(ctx, "none"); !errors.Is(err, ErrNotFound) {
		t.Errorf("GetLocal missing: %v, want ErrNotFound", err)
	}
	if rev, err := d.PutLocal(ctx, "new", json.RawMessage(`{"x":2}`)); err != nil || rev != "0-1" {
		t.Errorf("PutLocal = %q, %v", rev, err)
	}
	diff, err := d.RevsDiff(ctx, map[string][]string{"d1": {"1-a", "2-b"}})
	if err != nil || len(diff) != 1 || diff["d1"].Missing[0] != "2-b" || diff["d1"].PossibleAncestors[0] != "1-a" {
		t.Errorf("RevsDiff = %+v, %v", diff, err)
	}
	if b, err := d.GetDoc(ctx, "_design/f", nil); err != nil || !strings.Contains(string(b), "filters") {
		t.Errorf("GetDoc = %s, %v", b, err)
	}
	for _, r := range f.requests() {
		if r.Header.Get("Accept-Encoding") != "identity" || r.Header.Get("Accept") == "" || !strings.HasPrefix(r.Header.Get("User-Agent"), "couchrep/") {
			t.Errorf("%s %s headers %v", r.Method, r.Path, r.Header)
		}
	}
}

func TestInfoRequiresFields(t *testing.T) {
	for _, body := range []string{`{"db_name":"db"}`, `{"update_seq":1`, `not json`} {
		f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, 200, body) })
		if _, err := f.db(t, Options{}).Info(context.Background()); !errors.Is(err, ErrBadResponse) {
			t.Errorf("Info on %s: %v, want ErrBadResponse", body, err)
		}
	}
}

func TestEndpointHeadersSent(t *testing.T) {
	f := newFake(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { writeJSON(w, 200, `{}`) })
	ep, err := ParseEndpoint(map[string]any{"url": f.URL + "/db", "headers": map[string]any{"X-Tenant": "t1"}, "auth": map[string]any{"basic": map[string]any{"username": "bob", "password": "pw"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDB(ep, Options{HTTPClient: f.Client()}).GetLocal(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	r := f.requests()[0]
	if r.Header.Get("X-Tenant") != "t1" {
		t.Errorf("X-Tenant = %q", r.Header.Get("X-Tenant"))
	}
	req := &http.Request{Header: r.Header}
	if u, p, ok := req.BasicAuth(); !ok || u != "bob" || p != "pw" {
		t.Errorf("basic auth = %q %q %v", u, p, ok)
	}
}
