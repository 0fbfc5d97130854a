package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/mango"
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

func newFeedProxy(t testing.TB, target string) *feedProxy {
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
		return map[string]any{"source": pcentral, "target": s.DBURL(target), "selector": sel, "checkpoint_interval": 500}
	}
	jobs := []struct{ target, selector string }{
		{"u-alice", `{"owner": "alice"}`},
		{"u-bob", `{"owner": "bob"}`},
		{"u-carol", `{"owner": "carol"}`},
		{"u-bob-big", `{"owner": "bob", "n": {"$gte": 2}}`},
	}
	running := map[string]*runningJob{}
	for _, j := range jobs {
		s.CreateDB(t, j.target)
		running[j.target] = startJob(t, docOf(j.target, j.selector), replicate.Options{Feeds: hub})
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
	var seqBefore struct {
		UpdateSeq couch.Seq `json:"update_seq"`
	}
	s.GetJSON(t, central, &seqBefore)
	if w.Moved(seqBefore.UpdateSeq) {
		t.Errorf("alice's watch says she has a row after %s: only bob's came", seqBefore.UpdateSeq)
	}
	s.PutRevs(t, central, doc("a4", "1-a", "alice", 4))
	select {
	case <-w.C():
	case <-time.After(time.Minute):
		t.Fatal("alice's watch did not fire for her document")
	}
	if !w.Moved(seqBefore.UpdateSeq) {
		t.Errorf("alice's watch fired and says she has no row after %s", seqBefore.UpdateSeq)
	}
	// carol's last row is c1, long before the central database's last
	// change. Restarted, her job catches up and its checkpoint moves to
	// the central database's update_seq (the rows her selector dropped are
	// done with): the next restart or wake-up reads from there, not from
	// c1. (While a job follows the shared feed, rows its selector drops do
	// not move its checkpoint, as with CouchDB's filtered feeds.)
	running["u-carol"].stop()
	carolDoc := docOf("u-carol", `{"owner": "carol"}`)
	startJob(t, carolDoc, replicate.Options{Feeds: hub})
	base, _, err := replicate.ID(params(t, carolDoc), "test-uuid")
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		UpdateSeq json.RawMessage `json:"update_seq"`
	}
	s.GetJSON(t, central, &info)
	var ckpt struct {
		SourceLastSeq json.RawMessage `json:"source_last_seq"`
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if resp, err := http.Get(s.DBURL("u-carol") + "_local/" + base); err == nil {
			ok := resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&ckpt) == nil
			resp.Body.Close()
			if ok && string(ckpt.SourceLastSeq) == string(info.UpdateSeq) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("carol's checkpoint: source_last_seq %s, want the central database's update_seq %s", ckpt.SourceLastSeq, info.UpdateSeq)
		}
		time.Sleep(100 * time.Millisecond) // the job's checkpoint timer: poll
	}

	delete(aliceDoc, "continuous")
	if _, err := replicate.WatchFeed(ctx, params(t, aliceDoc), replicate.Options{Feeds: hub}); !errors.Is(err, replicate.ErrNoSharedFeed) {
		t.Errorf("WatchFeed of a one-shot job: %v, want ErrNoSharedFeed", err)
	}
}

// TestPouchDBSelectorsAsCouchDB checks the node's selector evaluation
// (internal/mango, as the shared feed applies it: sharedfeed.MatchRow on a
// row read with include_docs) on documents read back from a real server,
// against the ids CouchDB 3.4.3's _selector filter gives. The table's
// expectations are CouchDB's rules (collation across types, ICU's for
// strings: "a" < "A" < "aa" < "b" < "B", canonically equivalent strings
// and ignorable characters equal); under make test-couchdb the test also
// asks the CouchDB for _changes?filter=_selector and requires the same ids
// (PouchDB Server cannot answer that request: it exits).
func TestPouchDBSelectorsAsCouchDB(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	db := s.CreateDB(t, "selectors")
	values := map[string]string{
		"null": `null`, "false": `false`, "true": `true`,
		"n1": `1`, "n1.5": `1.5`, "n5": `5`, "n10": `10`,
		"s-a": `"a"`, "s-A": `"A"`, "s-aa": `"aa"`, "s-b": `"b"`, "s-B": `"B"`, "s-e": `"e"`, "s-eacute": `"é"`,
		"s-ecomb": `"e\u0301"`, "s-10": `"10"`, "s-9": `"9"`, "s-shy": `"a\u00adb"`, "s-ab": `"ab"`, "s-dash": `"a-b"`,
		"a-empty": `[]`, "a-1": `[1]`, "a-12": `[1,2]`, "a-a": `["a"]`, "a-21": `[2,1]`,
		"o-empty": `{}`, "o-a1": `{"a":1}`, "o-b1": `{"b":1}`, "o-a1b2": `{"a":1,"b":2}`,
	}
	var docs []map[string]any
	for id, v := range values {
		var x any
		if err := json.Unmarshal([]byte(v), &x); err != nil {
			t.Fatal(err)
		}
		docs = append(docs, testserver.Doc(id, []string{"1-x"}, map[string]any{"v": x}))
	}
	docs = append(docs, testserver.Doc("missing", []string{"1-x"}, map[string]any{"w": 1}),
		// a deletion that keeps its body: CouchDB's filter sees {_id, _rev, v, _deleted}
		testserver.Deleted(testserver.Doc("del-a", []string{"2-d", "1-x"}, map[string]any{"v": "a"})))
	s.PutRevs(t, db, docs...)

	var feed struct {
		Results []struct {
			ID      string
			Deleted bool
			Changes []struct{ Rev string }
			Doc     json.RawMessage
		}
	}
	s.GetJSON(t, db+"_changes?include_docs=true", &feed)
	if len(feed.Results) != len(docs) {
		t.Fatalf("%d rows, want %d", len(feed.Results), len(docs))
	}

	for _, tc := range []struct {
		sel  string
		want []string // without del-a, which is added where s-a is
	}{
		{`{"v": {"$gt": "a"}}`, []string{"a-1", "a-12", "a-21", "a-a", "a-empty", "o-a1", "o-a1b2", "o-b1", "o-empty", "s-A", "s-B", "s-aa", "s-ab", "s-b", "s-dash", "s-e", "s-eacute", "s-ecomb", "s-shy"}},
		{`{"v": {"$lt": "B"}}`, []string{"false", "n1", "n1.5", "n10", "n5", "null", "s-10", "s-9", "s-A", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-shy", "true"}},
		{`{"v": {"$lte": "b"}}`, []string{"false", "n1", "n1.5", "n10", "n5", "null", "s-10", "s-9", "s-A", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-shy", "true"}},
		{`{"v": {"$eq": "é"}}`, []string{"s-eacute", "s-ecomb"}},
		{`{"v": "ab"}`, []string{"s-ab", "s-shy"}},
		{`{"v": {"$gte": 5}}`, []string{"a-1", "a-12", "a-21", "a-a", "a-empty", "n10", "n5", "o-a1", "o-a1b2", "o-b1", "o-empty", "s-10", "s-9", "s-A", "s-B", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-e", "s-eacute", "s-ecomb", "s-shy"}},
		{`{"v": {"$lt": 1.5}}`, []string{"false", "n1", "null", "true"}},
		{`{"v": {"$lt": "a"}}`, []string{"false", "n1", "n1.5", "n10", "n5", "null", "s-10", "s-9", "true"}},
		{`{"v": {"$gt": [1]}}`, []string{"a-12", "a-21", "a-a", "o-a1", "o-a1b2", "o-b1", "o-empty"}},
		{`{"v": {"$lte": {"a": 1}}}`, []string{"a-1", "a-12", "a-21", "a-a", "a-empty", "false", "n1", "n1.5", "n10", "n5", "null", "o-a1", "o-empty", "s-10", "s-9", "s-A", "s-B", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-e", "s-eacute", "s-ecomb", "s-shy", "true"}},
		{`{"v": {"$in": [1, "a", [1]]}}`, []string{"a-1", "a-12", "a-21", "a-a", "n1", "s-a"}},
		{`{"v": {"$nin": [1, "b"]}}`, []string{"a-a", "a-empty", "false", "n1.5", "n10", "n5", "null", "o-a1", "o-a1b2", "o-b1", "o-empty", "s-10", "s-9", "s-A", "s-B", "s-a", "s-aa", "s-ab", "s-dash", "s-e", "s-eacute", "s-ecomb", "s-shy", "true"}},
		{`{"v": {"$exists": false}}`, []string{"missing"}},
		{`{"v": {"$type": "string"}}`, []string{"s-10", "s-9", "s-A", "s-B", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-e", "s-eacute", "s-ecomb", "s-shy"}},
		{`{"v": {"$size": 2}}`, []string{"a-12", "a-21"}},
		{`{"v": {"$all": [1]}}`, []string{"a-1", "a-12", "a-21"}},
		{`{"v": {"$elemMatch": {"$gt": 1}}}`, []string{"a-12", "a-21", "a-a"}},
		{`{"v": {"$allMatch": {"$gt": 0}}}`, []string{"a-1", "a-12", "a-21", "a-a"}},
		{`{"v": {"$regex": "^a"}}`, []string{"s-a", "s-aa", "s-ab", "s-dash", "s-shy"}},
		{`{"v": {"$beginsWith": "a"}}`, []string{"s-a", "s-aa", "s-ab", "s-dash", "s-shy"}},
		{`{"v": {"$mod": [5, 0]}}`, []string{"n10", "n5"}},
		{`{"v.a": 1}`, []string{"o-a1", "o-a1b2"}},
		{`{"v": {"$keyMapMatch": {"$eq": "b"}}}`, []string{"o-a1b2", "o-b1"}},
		{`{"$or": [{"v": null}, {"v": true}]}`, []string{"null", "true"}},
		{`{"$nor": [{"v": {"$type": "string"}}, {"v": {"$type": "number"}}]}`, []string{"a-1", "a-12", "a-21", "a-a", "a-empty", "false", "null", "o-a1", "o-a1b2", "o-b1", "o-empty", "true"}},
		{`{"v": {"$not": {"$gt": "B"}}}`, []string{"false", "n1", "n1.5", "n10", "n5", "null", "s-10", "s-9", "s-A", "s-B", "s-a", "s-aa", "s-ab", "s-b", "s-dash", "s-shy", "true"}},
		{`{"_deleted": true}`, []string{}},
		{`{"_id": {"$gt": "s-a", "$lt": "s-b"}}`, []string{"s-aa", "s-ab"}}, // _id: bytes ("s-B" < "s-a")
	} {
		want := append([]string{}, tc.want...)
		if slices.Contains(want, "s-a") || tc.sel == `{"_deleted": true}` {
			want = append(want, "del-a")
		}
		sort.Strings(want)
		sel, err := mango.Parse([]byte(tc.sel))
		if err != nil {
			t.Fatalf("%s: %v", tc.sel, err)
		}
		var got []string
		for _, r := range feed.Results {
			c := couch.Change{ID: r.ID, Deleted: r.Deleted, Doc: r.Doc}
			for _, ch := range r.Changes {
				c.Revs = append(c.Revs, ch.Rev)
			}
			if _, ok := sharedfeed.MatchRow(c, sel); ok {
				got = append(got, r.ID)
			}
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("node: %s matches %q, want %q", tc.sel, got, want)
		}
		if !s.External() {
			continue
		}
		var filtered struct{ Results []struct{ ID string } }
		b := s.Do(t, http.MethodPost, db+"_changes?filter=_selector", json.RawMessage(`{"selector":`+tc.sel+`}`), http.StatusOK)
		if err := json.Unmarshal(b, &filtered); err != nil {
			t.Fatal(err)
		}
		var couchIDs []string
		for _, r := range filtered.Results {
			couchIDs = append(couchIDs, r.ID)
		}
		sort.Strings(couchIDs)
		if !slices.Equal(couchIDs, want) {
			t.Errorf("CouchDB: %s matches %q, want (the node's) %q", tc.sel, couchIDs, want)
		}
	}
}

// TestParkingFanOut: continuous selector jobs (per-user slices of a central
// database on PouchDB Server, which has no _db_updates) and a doc_ids job,
// run by couchrepd, park after idle_park_after on watches on their shared
// feeds: the feeds stay open (one with documents for the selector jobs, one
// without for the doc_ids job), no engine runs. A write for nobody wakes
// no one, even with a recheck every second (the central database moved,
// but no job has a row); a write for one user wakes that job alone, which
// replicates it and parks again; the others stay parked since the same time.
func TestParkingFanOut(t *testing.T) {
	skipShort(t)
	s := testserver.StartPouchDB(t)
	px := newParkProxy(t, s.URL)
	central := s.CreateDB(t, "central")
	const users = 4
	var first []map[string]any
	for i := range users {
		first = append(first, map[string]any{"_id": fmt.Sprintf("u%d-first", i), "owner": fmt.Sprintf("u%d", i)})
		s.CreateDB(t, fmt.Sprintf("t-u%d", i))
	}
	first = append(first, map[string]any{"_id": "pinned", "owner": "nobody"})
	s.CreateDB(t, "t-ids")
	s.PutDocs(t, central, first...)
	dir := t.TempDir()
	node := startNode(t, nodeOptions{dataDir: dir, config: writeConfig(t, dir, fmt.Sprintf(parkNodeConfig, "1"))})
	addr := node.httpAddr("")
	jobs := map[string]string{} // target -> replication id
	start := func(target, filter string) {
		body := fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,%s}`, px.URL+"/central", s.DBURL(target), filter)
		rep := api(t, addr, "POST", "/_replicate", body)
		if rep.status != http.StatusAccepted {
			t.Fatalf("POST /_replicate: %d %s", rep.status, rep.body)
		}
		jobs[target] = rep.obj(t)["_local_id"].(string)
	}
	for i := range users {
		start(fmt.Sprintf("t-u%d", i), fmt.Sprintf(`"selector":{"owner":"u%d"}`, i))
	}
	start("t-ids", `"doc_ids":["pinned"]`)

	has := func(db, id string) bool {
		resp, err := http.Get(s.DBURL(db) + id)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within a minute", what)
			}
			time.Sleep(50 * time.Millisecond) // other processes' state: poll
		}
	}
	schedJobs := func() map[string]map[string]any {
		rep := api(t, addr, "GET", "/_scheduler/jobs", "")
		var out struct {
			Jobs []map[string]any `json:"jobs"`
		}
		if err := json.Unmarshal(rep.body, &out); err != nil {
			t.Fatalf("_scheduler/jobs: %v: %s", err, rep.body)
		}
		m := map[string]map[string]any{}
		for _, j := range out.Jobs {
			m[j["id"].(string)] = j
		}
		return m
	}
	parkedSince := func() map[string]any {
		out := map[string]any{}
		for target, id := range jobs {
			if j := schedJobs()[id]; parkedJob(j) {
				out[target] = j["info"].(map[string]any)["parked_since"]
			}
		}
		return out
	}
	allParked := func() bool { return len(parkedSince()) == len(jobs) }

	for i := range users {
		db, id := fmt.Sprintf("t-u%d", i), fmt.Sprintf("u%d-first", i)
		await(db+" has "+id, func() bool { return has(db, id) })
	}
	await("t-ids has pinned", func() bool { return has("t-ids", "pinned") })
	await("every job parked", allParked)
	if open := px.open.Load(); open != 2 {
		t.Errorf("%d continuous feeds open with every job parked, want 2 (the selector jobs' and the doc_ids job's shared feeds)", open)
	}
	since := parkedSince()

	// A write for nobody moves the central database: no job has a row,
	// and the rechecks (park_recheck 1 s, each job's every 0.5-1.5 s) all
	// along what follows must not wake one. Then a write for u2: that job
	// alone wakes, replicates it and parks again (after idle_park_after,
	// 1 s, a time in which every other job rechecked).
	s.PutDocs(t, central, map[string]any{"_id": "stranger", "owner": "nobody-else"})
	s.PutDocs(t, central, map[string]any{"_id": "u2-second", "owner": "u2"})
	await("t-u2 has u2-second", func() bool { return has("t-u2", "u2-second") })
	await("every job parked again", allParked)
	got := parkedSince()
	for target, v := range since {
		if woke := got[target] != v; woke != (target == "t-u2") {
			t.Errorf("%s: parked since %v, then %v: want a new time for t-u2 alone", target, v, got[target])
		}
	}
	if has("t-u1", "u2-second") || has("t-u1", "stranger") {
		t.Error("t-u1 holds another user's document")
	}
}

// BenchmarkParkedFanOut measures a node with N continuous per-user
// selector jobs of one central PouchDB Server database
// (COUCHREP_BENCH_FANOUT, default 1000), each job's slice one document,
// all into one target database: the time until all are parked
// (idle_park_after 5 s), then, all parked, 30 s idle: the node's and the
// server's CPU, the node's RSS and open descriptors, the continuous feeds
// open at the server; then a write for one user → its document in the
// target (20 writes, a random user each: p50, p99).
func BenchmarkParkedFanOut(b *testing.B) {
	n := 1000
	if v := os.Getenv("COUCHREP_BENCH_FANOUT"); v != "" {
		if _, err := fmt.Sscanf(v, "%d", &n); err != nil {
			b.Fatal(err)
		}
	}
	for range b.N {
		benchParkedFanOut(b, n)
	}
}

func benchParkedFanOut(b *testing.B, n int) {
	s := testserver.StartPouchDB(b)
	px := newFeedProxy(b, s.URL)
	central := s.CreateDB(b, "central")
	tgt := s.CreateDB(b, "tgt")
	var docs []map[string]any
	for i := range n {
		docs = append(docs, map[string]any{"_id": fmt.Sprintf("u%05d-0", i), "owner": fmt.Sprintf("u%05d", i)})
	}
	for len(docs) > 0 {
		k := min(len(docs), 1000)
		s.PutDocs(b, central, docs[:k]...)
		docs = docs[k:]
	}
	dir := b.TempDir()
	config := filepath.Join(dir, "couchrep.ini")
	if err := os.WriteFile(config, fmt.Appendf(nil, "[replicator]\nstartup_jitter = 0\nmax_jobs = %d\nidle_park_after = 5\npark_recheck = 600\n", n+10), 0o644); err != nil {
		b.Fatal(err)
	}
	node := startNode(b, nodeOptions{dataDir: dir, extra: []string{"--log-level", "info"}, config: config})
	addr := node.httpAddr("")
	nodePID, srvPID := node.cmd.Process.Pid, serverPID(s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	if _, err := submitReplicate(ctx, addr, n, 32, func(i int) string {
		return fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"selector":{"owner":"u%05d"}}`, px.URL+"/central", tgt, i)
	}); err != nil {
		b.Fatal(err)
	}
	parked := metricPrefix("couchrep_replication_jobs_parked")
	for metricSum(b, addr, parked) < float64(n) {
		if time.Since(start) > 30*time.Minute {
			b.Fatalf("%.0f of %d jobs parked after 30 minutes", metricSum(b, addr, parked), n)
		}
		time.Sleep(time.Second) // another process's state: poll
	}
	allParked := time.Since(start)
	b.StopTimer()

	load0 := loadAvg()
	nodeCPU, srvCPU := procCPU(nodePID), procCPU(srvPID)
	const idle = 30 * time.Second
	time.Sleep(idle) // the idle time measured
	nodeIdle := float64(procCPU(nodePID)-nodeCPU) / float64(idle) * 100
	srvIdle := float64(procCPU(srvPID)-srvCPU) / float64(idle) * 100
	nodeRSS, nodeFDs, open := procRSS(nodePID), procFDs(nodePID), px.open.Load()

	var lat []time.Duration
	for k := range 20 {
		id := fmt.Sprintf("u%05d-w%d", (k*7919)%n, k)
		t0 := time.Now()
		s.PutDocs(b, central, map[string]any{"_id": id, "owner": id[:6]})
		for !docExists(http.DefaultClient, tgt, id) {
			if time.Since(t0) > time.Minute {
				b.Fatalf("%s not in the target after a minute", id)
			}
			time.Sleep(5 * time.Millisecond) // another process's state: poll
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)-1]
	b.ReportMetric(allParked.Seconds(), "all-parked-s")
	b.ReportMetric(nodeIdle, "node-idle-%cpu")
	b.ReportMetric(srvIdle, "server-idle-%cpu")
	b.ReportMetric(float64(nodeRSS)/(1<<20), "node-RSS-MB")
	b.ReportMetric(float64(nodeFDs), "node-fds")
	b.ReportMetric(p99.Seconds()*1000, "write-p99-ms")
	b.Logf("jobs=%d: all parked %s after the first POST; idle %s: couchrepd %.2f%% of a core, pouchdb-server %.2f%%; RSS couchrepd %.1f MB; fds %d; continuous feeds open at the server %d; write → target p50 %s p99 %s (20, a parked job woken each); load %s -> %s",
		n, allParked.Round(time.Second), idle, nodeIdle, srvIdle, float64(nodeRSS)/(1<<20), nodeFDs, open,
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), load0, loadAvg())
}
