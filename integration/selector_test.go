package integration

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/testserver"
)

// feedProxy forwards to a server and records the _changes requests: the
// filters asked for, the continuous feeds open (and with include_docs).
type feedProxy struct {
	*httptest.Server
	mu      sync.Mutex
	filters []string
	open    atomic.Int64
	docs    atomic.Int64 // continuous feeds opened with include_docs=true
}

func newFeedProxy(t *testing.T, target string) *feedProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0) // feeds cut at the end of the test are not news
	p := &feedProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if strings.HasSuffix(r.URL.Path, "/_changes") {
			if f := q.Get("filter"); f != "" {
				p.mu.Lock()
				p.filters = append(p.filters, f)
				p.mu.Unlock()
			}
			if q.Get("feed") == "continuous" {
				p.open.Add(1)
				defer p.open.Add(-1)
				if q.Get("include_docs") == "true" {
					p.docs.Add(1)
				}
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// TestSharedSelectorFeed: continuous selector replications from one
// PouchDB Server database (per-user slices of a central database, a fan-out)
// share one continuous feed read with include_docs=true, the selectors
// evaluated on the node; their catch-ups are node-evaluated too: no request
// asks PouchDB Server for filter=_selector (which it answers with a 404,
// then exits). Each target ends with exactly the documents whose winning
// revision matches its selector: written before the jobs (catch-up) and
// after (the shared feed), updated, deleted with the matching field kept
// (replicated) or without a body (not replicated, as CouchDB's _selector
// filter sees {_id, _rev, _deleted: true} for it).
func TestSharedSelectorFeed(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	central := s.CreateDB(t, "central")
	proxy := newFeedProxy(t, s.URL)
	pcentral := proxy.URL + "/central/"
	hub := sharedfeed.New(sharedfeed.Options{})

	doc := func(id, rev, owner string, n int) map[string]any {
		return testserver.Doc(id, []string{rev}, map[string]any{"owner": owner, "n": n})
	}
	// Before the jobs: caught up by each job on its own.
	s.PutRevs(t, central, doc("a1", "1-a", "alice", 1), doc("b1", "1-a", "bob", 1), doc("a-gone", "1-a", "alice", 1),
		doc("a-del", "1-a", "alice", 1), doc("x1", "1-a", "nobody", 9))
	beforeGone := leaves(t, s, central)["a-gone"]

	docOf := func(target, selector string) map[string]any {
		var sel map[string]any
		if err := json.Unmarshal([]byte(selector), &sel); err != nil {
			t.Fatal(err)
		}
		return map[string]any{"source": pcentral, "target": s.DBURL(target), "selector": sel}
	}
	jobs := []struct{ target, selector string }{
		{"u-alice", `{"owner": "alice"}`},
		{"u-bob", `{"owner": "bob"}`},
		{"u-carol", `{"owner": "carol"}`},
		{"u-bob-big", `{"owner": "bob", "n": {"$gte": 2}}`},
	}
	for _, j := range jobs {
		s.CreateDB(t, j.target)
		startJob(t, docOf(j.target, j.selector), replicate.Options{Feeds: hub})
	}

	// Each job caught up (its subscription is then open): what follows
	// comes through the shared feed. (A deletion written during a
	// catch-up may reach the target anyway, as with CouchDB: the worker
	// fetches the latest revision of the one the catch-up matched.)
	before := leaves(t, s, central)
	awaitLeaves(t, s, s.DBURL("u-alice"), subset(before, "a1", "a-gone", "a-del"), 2*time.Minute)
	awaitLeaves(t, s, s.DBURL("u-bob"), subset(before, "b1"), 2*time.Minute)

	// After: through the shared feed.
	s.PutRevs(t, central, doc("a2", "1-a", "alice", 1), doc("b2", "1-a", "bob", 2), doc("c1", "1-a", "carol", 5),
		testserver.Doc("a1", []string{"2-b", "1-a"}, map[string]any{"owner": "alice", "n": 2}),
		testserver.Deleted(testserver.Doc("a-gone", []string{"2-d", "1-a"}, nil)),
		testserver.Deleted(testserver.Doc("a-del", []string{"2-d", "1-a"}, map[string]any{"owner": "alice"})),
		doc("b3", "1-a", "bob", 3), doc("a3", "1-a", "alice", 3))

	all := leaves(t, s, central)
	alice := subset(all, "a1", "a2", "a3", "a-del")
	alice["a-gone"] = beforeGone
	awaitLeaves(t, s, s.DBURL("u-alice"), alice, 2*time.Minute)
	awaitLeaves(t, s, s.DBURL("u-bob"), subset(all, "b1", "b2", "b3"), 2*time.Minute)
	awaitLeaves(t, s, s.DBURL("u-carol"), subset(all, "c1"), 2*time.Minute)
	awaitLeaves(t, s, s.DBURL("u-bob-big"), subset(all, "b2", "b3"), 2*time.Minute)

	if st := hub.Stats(); st.Feeds != 1 || st.Subscriptions != len(jobs) {
		t.Errorf("hub: %+v, want 1 feed with %d subscriptions", st, len(jobs))
	}
	if open, docs := proxy.open.Load(), proxy.docs.Load(); open != 1 || docs != 1 {
		t.Errorf("%d continuous feeds open at the server (%d with include_docs), want 1 (1) for %d jobs", open, docs, len(jobs))
	}
	proxy.mu.Lock()
	if len(proxy.filters) > 0 {
		t.Errorf("the server was asked for filters %v, want none (the node evaluates the selectors)", proxy.filters)
	}
	proxy.mu.Unlock()

	// A parked alice job's wake-up: a watch on the same feed, holding no
	// rows, that fires for alice's rows only.
	ctx := context.Background()
	aliceDoc := docOf("u-alice", `{"owner": "alice"}`)
	aliceDoc["continuous"] = true
	w, err := replicate.WatchFeed(ctx, params(t, aliceDoc), replicate.Options{Feeds: hub})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if st := hub.Stats(); st.Feeds != 1 || st.Watches != 1 {
		t.Errorf("hub with the watch: %+v, want it on the one feed", st)
	}
	s.PutRevs(t, central, doc("b4", "1-a", "bob", 4))
	all = leaves(t, s, central)
	awaitLeaves(t, s, s.DBURL("u-bob"), subset(all, "b1", "b2", "b3", "b4"), 2*time.Minute)
	select {
	case <-w.C():
		t.Error("alice's watch fired for bob's document")
	default:
	}
	s.PutRevs(t, central, doc("a4", "1-a", "alice", 4))
	select {
	case <-w.C():
	case <-time.After(time.Minute):
		t.Fatal("alice's watch did not fire for her document")
	}
	if err := w.Err(); err != nil {
		t.Errorf("watch: %v", err)
	}
	delete(aliceDoc, "continuous")
	if _, err := replicate.WatchFeed(ctx, params(t, aliceDoc), replicate.Options{Feeds: hub}); !errors.Is(err, replicate.ErrNoSharedFeed) {
		t.Errorf("WatchFeed of a one-shot job: %v, want ErrNoSharedFeed", err)
	}
}
