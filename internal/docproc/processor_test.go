package docproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/testserver"
)

// fakeJobs is an in-process JobStore that records what the processor asks.
type fakeJobs struct {
	mu      sync.Mutex
	jobs    map[string]*Job
	bodies  map[string]string
	adds    map[string]int // doc id -> AddPersistent calls
	removes map[string]int // job id -> Remove calls
	changes chan *Job
}

func newFakeJobs() *fakeJobs {
	return &fakeJobs{jobs: map[string]*Job{}, bodies: map[string]string{}, adds: map[string]int{},
		removes: map[string]int{}, changes: make(chan *Job, 100)}
}

func (f *fakeJobs) InTx(kv.Tx) TxJobs { return fakeTx{f} }

// fakeTx is fakeJobs' TxJobs: it applies at once, outside the transaction.
type fakeTx struct{ f *fakeJobs }

func (t fakeTx) AddPersistent(server, db, docID string, body json.RawMessage) (string, error) {
	return t.f.AddPersistent(context.Background(), server, db, docID, body)
}

func (t fakeTx) AddInvalid(server, db, docID string, body json.RawMessage, reason string) (string, error) {
	return t.f.AddInvalid(context.Background(), server, db, docID, body, reason)
}

func (t fakeTx) AddFromDoc(server, db, docID string, body json.RawMessage, st repjob.State, reason string, _ json.RawMessage) (string, error) {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	id := server + "|" + db + "|" + docID
	t.f.jobs[id] = &Job{ID: id, Persistent: true, Server: server, DB: db, DocID: docID, State: st, Reason: reason}
	t.f.bodies[id] = string(body)
	return id, nil
}

func (t fakeTx) Remove(jobID string) error { return t.f.Remove(context.Background(), jobID) }

func (t fakeTx) Get(jobID string) (*Job, error) { return t.f.Get(context.Background(), jobID) }

func (f *fakeJobs) AddPersistent(_ context.Context, server, db, docID string, body json.RawMessage) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := server + "|" + db + "|" + docID
	f.jobs[id] = &Job{ID: id, Persistent: true, Server: server, DB: db, DocID: docID, State: repjob.StatePending}
	f.bodies[id] = string(body)
	f.adds[docID]++
	return id, nil
}

func (f *fakeJobs) AddInvalid(_ context.Context, server, db, docID string, body json.RawMessage, reason string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := server + "|" + db + "|" + docID
	f.jobs[id] = &Job{ID: id, Persistent: true, Server: server, DB: db, DocID: docID, State: repjob.StateFailed, Reason: reason}
	f.bodies[id] = string(body)
	return id, nil
}

func (f *fakeJobs) Remove(_ context.Context, jobID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removes[jobID]++
	if f.jobs[jobID] == nil {
		return ErrJobNotFound
	}
	delete(f.jobs, jobID)
	return nil
}

func (f *fakeJobs) Get(_ context.Context, jobID string) (*Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.jobs[jobID]
	if j == nil {
		return nil, ErrJobNotFound
	}
	c := *j
	return &c, nil
}

func (f *fakeJobs) Persistent(context.Context) ([]*Job, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Job
	for _, j := range f.jobs {
		if j.Persistent {
			c := *j
			out = append(out, &c)
		}
	}
	return out, nil
}

func (f *fakeJobs) Follow(ctx context.Context, started func(), fn func(*Job) error) error {
	started()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case j := <-f.changes:
			if err := fn(j); err != nil {
				return err
			}
		}
	}
}

// finish ends a job as a worker would and reports the change.
func (f *fakeJobs) finish(t *testing.T, jobID string, state repjob.State, reason string) {
	t.Helper()
	f.mu.Lock()
	j := f.jobs[jobID]
	if j == nil {
		f.mu.Unlock()
		t.Fatalf("no job %s", jobID)
	}
	j.State, j.Reason, j.RepID = state, reason, "abc+continuous"
	j.Stats = map[string]any{"docs_read": 7, "docs_written": 7}
	j.StartTime = time.Now()
	c := *j
	f.mu.Unlock()
	f.changes <- &c
}

func (f *fakeJobs) addCount(docID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.adds[docID]
}

func (f *fakeJobs) body(jobID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bodies[jobID]
}

func (f *fakeJobs) removeCount(jobID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.removes[jobID]
}

// eventually polls cond (state in another process) until it holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// plainReplicatorDB stops pouchdb-server's own replicator daemon from
// driving _replicator (it moves it to another database) and recreates
// _replicator as a plain database, or leaves it absent.
func plainReplicatorDB(t *testing.T, s *testserver.Server, keep bool) {
	t.Helper()
	s.Do(t, "PUT", s.URL+"_config/replicator/db", []byte(`"pouchdb_own_replicator"`), 200)
	s.Do(t, "DELETE", s.URL+"_replicator", nil, 200)
	if keep {
		s.Do(t, "PUT", s.URL+"_replicator", nil, 201)
	}
}

func getDoc(t *testing.T, s *testserver.Server, db, id string) map[string]any {
	var m map[string]any
	s.GetJSON(t, s.DBURL(db)+id, &m)
	return m
}

func TestProcessorPouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server: skipped with -short")
	}
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after the servers are stopped
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	srv1 := testserver.StartPouchDB(t)
	srv2 := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv1, true)
	plainReplicatorDB(t, srv2, false)
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	fj := newFakeJobs()
	start := func() (stop func()) {
		p, err := New(Options{Servers: []string{srv1.URL, srv2.URL}, Node: "n1", Store: store, Jobs: fj, HTTPClient: client,
			Logger:       zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
			PollInterval: 100 * time.Millisecond, LeaseTTL: 3 * time.Second, FeedTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	stop := start()
	rdb := srv1.DBURL("_replicator")
	put := func(id string, body string) {
		srv1.Do(t, "PUT", rdb+id, []byte(body), 201)
	}
	key1 := couchKey(t, srv1.URL)
	job := func(id string) string { return key1 + "|_replicator|" + id }
	// sync waits until a fresh sentinel document was processed: every
	// change before it was too (the feed is in order).
	n := 0
	sync := func() {
		n++
		id := fmt.Sprintf("sentinel-%d", n)
		put(id, validBody)
		eventually(t, id+" added", func() bool { return fj.addCount(id) == 1 })
	}

	put("r1", `{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","continuous":true}`)
	put("_design/x", `{"views":{}}`)
	eventually(t, "r1 added", func() bool { return fj.addCount("r1") == 1 })

	// Completion is written back once, and the write starts nothing.
	fj.finish(t, job("r1"), repjob.StateCompleted, "")
	eventually(t, "r1 completed", func() bool {
		return getDoc(t, srv1, "_replicator", "r1")["_replication_state"] == repjob.StateCompleted.String()
	})
	doc := getDoc(t, srv1, "_replicator", "r1")
	stats, _ := doc["_replication_stats"].(map[string]any)
	// No _replication_id: [replicator] update_docs is false (CouchDB's default).
	if _, has := doc["_replication_id"]; has || stats["docs_written"] != float64(7) || stats["start_time"] == nil || doc["_replication_state_time"] == nil {
		t.Fatalf("written state: %v", doc)
	}
	sync()
	if got := fj.addCount("r1"); got != 1 {
		t.Fatalf("r1 added %d times after its own write-back", got)
	}
	if fj.addCount("_design/x") != 0 {
		t.Fatal("design document became a job")
	}

	// An invalid document fails with a reason naming the field.
	put("bad", `{"target":"http://127.0.0.1:1/b"}`)
	eventually(t, "bad failed", func() bool {
		return getDoc(t, srv1, "_replicator", "bad")["_replication_state"] == repjob.StateFailed.String()
	})
	if r := getDoc(t, srv1, "_replicator", "bad")["_replication_state_reason"]; r != "Missing `source` field" {
		t.Fatalf("reason %v", r)
	}
	if fj.addCount("bad") != 0 {
		t.Fatal("invalid document became a job")
	}

	// Editing a completed document (new target) while keeping its
	// _replication_state does not run it, as in CouchDB: its job is the
	// state read from the document.
	doc["target"] = "http://127.0.0.1:1/c"
	b, _ := json.Marshal(doc)
	srv1.Do(t, "PUT", rdb+"r1", b, 201)
	eventually(t, "r1 recorded from the document", func() bool { return fj.body(job("r1")) != "" && contains(fj.body(job("r1")), "127.0.0.1:1/c") })
	if got := fj.addCount("r1"); got != 1 {
		t.Fatalf("r1 added %d times: an edit keeping completed ran it", got)
	}
	// Removing the state runs it with the new parameters.
	srv1.GetJSON(t, rdb+"r1", &doc)
	delete(doc, "_replication_state")
	b, _ = json.Marshal(doc)
	srv1.Do(t, "PUT", rdb+"r1", b, 201)
	eventually(t, "r1 re-added", func() bool { return fj.addCount("r1") == 2 })
	if body := fj.body(job("r1")); !json.Valid([]byte(body)) || !contains(body, "127.0.0.1:1/c") || contains(body, "_replication") {
		t.Fatalf("new body %s", body)
	}

	// Deleting the document removes its job.
	var cur map[string]any
	srv1.GetJSON(t, rdb+"r1", &cur)
	srv1.Do(t, "DELETE", fmt.Sprintf("%sr1?rev=%s", rdb, cur["_rev"]), nil, 200)
	eventually(t, "r1 removed", func() bool { return fj.removeCount(job("r1")) == 1 })

	// A _replicator database created while running is discovered.
	srv2.Do(t, "PUT", srv2.URL+"_replicator", nil, 201)
	srv2.Do(t, "PUT", srv2.DBURL("_replicator")+"r2", []byte(validBody), 201)
	eventually(t, "r2 added", func() bool { return fj.addCount("r2") == 1 })

	// A restart resumes from the checkpoint: nothing is processed again.
	stop()
	stop = start()
	sync()
	for _, id := range []string{"r1", "bad", "r2", "sentinel-1"} {
		want := map[string]int{"r1": 2, "bad": 0, "r2": 1, "sentinel-1": 1}[id]
		if got := fj.addCount(id); got != want {
			t.Errorf("after restart %s added %d times, want %d", id, got, want)
		}
	}
	stop()
}

func contains(s, sub string) bool { return len(sub) == 0 || len(s) >= len(sub) && indexOf(s, sub) >= 0 }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

func couchKey(t testing.TB, u string) string {
	ep, err := couch.ParseEndpoint(u)
	if err != nil {
		t.Fatal(err)
	}
	return ep.Redacted()
}

func TestLease(t *testing.T) {
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	st := &state{store: store, keys: newKeyspace(nil), server: "http://h/", db: "_replicator"}
	t0 := time.Unix(1000, 0)
	ttl := 30 * time.Second
	steps := []struct {
		owner string
		at    time.Duration
		want  bool
	}{
		{"a", 0, true},                 // free: a takes it
		{"b", 10 * time.Second, false}, // held by a
		{"a", 20 * time.Second, true},  // a renews until 50 s
		{"b", 45 * time.Second, false}, // still a's
		{"b", 51 * time.Second, true},  // expired: b takes it
		{"a", 52 * time.Second, false}, // a lost it
	}
	for i, s := range steps {
		got, err := st.acquire(ctx, s.owner, t0.Add(s.at), ttl)
		if err != nil || got != s.want {
			t.Fatalf("step %d: acquire(%s) = %v, %v; want %v", i, s.owner, got, err, s.want)
		}
	}
	if err := st.release(ctx, "a"); err != nil { // not a's: no effect
		t.Fatal(err)
	}
	if ok, _ := st.acquire(ctx, "a", t0.Add(53*time.Second), ttl); ok {
		t.Fatal("release by a non-owner freed the lease")
	}
	if err := st.release(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := st.acquire(ctx, "a", t0.Add(54*time.Second), ttl); !ok {
		t.Fatal("released lease not free")
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal("unreachable")
	}
}
