package couch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestFeedPending: a _changes answer's "pending" is read where CouchDB
// gives it — normal and longpoll answers, the last line of a continuous
// feed that ends — and is unknown where it is absent (PouchDB Server 4.2
// never sends it) or not a count.
func TestFeedPending(t *testing.T) {
	cases := []struct {
		name, feed, body string
		want             int64 // -1: unknown
	}{
		{"normal", FeedNormal, `{"results":[{"seq":"1-a","id":"x","changes":[{"rev":"1-a"}]}],"last_seq":"1-a","pending":41}`, 41},
		{"longpoll, pending before last_seq", FeedLongpoll, `{"pending":3,"results":[],"last_seq":"7-a"}`, 3},
		{"normal without pending (PouchDB Server)", FeedNormal, `{"results":[],"last_seq":5}`, -1},
		{"pending null", FeedNormal, `{"results":[],"last_seq":5,"pending":null}`, -1},
		{"continuous that ends", FeedContinuous, "{\"seq\":\"1-a\",\"id\":\"x\",\"changes\":[{\"rev\":\"1-a\"}]}\n\n{\"last_seq\":\"1-a\",\"pending\":12}\n", 12},
		{"continuous without pending", FeedContinuous, "{\"last_seq\":3}\n", -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			ep, err := ParseEndpoint(srv.URL + "/db")
			if err != nil {
				t.Fatal(err)
			}
			d := NewDB(ep, Options{HTTPClient: srv.Client()})
			end, err := d.ReadChangesEnd(context.Background(), &ChangesOptions{Feed: c.feed, Limit: 1}, func(Change) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want < 0 && end.Pending != nil:
				t.Errorf("pending %d, want unknown", *end.Pending)
			case c.want >= 0 && (end.Pending == nil || *end.Pending != c.want):
				t.Errorf("pending %v, want %d", end.Pending, c.want)
			}
			if end.LastSeq == nil {
				t.Errorf("no last_seq")
			}
		})
	}
}

// TestPendingSince: GET _changes?since=S&limit=0 and its "pending", as
// CouchDB's replicator asks sources with opaque seqs.
func TestPendingSince(t *testing.T) {
	var query string
	answer := `{"results":[],"last_seq":"9-a","pending":17}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answer))
	}))
	defer srv.Close()
	ep, err := ParseEndpoint(srv.URL + "/db")
	if err != nil {
		t.Fatal(err)
	}
	d := NewDB(ep, Options{HTTPClient: srv.Client()})
	n, err := d.PendingSince(context.Background(), Seq(`"9-a"`))
	if err != nil || n == nil || *n != 17 {
		t.Fatalf("PendingSince: %v, %v; want 17", n, err)
	}
	if query != "limit=0&since=9-a" {
		t.Errorf("query %q", query)
	}
	answer = `{"results":[{"seq":3,"id":"x","changes":[]}],"last_seq":3}` // PouchDB Server
	if n, err := d.PendingSince(context.Background(), Seq("2")); err != nil || n != nil {
		t.Fatalf("PendingSince without pending: %v, %v; want nil, nil", n, err)
	}
}
