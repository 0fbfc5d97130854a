package dbupdates

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/testserver"
)

// waitFor bounds every wait of these tests; each ends as soon as its
// condition holds.
const waitFor = 20 * time.Second

// fake is a _db_updates server for the protocol's corners: the probe
// (GET /_db_updates?since=now) answers probeStatus/probeBody or the
// current seq; every continuous request is handed to the test as a stream
// whose lines it writes (the headers go with the first line, as CouchDB's
// delayed responses do).
type fake struct {
	srv *httptest.Server

	mu          sync.Mutex
	probeStatus int
	probeBody   string
	feedStatus  map[string]int // since -> status for the continuous feed
	seq         int
	probes      int
	requests    []string // "probe" or "feed since=<since>"
	auth        []string // the Authorization headers seen
	streams     chan *stream
}

type stream struct {
	since string
	lines chan string   // "" sends a heartbeat; close ends the answer
	done  chan struct{} // closed when the request ended
}

func newFake(t testing.TB) *fake {
	f := &fake{feedStatus: map[string]int{}, streams: make(chan *stream, 100), seq: 1}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/_db_updates" {
		http.Error(w, `{"error":"not_found"}`, http.StatusNotFound)
		return
	}
	q := r.URL.Query()
	f.mu.Lock()
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	if q.Get("feed") != "continuous" {
		f.probes++
		f.requests = append(f.requests, "probe")
		status, body, seq := f.probeStatus, f.probeBody, f.seq
		f.mu.Unlock()
		if status != 0 {
			w.WriteHeader(status)
			fmt.Fprint(w, body)
			return
		}
		fmt.Fprintf(w, `{"results":[],"last_seq":"%d-x"}`+"\n", seq)
		return
	}
	since := q.Get("since")
	f.requests = append(f.requests, "feed since="+since)
	status := f.feedStatus[since]
	f.mu.Unlock()
	if q.Get("heartbeat") == "" {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"bad_request","reason":"test: no heartbeat"}`)
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"error":"bad_request","reason":"Malformed sequence supplied in 'since' parameter."}`)
		return
	}
	s := &stream{since: since, lines: make(chan string, 100), done: make(chan struct{})}
	defer close(s.done)
	f.streams <- s
	fl := w.(http.Flusher)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				return
			}
			if line == "" {
				line = "\n"
			} else {
				line += "\n"
			}
			if _, err := w.Write([]byte(line)); err != nil {
				return
			}
			fl.Flush()
		case <-r.Context().Done():
			return
		}
	}
}

// next waits for the next continuous request.
func (f *fake) next(t *testing.T) *stream {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(waitFor):
		t.Fatal("no _db_updates feed request")
		return nil
	}
}

func (f *fake) counts() (probes int, requests []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.probes, append([]string(nil), f.requests...)
}

func row(db, typ string, seq int) string {
	return fmt.Sprintf(`{"db_name":%q,"type":%q,"seq":"%d-x"}`, db, typ, seq)
}

// testServer is a Server for rawURL, a client of its own.
func testServer(t testing.TB, rawURL string) Server {
	t.Helper()
	ep, err := couch.ParseEndpoint(rawURL + "anydb")
	if err != nil {
		t.Fatal(err)
	}
	return Server{
		Key:  rawURL,
		Name: ep.ServerURL().Redacted(),
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			tr, err := couch.NewTransport(couch.TransportOptions{})
			if err != nil {
				return nil, nil, err
			}
			db := couch.NewDB(ep, couch.Options{HTTPClient: &http.Client{Transport: tr}, Logger: log})
			return db, tr.CloseIdleConnections, nil
		},
	}
}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newHub(t *testing.T, logs *logBuf, o Options) *Hub {
	if logs != nil {
		o.Logger = zerolog.New(logs)
	}
	if o.RetryMin == 0 {
		o.RetryMin, o.RetryMax = 10*time.Millisecond, 50*time.Millisecond
	}
	if o.Heartbeat == 0 {
		o.Heartbeat = time.Second
	}
	return New(o)
}

func watch(t *testing.T, h *Hub, srv Server, db string) *Watch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	w, err := h.Watch(ctx, srv, db)
	if err != nil {
		t.Fatalf("Watch(%q): %v", db, err)
	}
	t.Cleanup(w.Close)
	return w
}

func woken(t *testing.T, w *Watch) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(waitFor):
		t.Fatalf("watch of %q not woken", w.DB())
	}
}

// notWoken checks that w has no signal waiting. It is called after a
// later row of the same feed woke another watch: rows are dispatched in
// order, so a wrong signal would be there already.
func notWoken(t *testing.T, w *Watch) {
	t.Helper()
	select {
	case <-w.C():
		t.Fatalf("watch of %q woken", w.DB())
	default:
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRowsWakeTheirDatabasesWatches(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	slash := watch(t, h, srv, "users/joe")
	b1 := watch(t, h, srv, "b")
	b2 := watch(t, h, srv, "b")
	s := f.next(t)
	if s.since != "1-x" {
		t.Fatalf("feed since=%q, want the probe's 1-x", s.since)
	}
	// Headers go with the first heartbeat (CouchDB); rows after it.
	s.lines <- ""
	s.lines <- row("b", "updated", 2)
	woken(t, b1)
	woken(t, b2)
	notWoken(t, a)
	notWoken(t, slash)
	// Coalesced: three rows, one signal waiting.
	s.lines <- row("users/joe", "created", 3)
	s.lines <- row("users/joe", "updated", 4)
	s.lines <- row("users/joe", "deleted", 5)
	s.lines <- row("a", "updated", 6)
	woken(t, a)
	woken(t, slash)
	notWoken(t, slash)
	notWoken(t, b1)
	if st := h.Stats(); st.Feeds != 1 || st.Watches != 4 || len(st.Servers) != 1 || st.Servers[0].State != StateOK {
		t.Fatalf("Stats = %+v, want one feed, 4 watches, ok", st)
	}
	if probes, _ := f.counts(); probes != 1 {
		t.Fatalf("%d probes for 4 watches, want 1", probes)
	}
}

func TestLastWatchClosesTheFeed(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	b := watch(t, h, srv, "a")
	s := f.next(t)
	a.Close()
	a.Close()
	select {
	case <-s.done:
		t.Fatal("feed closed while a watch is left")
	default:
	}
	if st := h.Stats(); st.Watches != 1 {
		t.Fatalf("Stats = %+v, want 1 watch", st)
	}
	b.Close()
	select {
	case <-s.done:
	case <-time.After(waitFor):
		t.Fatal("feed still open after its last watch closed")
	}
	if st := h.Stats(); st.Feeds != 0 || st.Watches != 0 {
		t.Fatalf("Stats = %+v, want none", st)
	}
	// The next Watch opens a new feed.
	watch(t, h, srv, "a")
	f.next(t)
}

func TestStallReopensWithSince(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{StallAfter: 200 * time.Millisecond})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	b := watch(t, h, srv, "b")
	s := f.next(t)
	s.lines <- row("a", "updated", 7)
	woken(t, a)
	// Nothing more, not even a heartbeat: a stall. The feed is read again
	// from the last row's seq, without waking anyone.
	s2 := f.next(t)
	if s2.since != "7-x" {
		t.Fatalf("reopened since=%q, want 7-x", s2.since)
	}
	s2.lines <- row("b", "updated", 8)
	woken(t, b)
	notWoken(t, a)
	if probes, _ := f.counts(); probes != 1 {
		t.Fatalf("%d probes, want 1 (a stall resumes from the seq)", probes)
	}
}

func TestEndedFeedResumesFromLastSeq(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	s.lines <- row("x", "updated", 4)
	s.lines <- `{"last_seq":"5-x"}`
	close(s.lines)
	s2 := f.next(t)
	if s2.since != "5-x" {
		t.Fatalf("reopened since=%q, want the last_seq 5-x", s2.since)
	}
	s2.lines <- row("a", "updated", 6)
	woken(t, a)
}

func TestRejectedSinceWakesEveryWatch(t *testing.T) {
	f := newFake(t)
	logs := &logBuf{}
	h := newHub(t, logs, Options{})
	srv := testServer(t, f.srv.URL+"/")
	ws := make([]*Watch, 10)
	for i := range ws {
		ws[i] = watch(t, h, srv, fmt.Sprintf("db%d", i))
	}
	s := f.next(t)
	f.mu.Lock()
	f.feedStatus["2-x"] = http.StatusBadRequest // the server restarted: its old seqs are gone
	f.seq = 90
	f.mu.Unlock()
	s.lines <- row("other", "updated", 2)
	close(s.lines) // connection cut
	s2 := f.next(t)
	if s2.since != "90-x" {
		t.Fatalf("reopened since=%q, want the new probe's 90-x", s2.since)
	}
	for _, w := range ws {
		woken(t, w)
		if w.Err() != nil {
			t.Fatalf("Err = %v after a rejected seq, want nil (the feed goes on)", w.Err())
		}
	}
	_, reqs := f.counts()
	want := []string{"probe", "feed since=1-x", "feed since=2-x", "probe", "feed since=90-x"}
	if strings.Join(reqs, ",") != strings.Join(want, ",") {
		t.Fatalf("requests %q, want %q", reqs, want)
	}
	if !strings.Contains(logs.String(), "rejected the feed's seq") {
		t.Fatalf("no log line for the rejected seq:\n%s", logs)
	}
}

// TestUnsupported: the statuses that say _db_updates cannot be read, each
// cached per Key and logged once; a 401/403 is a verdict on the
// credentials (not_admin, ErrNotAdmin, counted in NotAdmin), not on the
// server (Unsupported stays 0).
func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
		reason string
		state  State
	}{
		{"PouchDB Server's stub", 400, "", "400 Bad Request", StateUnsupported},
		{"not an admin", 401, `{"error":"unauthorized","reason":"You are not a server admin."}`, "401 unauthorized: You are not a server admin.", StateNotAdmin},
		{"forbidden", 403, `{"error":"forbidden","reason":"nope"}`, "403 forbidden: nope", StateNotAdmin},
		{"no _global_changes", 404, `{"error":"not_found","reason":"Database does not exist."}`, "404 not_found: Database does not exist.", StateUnsupported},
		{"500", 500, `{"error":"unknown_error","reason":"database_does_not_exist"}`, "500 unknown_error: database_does_not_exist", StateUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.probeStatus, f.probeBody = tc.status, tc.body
			logs := &logBuf{}
			h := newHub(t, logs, Options{})
			u, _ := url.Parse(f.srv.URL + "/")
			u.User = url.UserPassword("admin", "s3cret-pw")
			srv := testServer(t, u.String())
			for i := range 3 {
				w, err := h.Watch(context.Background(), srv, fmt.Sprintf("db%d", i))
				if !errors.Is(err, ErrUnsupported) || w != nil || errors.Is(err, ErrNotAdmin) != (tc.state == StateNotAdmin) {
					t.Fatalf("Watch %d: %v, want ErrUnsupported (ErrNotAdmin: %v)", i, err, tc.state == StateNotAdmin)
				}
				if !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("error %q does not give the reason %q", err, tc.reason)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error shows the password: %q", err)
				}
			}
			if probes, _ := f.counts(); probes != 1 {
				t.Fatalf("%d probes for 3 watches, want 1 (the verdict is cached)", probes)
			}
			st := h.Stats()
			wantUnsupported, wantNotAdmin, line := 1, 0, "cannot be read"
			if tc.state == StateNotAdmin {
				wantUnsupported, wantNotAdmin, line = 0, 1, "refused a job's credentials"
			}
			if st.Unsupported != wantUnsupported || st.NotAdmin != wantNotAdmin || st.Feeds != 0 || len(st.Servers) != 1 ||
				st.Servers[0].State != tc.state || st.Servers[0].Reason != tc.reason {
				t.Fatalf("Stats = %+v, want one server %s with reason %q", st, tc.state, tc.reason)
			}
			out := logs.String()
			if strings.Count(out, line) != 1 || !strings.Contains(out, tc.reason) {
				t.Fatalf("want one log line with the reason %q:\n%s", tc.reason, out)
			}
			if strings.Contains(out, "s3cret") || strings.Contains(fmt.Sprint(st), "s3cret") {
				t.Fatalf("the password shows in the logs or Stats:\n%s\n%+v", out, st)
			}
		})
	}
}

func TestUnsupportedExpires(t *testing.T) {
	f := newFake(t)
	f.probeStatus = http.StatusNotFound
	logs := &logBuf{}
	h := newHub(t, logs, Options{UnsupportedFor: time.Nanosecond})
	srv := testServer(t, f.srv.URL+"/")
	for range 2 {
		if _, err := h.Watch(context.Background(), srv, "a"); !errors.Is(err, ErrUnsupported) {
			t.Fatalf("Watch: %v, want ErrUnsupported", err)
		}
	}
	if probes, _ := f.counts(); probes != 2 {
		t.Fatalf("%d probes, want 2 (the verdict expired)", probes)
	}
	if n := strings.Count(logs.String(), "cannot be read"); n != 1 {
		t.Fatalf("%d log lines for one unchanged state, want 1:\n%s", n, logs)
	}
	// The server can be read now: the next Watch works.
	f.mu.Lock()
	f.probeStatus = 0
	f.mu.Unlock()
	w := watch(t, h, srv, "a")
	s := f.next(t)
	s.lines <- row("a", "updated", 2)
	woken(t, w)
	if !strings.Contains(logs.String(), "reading the server's _db_updates") {
		t.Fatalf("no log line for the change to ok:\n%s", logs)
	}
}

func TestRefusedLaterEndsTheWatches(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	f.mu.Lock()
	f.feedStatus["1-x"] = http.StatusUnauthorized // the admin's password changed
	f.probeStatus = http.StatusUnauthorized
	f.mu.Unlock()
	close(s.lines)
	woken(t, a)
	if !errors.Is(a.Err(), ErrUnsupported) {
		t.Fatalf("Err = %v, want ErrUnsupported", a.Err())
	}
	if _, err := h.Watch(context.Background(), srv, "b"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Watch after the refusal: %v, want ErrUnsupported (cached)", err)
	}
}

func TestTransientFailureIsNotCached(t *testing.T) {
	f := newFake(t)
	f.srv.Close() // connection refused
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	for range 2 {
		w, err := h.Watch(context.Background(), srv, "a")
		if err == nil || errors.Is(err, ErrUnsupported) || w != nil {
			t.Fatalf("Watch: %v, want a transient error", err)
		}
	}
	if st := h.Stats(); st.Feeds != 0 || st.Unsupported != 0 {
		t.Fatalf("Stats = %+v, want nothing left", st)
	}
}

func TestRetryingAfterFailure(t *testing.T) {
	f := newFake(t)
	logs := &logBuf{}
	h := newHub(t, logs, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	f.mu.Lock()
	f.feedStatus["1-x"] = http.StatusServiceUnavailable
	f.mu.Unlock()
	close(s.lines)
	eventually(t, "state retrying", func() bool {
		st := h.Stats()
		return len(st.Servers) == 1 && st.Servers[0].State == StateRetrying && strings.Contains(st.Servers[0].Reason, "503")
	})
	notWoken(t, a) // 5xx: the feed is read again from its seq, nothing lost
	f.mu.Lock()
	delete(f.feedStatus, "1-x")
	f.mu.Unlock()
	s2 := f.next(t)
	s2.lines <- row("a", "updated", 3)
	woken(t, a)
	eventually(t, "state ok", func() bool { return h.Stats().Servers[0].State == StateOK })
	out := logs.String()
	if strings.Count(out, "feed failed") != 1 || strings.Count(out, "reading the server's _db_updates") != 2 {
		t.Fatalf("want one failure and two ok lines (one per state change):\n%s", out)
	}
}

func TestHugeRowIsAnError(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	s.lines <- `{"db_name":"` + strings.Repeat("x", couch.MaxDBUpdatesRowBytes+10) + `","type":"updated","seq":"2-x"}`
	eventually(t, "state retrying", func() bool {
		st := h.Stats()
		return len(st.Servers) == 1 && st.Servers[0].State == StateRetrying && strings.Contains(st.Servers[0].Reason, "_db_updates row is more than the limit")
	})
	s2 := f.next(t)
	if s2.since != "1-x" {
		t.Fatalf("reopened since=%q, want 1-x", s2.since)
	}
	s2.lines <- row("a", "updated", 3)
	woken(t, a)
}

func TestCredentialsNeverShown(t *testing.T) {
	f := newFake(t)
	logs := &logBuf{}
	h := newHub(t, logs, Options{StallAfter: 100 * time.Millisecond})
	u, _ := url.Parse(f.srv.URL + "/")
	u.User = url.UserPassword("admin", "s3cret-pw")
	srv := testServer(t, u.String())
	a := watch(t, h, srv, "a")
	s := f.next(t)
	f.mu.Lock()
	f.feedStatus["1-x"] = http.StatusServiceUnavailable
	f.mu.Unlock()
	close(s.lines)
	eventually(t, "state retrying", func() bool { return h.Stats().Servers[0].State == StateRetrying })
	f.mu.Lock()
	delete(f.feedStatus, "1-x")
	f.mu.Unlock()
	s2 := f.next(t) // then a stall
	_ = s2
	f.next(t)
	_ = a
	f.mu.Lock()
	auth := append([]string(nil), f.auth...)
	f.mu.Unlock()
	for _, v := range auth {
		if v == "" {
			t.Fatal("a request without the credentials")
		}
	}
	out := logs.String() + fmt.Sprintf("%+v", h.Stats())
	if strings.Contains(out, "s3cret") || strings.Contains(out, srv.Key) {
		t.Fatalf("the password or the key shows:\n%s", out)
	}
}

func TestPouchDBWithDBUpdates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	t.Parallel()
	s := testserver.StartPouchDBWithDBUpdates(t)
	if !s.External() {
		s.AddAdmin(t, "boss", "s3cret-pw")
		user := map[string]any{"name": "joe", "password": "joe-pw", "roles": []string{}, "type": "user"}
		s.Do(t, http.MethodPut, s.URL+"_users/org.couchdb.user:joe", user, http.StatusCreated)
	}
	root, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if root.User == nil {
		root.User = url.UserPassword("boss", "s3cret-pw")
	}
	logs := &logBuf{}
	h := newHub(t, logs, Options{Heartbeat: DefaultHeartbeat})
	srv := testServer(t, root.String())
	if s.External() {
		// A CouchDB (make test-couchdb): without _global_changes (a
		// single_node set-up) its _db_updates cannot be read, and says so.
		w, err := h.Watch(context.Background(), srv, "any")
		if errors.Is(err, ErrUnsupported) {
			if !strings.Contains(err.Error(), "404 not_found: Database does not exist.") {
				t.Fatalf("Watch: %v, want ErrUnsupported for the missing _global_changes (404)", err)
			}
			t.Logf("the server has no _global_changes: %v", err)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
	}

	const n = 100
	names := make([]string, n)
	urls := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("userdb-%03d", i)
		urls[i] = s.DBURL(names[i])
	}
	dbName := func(i int) string { // the name as the server's rows give it
		u, _ := url.Parse(urls[i])
		return strings.Trim(u.Path, "/")
	}
	ws := make([]*Watch, n)
	// CouchDB's _db_updates is read from _global_changes, which it writes
	// in batches (max_write_delay): its rows come late and not in one
	// global order, so a database's "created" row may come after watches
	// set up after the database was created. There the watches come
	// first, and each must be woken by its database's creation (none
	// missed): then the creation rows have settled. PouchDB Server's feed
	// (the test server's) is in order: its watches come after the
	// creations, and no creation may wake them.
	if s.External() {
		for i := range ws {
			ws[i] = watch(t, h, srv, dbName(i))
		}
	}
	// Created 20 at a time (integration/README.md: distinct names
	// concurrently are fine).
	var wg sync.WaitGroup
	for c := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += 5 {
				s.CreateDB(t, names[i])
			}
		}()
	}
	wg.Wait()
	if s.External() {
		for _, w := range ws {
			woken(t, w)
		}
	} else {
		for i := range ws {
			ws[i] = watch(t, h, srv, dbName(i))
		}
	}
	if st := h.Stats(); st.Feeds != 1 || st.Watches != n {
		t.Fatalf("Stats = %+v, want 1 feed and %d watches", st, n)
	}
	written := map[int]bool{}
	for _, i := range []int{3, 17, 42, 64, 99} {
		s.PutDocs(t, urls[i], map[string]any{"_id": "doc", "v": i})
		written[i] = true
	}
	// A last write to a sentinel, then its wake-up: rows come in order,
	// so every earlier row was dispatched by then. CouchDB's may not: the
	// written databases' watches are woken (none missed), the others'
	// signals are not asserted (a late row, or a second one for a
	// creation, would only cost a parked job a look at its source).
	sentinel := 50
	s.PutDocs(t, urls[sentinel], map[string]any{"_id": "sentinel"})
	woken(t, ws[sentinel])
	for i, w := range ws {
		switch {
		case written[i]:
			woken(t, w)
		case !s.External():
			notWoken(t, w)
		}
	}

	// A database created and deleted while watched.
	fresh := watch(t, h, srv, dbName(0)+"-new")
	freshURL := s.CreateDB(t, names[0]+"-new")
	woken(t, fresh)
	s.Do(t, http.MethodDelete, freshURL, nil, http.StatusOK)
	woken(t, fresh)
	if fresh.Err() != nil {
		t.Fatalf("Err = %v", fresh.Err())
	}
	if st := h.Stats(); len(st.Servers) != 1 || st.Servers[0].State != StateOK || st.Servers[0].Watches != n+1 {
		t.Fatalf("Stats = %+v, want the server ok with %d watches", st, n+1)
	}

	// A user who is not a server admin cannot read it.
	joe := *root
	joe.User = url.UserPassword("joe", "joe-pw")
	if s.External() {
		joe.User = nil
	}
	_, err = h.Watch(context.Background(), testServer(t, joe.String()), dbName(1))
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, ErrNotAdmin) || !strings.Contains(err.Error(), "401 unauthorized: You are not a server admin.") {
		t.Fatalf("a non-admin's Watch: %v, want ErrUnsupported and ErrNotAdmin, 401 not a server admin", err)
	}
	// The server still serves the admin's watches: joe's refusal is a
	// verdict on joe's credentials, not on the server.
	st := h.Stats()
	if st.Unsupported != 0 || st.NotAdmin != 1 || st.Feeds != 1 || st.Watches != n+1 {
		t.Fatalf("Stats = %+v, want the server's feed read (%d watches), no server unsupported, one credentials not_admin", st, n+1)
	}
	for _, ss := range st.Servers {
		if ss.State == StateUnsupported {
			t.Fatalf("Stats lists the server unsupported after a non-admin's 401: %+v", st)
		}
	}
	if again := watch(t, h, srv, dbName(1)); again.Err() != nil {
		t.Fatalf("an admin's Watch after joe's 401: %v", again.Err())
	} else {
		again.Close()
	}
	if out := logs.String() + err.Error(); strings.Contains(out, "s3cret-pw") || strings.Contains(out, "joe-pw") {
		t.Fatalf("a password shows:\n%s", out)
	}
	for _, w := range ws {
		w.Close()
	}
	fresh.Close()
	if st := h.Stats(); st.Feeds != 0 || st.Watches != 0 || st.Unsupported != 0 || st.NotAdmin != 1 {
		t.Fatalf("Stats = %+v, want no feed, no watch, no unsupported server, joe's credentials not_admin", st)
	}
}

func TestPouchDBServerStub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server")
	}
	t.Parallel()
	s := testserver.StartPouchDB(t)
	if s.External() {
		t.Skip("an external server is not PouchDB Server")
	}
	h := newHub(t, nil, Options{})
	_, err := h.Watch(context.Background(), testServer(t, s.URL), "db")
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "-> 400 Bad Request") {
		t.Fatalf("Watch: %v, want ErrUnsupported with PouchDB Server's 400", err)
	}
	st := h.Stats()
	if len(st.Servers) != 1 || st.Servers[0].Reason != "400 Bad Request" {
		t.Fatalf("Stats = %+v, want the reason 400 Bad Request", st)
	}
}

func TestDBName(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"http://h:5984/userdb-6a6f65", "userdb-6a6f65"},
		{"http://u:p@h:5984/userdb-6a6f65/", "userdb-6a6f65"},
		{"https://h/couch/a%2Fb/", "a/b"},
		{"http://h/a%2Fb%2Bc%20d?x=1", "a/b+c d"},
		{"http://h/", ""},
	} {
		ep, err := couch.ParseEndpoint(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := DBName(ep); got != tc.want {
			t.Errorf("DBName(%s) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

func TestRejectedFreshSeqIsUnsupported(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	f.mu.Lock()
	// A server (or a proxy) whose continuous feed rejects every seq, the
	// ones its own probe gives included.
	f.feedStatus["2-x"], f.feedStatus["3-x"], f.seq = http.StatusBadRequest, http.StatusBadRequest, 3
	f.mu.Unlock()
	s.lines <- row("z", "updated", 2)
	close(s.lines)
	woken(t, a)
	eventually(t, "the watch's error", func() bool { return a.Err() != nil })
	if !errors.Is(a.Err(), ErrUnsupported) {
		t.Fatalf("Err = %v, want ErrUnsupported", a.Err())
	}
	_, reqs := f.counts()
	want := []string{"probe", "feed since=1-x", "feed since=2-x", "probe", "feed since=3-x"}
	if strings.Join(reqs, ",") != strings.Join(want, ",") {
		t.Fatalf("requests %q, want %q", reqs, want)
	}
}

func TestProbeWithoutSeqWakesOnEveryStart(t *testing.T) {
	f := newFake(t)
	f.probeStatus, f.probeBody = http.StatusOK, `{"results":[]}`
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	a := watch(t, h, srv, "a")
	s := f.next(t)
	if s.since != "now" {
		t.Fatalf("feed since=%q, want now", s.since)
	}
	s.lines <- ""
	// Events between the probe and the feed's start may be missing.
	woken(t, a)
	s.lines <- row("a", "updated", 5)
	woken(t, a)
}

func TestUnsupportedStaysListed(t *testing.T) {
	f := newFake(t)
	f.probeStatus = http.StatusNotFound
	h := newHub(t, nil, Options{UnsupportedFor: time.Nanosecond})
	srv := testServer(t, f.srv.URL+"/")
	if _, err := h.Watch(context.Background(), srv, "a"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Watch: %v, want ErrUnsupported", err)
	}
	// The verdict's cache expired (jobs that got it keep their feeds and
	// do not ask again): the server is still shown unsupported.
	if st := h.Stats(); st.Unsupported != 1 || len(st.Servers) != 1 || st.Servers[0].State != StateUnsupported {
		t.Fatalf("Stats = %+v, want the server listed unsupported", st)
	}
}

// TestConcurrentWatches: watches come and go from many goroutines while
// rows arrive; the feed closes with the last one and reopens, and a watch
// made at the end is woken by its row.
func TestConcurrentWatches(t *testing.T) {
	f := newFake(t)
	h := newHub(t, nil, Options{})
	srv := testServer(t, f.srv.URL+"/")
	stop := make(chan struct{})
	var rows sync.WaitGroup
	rows.Add(1)
	go func() { // every feed the hub opens gets rows until the test ends
		defer rows.Done()
		for {
			select {
			case s := <-f.streams:
				go func() {
					for j := 0; ; j++ {
						select {
						case s.lines <- row(fmt.Sprintf("db%d", j%20), "updated", j+2):
						case <-s.done:
							return
						case <-stop:
							return
						}
					}
				}()
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				w, err := h.Watch(context.Background(), srv, fmt.Sprintf("db%d", (g+i)%20))
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					<-w.C() // rows of every database keep coming
				}
				w.Close()
			}
		}()
	}
	wg.Wait()
	if st := h.Stats(); st.Watches != 0 || st.Feeds != 0 {
		t.Fatalf("Stats = %+v after every watch closed, want none", st)
	}
	w := watch(t, h, srv, "db7")
	woken(t, w)
	close(stop)
	rows.Wait()
}

func TestReprobeShowsTheLastVerdict(t *testing.T) {
	f := newFake(t)
	f.probeStatus = http.StatusNotFound
	release := make(chan struct{})
	h := newHub(t, nil, Options{UnsupportedFor: time.Nanosecond})
	srv := testServer(t, f.srv.URL+"/")
	if _, err := h.Watch(context.Background(), srv, "a"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Watch: %v, want ErrUnsupported", err)
	}
	// The next probe hangs: while it does, the server shows its last
	// verdict and reason.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	srv.Open = testServer(t, slow.URL+"/").Open
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := h.Watch(ctx, srv, "a")
		done <- err
	}()
	eventually(t, "a feed probing", func() bool { return h.Stats().Feeds == 1 })
	st := h.Stats()
	if len(st.Servers) != 1 || st.Servers[0].State != StateUnsupported || st.Servers[0].Reason != "404 Not Found" {
		t.Fatalf("Stats while probing again = %+v, want the last verdict with its reason", st)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch: %v, want its context's error", err)
	}
}
