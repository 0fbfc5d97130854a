package docproc

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/couchrep/couchrep/internal/kv/sqlite"
)

// TestDiscoverDBUpdates checks discovery on a CouchDB-shaped server (which
// pouchdb-server cannot stand in for): _db_updates is used, and a
// "other/_replicator" database is found and addressed with its "/" escaped.
func TestDiscoverDBUpdates(t *testing.T) {
	longpoll := make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/_all_dbs":
			_, _ = w.Write([]byte(`["_replicator","_users","other/_replicator","x_replicator"]`))
		case r.URL.Path == "/_db_updates" && r.URL.Query().Get("feed") == "normal":
			_, _ = w.Write([]byte(`{"results":[],"last_seq":"5-g1AAAA"}`))
		case r.URL.Path == "/_db_updates":
			if r.URL.Query().Get("since") != "5-g1AAAA" {
				http.Error(w, `{"error":"bad_request"}`, 400)
				return
			}
			select {
			case longpoll <- struct{}{}:
				_, _ = w.Write([]byte(`{"results":[{"db_name":"third/_replicator","type":"created","seq":"6-x"},{"db_name":"_replicator","type":"deleted","seq":"7-x"}],"last_seq":"7-x"}`))
			case <-r.Context().Done():
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer ts.Close()
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	p, err := New(Options{Servers: []string{ts.URL}, Store: store, Jobs: newFakeJobs(), Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan snapshot)
	done := make(chan struct{})
	go func() { defer close(done); p.discover(ctx, 0, snaps) }()
	want := []map[string]bool{
		{"_replicator": true, "other/_replicator": true},
		{"other/_replicator": true, "third/_replicator": true},
	}
	for i, w := range want {
		s := <-snaps
		if len(s.dbs) != len(w) {
			t.Fatalf("snapshot %d = %v, want %v", i, s.dbs, w)
		}
		for k := range w {
			if !s.dbs[k] {
				t.Fatalf("snapshot %d = %v, want %v", i, s.dbs, w)
			}
		}
	}
	cancel()
	<-done
	if got := p.servers[0].dbEndpoint("other/_replicator").URL.EscapedPath(); got != "/other%2F_replicator/" {
		t.Fatalf("endpoint path %q", got)
	}
}
