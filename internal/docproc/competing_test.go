package docproc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/couchrep/couchrep/internal/takeover"
	"github.com/couchrep/couchrep/internal/takeover/takeovertest"
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

// TestCheckServer runs the node's check against a CouchDB-shaped fake
// (internal/takeover/takeovertest): the verdict follows the facts.
func TestCheckServer(t *testing.T) {
	off := `{"max_jobs":"0"}`
	for _, tc := range []struct {
		name       string
		set        func(f *takeovertest.Fake)
		want       string
		serverWide bool
		reason     string
		competing  map[string]int
		keep       bool
	}{
		{"CouchDB's replicator on, no job running yet (finding 5)", func(f *takeovertest.Fake) {}, CheckCompeting, true, "max_jobs = 500", nil, false},
		{"CouchDB running jobs", func(f *takeovertest.Fake) { f.Scheduler = schedulerCompeting }, CheckCompeting, true, "3 document(s)", map[string]int{"_replicator": 2, "other/_replicator": 1}, false},
		{"CouchDB with max_jobs = 0", func(f *takeovertest.Fake) { f.NodeConfig, f.Scheduler = off, schedulerIdle }, CheckNoneFound, false, "max_jobs = 0", nil, false},
		{"max_jobs = 0, a replication task still running", func(f *takeovertest.Fake) {
			f.NodeConfig, f.Tasks = off, `[{"type":"replication"}]`
		}, CheckCompeting, true, "1 replication task", nil, false},
		{"another couchrep store", func(f *takeovertest.Fake) {
			f.NodeConfig = off
			f.Markers = map[string]string{"_replicator": fmt.Sprintf(`{"stores":{"0ther":{"node":"n9","updated":%q,"every_s":30}}}`, time.Now().UTC().Format(time.RFC3339))}
		}, CheckCompeting, false, "store 0ther (node n9)", map[string]int{"_replicator": 0}, false},
		{"no _node config, no _scheduler (PouchDB Server)", func(f *takeovertest.Fake) {
			f.NodeConfig, f.OldConfig, f.Scheduler = "", `{"db":"_replicator"}`, ""
		}, CheckUnknown, false, "/_config/replicator has no max_jobs", nil, false},
		{"not an admin", func(f *takeovertest.Fake) { f.Status = 401 }, CheckUnknown, false, "server-admin credentials", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := takeovertest.New(t)
			f.Set(tc.set)
			// Credentials in the watched URL never show in what the check reports.
			withCreds := strings.Replace(f.URL, "http://", "http://admin:s3cret@", 1)
			p, err := New(Options{Servers: []string{withCreds}, Store: nopStore(t), Jobs: newFakeJobs(), Logger: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			v, keep := p.checkServer(context.Background(), p.servers[0])
			if v.Status != tc.want || v.ServerWide != tc.serverWide || !strings.Contains(v.Reason, tc.reason) || len(v.Jobs) != len(tc.competing) || keep != tc.keep {
				t.Fatalf("got %+v keep %v, want %s server-wide %v %q %v keep %v", v, keep, tc.want, tc.serverWide, tc.reason, tc.competing, tc.keep)
			}
			for db, n := range tc.competing {
				if v.Jobs[db] != n {
					t.Fatalf("jobs[%s] = %d, want %d", db, v.Jobs[db], n)
				}
			}
			p.comp.record(p.servers[0].key, v, keep, time.Now())
			if got := p.comp.competing(p.servers[0].key, "any/_replicator"); got != tc.serverWide {
				t.Fatalf("any database competing = %v, want %v (server-wide)", got, tc.serverWide)
			}
			if b, _ := json.Marshal(p.comp.Snapshot()); strings.Contains(string(b), "s3cret") || strings.Contains(v.Reason, "s3cret") {
				t.Fatalf("credentials in the check: %s %s", b, v.Reason)
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
	competing := func(jobs map[string]int) takeover.Verdict {
		return takeover.Verdict{Status: CheckCompeting, Jobs: jobs}
	}
	got := c.record("http://h/", competing(map[string]int{"_replicator": 2}), false, t0)
	if len(got.started) != 1 || len(got.stopped) != 0 || !c.competing("http://h/", "_replicator") || c.competing("http://h/", "x/_replicator") {
		t.Fatalf("first competing check: %+v", got)
	}
	select {
	case <-ch:
	default:
		t.Fatal("changes not signalled")
	}
	// Found again: nothing new to warn about, and since stays.
	got = c.record("http://h/", competing(map[string]int{"_replicator": 3}), false, t0.Add(time.Minute))
	snap := c.Snapshot()
	if len(got.started) != 0 || len(snap) != 1 || snap[0].Databases[0].Jobs != 3 || !snap[0].Databases[0].Since.Equal(t0) || snap[0].Action != "refuse" {
		t.Fatalf("second check: %+v, snapshot %+v", got, snap)
	}
	// A check that read nothing keeps what was found.
	c.record("http://h/", takeover.Verdict{Status: CheckUnknown, Reason: "timeout"}, true, t0.Add(2*time.Minute))
	if !c.competing("http://h/", "_replicator") || c.Snapshot()[0].Status != CheckUnknown {
		t.Fatal("a failed check forgot the competing database")
	}
	// The server's own replicator turns on: every database competes.
	got = c.record("http://h/", takeover.Verdict{Status: CheckCompeting, ServerWide: true}, false, t0.Add(3*time.Minute))
	if !got.serverOn || len(got.stopped) != 1 || !c.blocked("http://h/", "x/_replicator") {
		t.Fatalf("server-wide: %+v", got)
	}
	// Unknown with facts read (no max_jobs to read, nothing else found):
	// nothing competes any more.
	got = c.record("http://h/", takeover.Verdict{Status: CheckUnknown, Reason: "no max_jobs"}, false, t0.Add(4*time.Minute))
	if !got.serverOff || c.blocked("http://h/", "_replicator") {
		t.Fatalf("off: %+v, still blocked %v", got, c.blocked("http://h/", "_replicator"))
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
	// One job store for both runs: the marker the first run leaves names
	// this store, not another one's.
	store := nopStore(t)
	run := func(t *testing.T, action string, fj *fakeJobs, logs *syncBuf) (*Processor, func()) {
		comp := NewCompetition()
		p, err := New(Options{Servers: []string{proxy.URL}, Node: "n1", Store: store, Jobs: fj,
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
