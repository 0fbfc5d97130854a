package sharedfeed_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
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
