package sharedfeed_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/testserver"
)

func source(t *testing.T, dbURL, key string) sharedfeed.Source {
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	return sharedfeed.Source{Key: key, Name: dbURL, Style: couch.StyleAllDocs, Heartbeat: time.Second,
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			return couch.NewDB(couch.Endpoint{URL: u}, couch.Options{Logger: log}), func() {}, nil
		}}
}

// next takes rows from sub until it has n, failing after a minute.
func next(t *testing.T, sub *sharedfeed.Subscription, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []string
	for len(ids) < n {
		rows, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %v: %v", ids, err)
		}
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// TestHub checks the fan-out against PouchDB Server: one feed per key,
// each subscription gets the rows of its doc_ids (or all) in feed order
// from its subscription on, a subscriber that falls behind gets
// ErrOverflow without holding up the others, a feed closes with its last
// subscription and not before, and a feed that cannot start fails
// Subscribe. (A feed failing mid-stream: integration's
// TestSharedFeedFailure.)
func TestHub(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	db := s.CreateDB(t, "src")
	other := s.CreateDB(t, "other")
	s.PutDocs(t, db, map[string]any{"_id": "before"})
	hub := sharedfeed.New(sharedfeed.Options{Buffer: 5})
	ctx := context.Background()
	src := source(t, db, "k")

	all, err := hub.Subscribe(ctx, src, sharedfeed.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{DocIDs: []string{"a", "c"}})
	slow, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{DocIDs: []string{"x"}})
	sub2, err := hub.Subscribe(ctx, source(t, other, "k2"), sharedfeed.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if st := hub.Stats(); st != (sharedfeed.Stats{Feeds: 2, Subscriptions: 4}) {
		t.Errorf("Stats = %+v, want 2 feeds, 4 subscriptions", st)
	}
	for _, id := range []string{"a", "b", "c"} {
		s.PutDocs(t, db, map[string]any{"_id": id})
	}
	if got := next(t, all, 3); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("unfiltered subscription got %v, want a b c (not the doc written before it)", got)
	}
	if got := next(t, a, 2); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("doc_ids subscription got %v, want a c", got)
	}

	// slow never reads: six rows of x overflow its buffer of five, and
	// the others still get every row.
	for i := range 6 {
		s.PutRevs(t, db, testserver.Doc("x", []string{fmt.Sprintf("%d-x", i+1)}, nil))
		if got := next(t, all, 1); !slices.Equal(got, []string{"x"}) {
			t.Errorf("unfiltered subscription got %v, want x", got)
		}
	}
	if _, err := slow.Next(ctx); !errors.Is(err, sharedfeed.ErrOverflow) {
		t.Errorf("slow subscriber: %v, want ErrOverflow", err)
	}
	if n := hub.Stats().Overflows; n != 1 {
		t.Errorf("Overflows = %d, want 1", n)
	}
	slow.Close()
	slow.Close()

	s.PutDocs(t, other, map[string]any{"_id": "o"})
	if got := next(t, sub2, 1); !slices.Equal(got, []string{"o"}) {
		t.Errorf("other feed got %v", got)
	}
	all.Close()
	a.Close()
	if st := hub.Stats(); st != (sharedfeed.Stats{Feeds: 1, Subscriptions: 1, Overflows: 1}) {
		t.Errorf("after closing every subscription of a feed: %+v, want 1 feed, 1 subscription", st)
	}
	sub2.Close()
	if st := hub.Stats(); st != (sharedfeed.Stats{Overflows: 1}) {
		t.Errorf("after closing all: %+v", st)
	}

	// A feed that cannot start: the error comes back from Subscribe.
	bad := source(t, s.URL+"missing/", "k3")
	if _, err := hub.Subscribe(ctx, bad, sharedfeed.Filter{}); !errors.Is(err, couch.ErrNotFound) {
		t.Errorf("Subscribe to a missing database: %v, want ErrNotFound", err)
	}
	if st := hub.Stats(); st != (sharedfeed.Stats{Overflows: 1}) {
		t.Errorf("after a failed start: %+v", st)
	}
}

// TestHubStartAndFrom: a feed opened with Source.Start starts there
// without reading the source's info (its first subscriber has just read
// it), and each subscription says where it joined (From): the feed's start
// for the subscribers that opened it, the last row the feed had read for
// a later one, which then receives every row after it.
func TestHubStartAndFrom(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	db := s.CreateDB(t, "src")
	s.PutDocs(t, db, map[string]any{"_id": "one"}, map[string]any{"_id": "two"})
	hub := sharedfeed.New(sharedfeed.Options{})
	ctx := context.Background()
	src := source(t, db, "k")
	var infos atomic.Int32
	open := src.Open
	src.Open = func(log zerolog.Logger) (*couch.DB, func(), error) {
		d, release, err := open(log)
		u, _ := url.Parse(db)
		tr := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.TrimSuffix(req.URL.Path, "/") == strings.TrimSuffix(u.Path, "/") {
				infos.Add(1)
			}
			return http.DefaultTransport.RoundTrip(req)
		})
		d = couch.NewDB(couch.Endpoint{URL: u}, couch.Options{Logger: log, HTTPClient: &http.Client{Transport: tr}})
		return d, release, err
	}
	// Started at seq 1 (as if read before the second write): the feed
	// hands over "two" (seq 2), and the subscriber joined at 1.
	src.Start = couch.Seq("1")
	first, err := hub.Subscribe(ctx, src, sharedfeed.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if from, ok := first.From(); !ok || !from.Equal(couch.Seq("1")) {
		t.Errorf("the opener joined at %s (%v), want 1", from, ok)
	}
	if got := next(t, first, 1); !slices.Equal(got, []string{"two"}) {
		t.Errorf("rows %v, want [two]", got)
	}
	if n := infos.Load(); n != 0 {
		t.Errorf("the feed read the source's info %d times, want 0 (it was given its start)", n)
	}
	// A later subscriber joins at the last row read (seq 2), whatever
	// Start it passes, and receives the rows after it.
	src.Start = couch.Seq("0")
	later, err := hub.Subscribe(ctx, src, sharedfeed.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	if from, ok := later.From(); !ok || !from.Equal(couch.Seq("2")) {
		t.Errorf("the later subscriber joined at %s (%v), want 2", from, ok)
	}
	s.PutDocs(t, db, map[string]any{"_id": "three"})
	if got := next(t, later, 1); !slices.Equal(got, []string{"three"}) {
		t.Errorf("later: rows %v, want [three]", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
