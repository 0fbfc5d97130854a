package replicate

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/sharedfeed"
)

// TestFeedSharing checks which runs share a feed and with whom: only
// continuous runs with doc_ids, no filter or a selector the node evaluates
// share; two runs share exactly when everything that shapes the feed's
// request and connection is equal (not the doc_ids, the selector or the
// target; selector runs share a feed with documents, the others one
// without), so different credentials never share;
// neither the key nor the feed's name in logs holds a credential.
func TestFeedSharing(t *testing.T) {
	const src = "http://u:secret@127.0.0.1:5984/db"
	hub := sharedfeed.New(sharedfeed.Options{})
	run := func(extra, source string) *Replication {
		r := New(fakeParams(t, extra, source, "http://127.0.0.1:5984/tgt"), Options{Feeds: hub})
		if err := r.openDBs(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := run(`,"continuous":true,"doc_ids":["a"]`, src)
	if !base.sharesFeed() {
		t.Fatal("a continuous doc_ids run does not share")
	}
	fs := base.feedSource()
	key := fs.Key
	if strings.Contains(key, "secret") || strings.Contains(key, "127.0.0.1") {
		t.Errorf("key %q shows the source", key)
	}
	if strings.Contains(fs.Name, "secret") || !strings.Contains(fs.Name, "127.0.0.1:5984/db") {
		t.Errorf("feed name for logs %q: want the database without its password", fs.Name)
	}
	for _, c := range []struct {
		name, extra, source string
		shares, same        bool
	}{
		{"other doc_ids", `,"continuous":true,"doc_ids":["b","c"]`, src, true, true},
		{"no filter", `,"continuous":true`, src, true, true},
		{"other target only", `,"continuous":true,"create_target":true`, src, true, true},
		{"other password", `,"continuous":true`, "http://u:other@127.0.0.1:5984/db", true, false},
		{"other user", `,"continuous":true`, "http://v:secret@127.0.0.1:5984/db", true, false},
		{"no credentials", `,"continuous":true`, "http://127.0.0.1:5984/db", true, false},
		{"other database", `,"continuous":true`, "http://u:secret@127.0.0.1:5984/db2", true, false},
		{"proxy", `,"continuous":true,"source_proxy":"http://127.0.0.1:3128"`, src, true, false},
		{"connection_timeout", `,"continuous":true,"connection_timeout":5000`, src, true, false},
		{"winning_revs_only", `,"continuous":true,"winning_revs_only":true`, src, true, false},
		{"one-shot", ``, src, false, false},
		{"selector", `,"continuous":true,"selector":{"a":1}`, src, true, false},
		{"PCRE-only selector", `,"continuous":true,"selector":{"a":{"$regex":"(x)\\1"}}`, src, false, false},
		{"one-shot selector", `,"selector":{"a":1}`, src, false, false},
		{"named filter", `,"continuous":true,"filter":"d/f","query_params":{"x":1}`, src, false, false},
	} {
		r := run(c.extra, c.source)
		if got := r.sharesFeed(); got != c.shares {
			t.Errorf("%s: shares = %v, want %v", c.name, got, c.shares)
			continue
		}
		if ff, err := r.feedFilter(); c.shares && err == nil && (ff.Selector != nil) != strings.Contains(c.extra, "selector") {
			t.Errorf("%s: filter %+v", c.name, ff)
		}
		if c.shares {
			if same := r.feedSource().Key == key; same != c.same {
				t.Errorf("%s: same feed as the base = %v, want %v", c.name, same, c.same)
			}
		}
	}
}

// TestSelectorFeedKey: selector runs of one source share one feed with
// documents whatever their selectors, and other credentials never share it.
func TestSelectorFeedKey(t *testing.T) {
	const src = "http://u:secret@127.0.0.1:5984/central"
	hub := sharedfeed.New(sharedfeed.Options{})
	key := func(selector, source string) string {
		r := New(fakeParams(t, `,"continuous":true,"selector":`+selector, source, "http://127.0.0.1:5984/tgt"), Options{Feeds: hub})
		if err := r.openDBs(); err != nil {
			t.Fatal(err)
		}
		if !r.sharesFeed() {
			t.Fatalf("%s does not share", selector)
		}
		fs := r.feedSource()
		if !fs.IncludeDocs {
			t.Errorf("%s: the feed is read without documents", selector)
		}
		return fs.Key
	}
	alice := key(`{"owner":"alice"}`, src)
	if bob := key(`{"owner":"bob","type":{"$in":["a","b"]}}`, src); bob != alice {
		t.Error("two selectors of one source do not share a feed")
	}
	if other := key(`{"owner":"alice"}`, "http://v:secret@127.0.0.1:5984/central"); other == alice {
		t.Error("another user shares the feed")
	}
}

// TestSelectorCatchUpOnCouchDB: a continuous selector job sharing its
// source's feed catches up with the server's filter=_selector when the
// source is Apache CouchDB (GET / says so): the matching rows only, not
// every document; the shared feed it then follows is read with
// include_docs=true and no filter. (From PouchDB Server the catch-up is
// node-evaluated: integration's TestSharedSelectorFeed.)
func TestSelectorCatchUpOnCouchDB(t *testing.T) {
	f, fs := continuousSource(t)
	feedHook := f.hook
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/" {
			writeJSON(w, 200, map[string]any{"couchdb": "Welcome", "version": "3.4.3"})
			return true
		}
		return feedHook(w, r)
	}
	f.put("src", map[string]any{"_id": "x1", "type": "a"})
	f.put("src", map[string]any{"_id": "x2", "type": "b"})
	f.put("src", map[string]any{"_id": "x3", "type": "a"})
	hub := sharedfeed.New(sharedfeed.Options{})
	progress, o := progressOptions()
	o.Feeds = hub
	p := fakeParams(t, `,"continuous":true,"selector":{"type":"a"}`, f.URL+"/src", f.URL+"/tgt")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	New(p, o).Start(ctx, func(_ Result, err error) { done <- err })
	awaitWritten(t, progress, done, 2)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	bodies, queries := slices.Clone(f.changesBodies), slices.Clone(f.changesQuery)
	_, x2 := f.dbs["tgt"].docs["x2"]
	f.mu.Unlock()
	if len(bodies) != 1 || bodies[0] != `{"selector":{"type":"a"}}` || len(queries) != 1 ||
		!strings.Contains(queries[0], "filter=_selector") || strings.Contains(queries[0], "include_docs") {
		t.Errorf("catch-up requests: %q %q, want one POST filter=_selector", queries, bodies)
	}
	if x2 {
		t.Error("the target holds x2, which the selector does not take")
	}
	feeds := fs.queries()
	if len(feeds) == 0 || !strings.Contains(feeds[0], "include_docs=true") || strings.Contains(feeds[0], "filter") {
		t.Errorf("shared feed requests %q, want include_docs=true and no filter", feeds)
	}
}

// TestSeqAtOrBefore: when a subscription's start spares a job its
// catch-up: the same seq, numbers in order, or the start of a database
// (CouchDB's "0-…"); never for differing opaque seqs.
func TestSeqAtOrBefore(t *testing.T) {
	for _, tc := range []struct {
		a, b string // "" is the zero (nil) seq
		want bool
	}{
		{"0", "", true},
		{"", "", true},
		{"3", "3", true},
		{"3", "5", true},
		{"5", "3", false},
		{"3", "", false},
		{`"0-g1AAAA"`, "", true},
		{`"0-g1AAAA"`, `"7-g1BBBB"`, true},
		{`"7-g1BBBB"`, `"7-g1BBBB"`, true},
		{`"7-g1BBBB"`, `"7-g1CCCC"`, false},
		{`"7-g1BBBB"`, `"9-g1CCCC"`, false},
		{`"7-g1BBBB"`, "", false},
	} {
		var a, b couch.Seq
		if tc.a != "" {
			a = couch.Seq(tc.a)
		}
		if tc.b != "" {
			b = couch.Seq(tc.b)
		}
		if got := seqAtOrBefore(a, b); got != tc.want {
			t.Errorf("seqAtOrBefore(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
