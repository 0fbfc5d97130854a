package docproc

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/testserver"
)

// A fake _scheduler/docs answer stands for Apache CouchDB's scheduler,
// which no test here can run.
const (
	schedulerCompeting = `{"total_rows":4,"offset":0,"docs":[
		{"database":"_replicator","doc_id":"a","state":"running"},
		{"database":"_replicator","doc_id":"b","state":"crashing"},
		{"database":"_replicator","doc_id":"c","state":"pending"},
		{"database":"other/_replicator","doc_id":"d","state":"running"},
		{"database":"_users","doc_id":"e","state":"running"}]}`
	schedulerIdle = `{"total_rows":2,"offset":0,"docs":[
		{"database":"_replicator","doc_id":"c","state":"pending"},
		{"database":"_replicator","doc_id":"f","state":"completed"}]}`
)

func TestCheckServer(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		body       string
		want       string
		reason     string
		competing  map[string]int
		wantStates bool
	}{
		{"CouchDB running jobs", 200, schedulerCompeting, CheckCompeting, "", map[string]int{"_replicator": 2, "other/_replicator": 1}, true},
		{"CouchDB with max_jobs = 0", 200, schedulerIdle, CheckNoneFound, "", nil, true},
		{"no _scheduler (PouchDB Server)", 404, `{"error":"not_found","reason":"no_db_file"}`, CheckNoneFound, "answered 404", nil, true},
		{"not an admin", 401, `{"error":"unauthorized","reason":"You are not a server admin."}`, CheckUnknown, "server-admin credentials", nil, true},
		{"server error", 500, `{"error":"unknown_error","reason":"boom"}`, CheckUnknown, "500", nil, true},
		{"not a scheduler", 200, `[1,2]`, CheckNoneFound, "not a scheduler", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotQuery url.Values
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.EscapedPath() != "/_scheduler/docs" {
					http.NotFound(w, r)
					return
				}
				gotQuery = r.URL.Query()
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			defer ts.Close()
			// Credentials in the watched URL never show in what the check reports.
			withCreds := strings.Replace(ts.URL, "http://", "http://admin:s3cret@", 1)
			p, err := New(Options{Servers: []string{withCreds}, Store: nopStore(t), Jobs: newFakeJobs(), Logger: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			status, reason, jobs := p.checkServer(context.Background(), p.servers[0])
			if status != tc.want || !strings.Contains(reason, tc.reason) || len(jobs) != len(tc.competing) {
				t.Fatalf("got %s %q %v, want %s %q %v", status, reason, jobs, tc.want, tc.reason, tc.competing)
			}
			for db, n := range tc.competing {
				if jobs[db] != n {
					t.Fatalf("jobs[%s] = %d, want %d", db, jobs[db], n)
				}
			}
			if gotQuery.Get("states") != "running,crashing" {
				t.Fatalf("query %v", gotQuery)
			}
			p.comp.record(p.servers[0].key, status, reason, jobs, time.Now())
			if b, _ := json.Marshal(p.comp.Snapshot()); strings.Contains(string(b), "s3cret") || strings.Contains(reason, "s3cret") {
				t.Fatalf("credentials in the check: %s %s", b, reason)
			}
		})
	}
}

func nopStore(t *testing.T) *sqlite.DB {
	t.Helper()
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestCompetitionRecord(t *testing.T) {
	c := NewCompetition()
	c.register("http://h/", "refuse")
	t0 := time.Unix(1000, 0)
	if !c.blocked("http://h/", "_replicator") {
		t.Fatal("not blocked before the first check")
	}
	ch := c.changes()
	started, stopped := c.record("http://h/", CheckCompeting, "", map[string]int{"_replicator": 2}, t0)
	if len(started) != 1 || len(stopped) != 0 || !c.competing("http://h/", "_replicator") || c.competing("http://h/", "x/_replicator") {
		t.Fatalf("first competing check: started %v stopped %v", started, stopped)
	}
	select {
	case <-ch:
	default:
		t.Fatal("changes not signalled")
	}
	// Found again: nothing new to warn about, and since stays.
	started, _ = c.record("http://h/", CheckCompeting, "", map[string]int{"_replicator": 3}, t0.Add(time.Minute))
	snap := c.Snapshot()
	if len(started) != 0 || len(snap) != 1 || snap[0].Databases[0].Jobs != 3 || !snap[0].Databases[0].Since.Equal(t0) || snap[0].Action != "refuse" {
		t.Fatalf("second check: started %v, snapshot %+v", started, snap)
	}
	// A failed check keeps what was found.
	c.record("http://h/", CheckUnknown, "timeout", nil, t0.Add(2*time.Minute))
	if !c.competing("http://h/", "_replicator") || c.Snapshot()[0].Status != CheckUnknown {
		t.Fatal("a failed check forgot the competing database")
	}
	_, stopped = c.record("http://h/", CheckNoneFound, "", nil, t0.Add(3*time.Minute))
	if len(stopped) != 1 || c.blocked("http://h/", "_replicator") {
		t.Fatalf("stopped %v, still blocked %v", stopped, c.blocked("http://h/", "_replicator"))
	}
	var nilComp *Competition
	if nilComp.Snapshot() != nil {
		t.Fatal("nil Competition has checks")
	}
}

// schedulerProxy passes every request to a pouchdb-server except
// GET /_scheduler/docs, which it answers with answer() and counts.
type schedulerProxy struct {
	*httptest.Server
	answer atomic.Value // string
	checks atomic.Int64
}

func newSchedulerProxy(t *testing.T, target string) *schedulerProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &schedulerProxy{}
	p.answer.Store(schedulerIdle)
	rp := httputil.NewSingleHostReverseProxy(u)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.EscapedPath() == "/_scheduler/docs" {
			p.checks.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(p.answer.Load().(string)))
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// waitChecks waits until the processor asked the scheduler n more times.
func (p *schedulerProxy) waitChecks(t *testing.T, n int64) {
	t.Helper()
	want := p.checks.Load() + n
	eventually(t, "scheduler checks", func() bool { return p.checks.Load() >= want })
}

// syncBuf is a log sink tests read while the processor writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

// TestCompetingReplicatorPouchDB runs processors against a pouchdb-server
// whose _scheduler/docs (it has none) a proxy answers as CouchDB would.
func TestCompetingReplicatorPouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server: skipped with -short")
	}
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	proxy := newSchedulerProxy(t, srv.URL)
	rdb := srv.DBURL("_replicator")
	run := func(t *testing.T, action string, fj *fakeJobs, logs *syncBuf) (*Processor, func()) {
		comp := NewCompetition()
		p, err := New(Options{Servers: []string{proxy.URL}, Node: "n1", Store: nopStore(t), Jobs: fj,
			Logger:       zerolog.New(logs).Level(zerolog.InfoLevel),
			PollInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second, FeedTimeout: 2 * time.Second,
			Competition: comp, OnCompeting: action, CompetingInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return p, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	following := func(p *Processor) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.leased) > 0
	}

	t.Run("warn", func(t *testing.T) {
		proxy.answer.Store(schedulerCompeting)
		fj, logs := newFakeJobs(), &syncBuf{}
		p, stop := run(t, "warn", fj, logs)
		defer stop()
		srv.Do(t, "PUT", rdb+"w1", []byte(validBody), 201)
		eventually(t, "w1 added although competing", func() bool { return fj.addCount("w1") == 1 })
		proxy.waitChecks(t, 3)
		snap := p.comp.Snapshot()
		if len(snap) != 1 || snap[0].Status != CheckCompeting || snap[0].Action != "warn" || len(snap[0].Databases) != 2 {
			t.Fatalf("snapshot %+v", snap)
		}
		// Warned once per database, however many checks found it.
		if n := logs.count(`"db":"_replicator","jobs":2,"on_competing_replicator":"warn","message":"competing replicator:`); n != 1 {
			t.Fatalf("%d warnings for _replicator, want 1:\n%s", n, logs.b.String())
		}
	})

	t.Run("refuse", func(t *testing.T) {
		proxy.answer.Store(schedulerCompeting)
		fj, logs := newFakeJobs(), &syncBuf{}
		p, stop := run(t, "refuse", fj, logs)
		defer stop()
		srv.Do(t, "PUT", rdb+"r1", []byte(validBody), 201)
		proxy.waitChecks(t, 3)
		if fj.addCount("r1") != 0 || following(p) {
			t.Fatalf("processed a database the server's replicator works on (r1 added %d times)", fj.addCount("r1"))
		}
		// The server's replicator stops: couchrep takes over.
		proxy.answer.Store(schedulerIdle)
		eventually(t, "r1 added once the competitor stopped", func() bool { return fj.addCount("r1") == 1 })
		if logs.count(`"db":"_replicator","message":"competing replicator stopped`) != 1 {
			t.Fatalf("no log line for the competitor stopping:\n%s", logs.b.String())
		}
		// It starts again: couchrep stops following at once.
		proxy.answer.Store(schedulerCompeting)
		eventually(t, "stopped following", func() bool { return !following(p) })
		srv.Do(t, "PUT", rdb+"r2", []byte(validBody), 201)
		proxy.waitChecks(t, 3)
		if fj.addCount("r2") != 0 {
			t.Fatal("r2 processed while the server's replicator runs jobs")
		}
		proxy.answer.Store(schedulerIdle)
		eventually(t, "r2 added", func() bool { return fj.addCount("r2") == 1 })
	})
}
