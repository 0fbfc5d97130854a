package sharedfeed_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/mango"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/testserver"
)

// fakeFeed is a CouchDB-shaped database for the fast tests: its info, and
// a continuous _changes feed that sends rows once release is closed, then
// holds the request open; or answers 400 when failChanges is set.
type fakeFeed struct {
	rows        []string // JSON rows, sent once release is closed
	release     chan struct{}
	failChanges atomic.Bool
	includeDocs chan bool // each feed request's include_docs
	// holdInfo, when set, holds every info request after the first until
	// it is closed.
	holdInfo chan struct{}
	infos    atomic.Int32
	// failAfter, when set, holds a failing feed request's 400 until it is
	// closed (so that a test can join the feed before it fails).
	failAfter chan struct{}
}

func (ff *fakeFeed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/db/" || r.URL.Path == "/db":
		if n := ff.infos.Add(1); n > 1 && ff.holdInfo != nil {
			select {
			case <-ff.holdInfo:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, `{"db_name":"db","update_seq":"%d","instance_start_time":"0"}`, 10*ff.infos.Load())
	case r.URL.Path == "/db/_changes":
		ff.includeDocs <- r.URL.Query().Get("include_docs") == "true"
		if ff.failChanges.Load() {
			if ff.failAfter != nil {
				select {
				case <-ff.failAfter:
				case <-r.Context().Done():
					return
				}
			}
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"bad_request","reason":"no"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select {
		case <-ff.release:
		case <-r.Context().Done():
			return
		}
		for _, row := range ff.rows {
			fmt.Fprintln(w, row)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	default:
		http.NotFound(w, r)
	}
}

func fakeSource(t *testing.T, ff *fakeFeed, includeDocs bool) sharedfeed.Source {
	srv := httptest.NewServer(ff)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL + "/db/")
	src := sharedfeed.Source{Key: fmt.Sprint("fake", includeDocs), Name: "db", Style: couch.StyleAllDocs, Heartbeat: time.Second,
		IncludeDocs: includeDocs,
		Open: func(log zerolog.Logger) (*couch.DB, func(), error) {
			return couch.NewDB(couch.Endpoint{URL: u}, couch.Options{Logger: log}), srv.CloseClientConnections, nil
		}}
	return src
}

func row(seq int, id string, revs []string, doc string) string {
	var rs []string
	for _, r := range revs {
		rs = append(rs, fmt.Sprintf(`{"rev":%q}`, r))
	}
	del := ""
	if strings.Contains(doc, `"_deleted":true`) {
		del = `,"deleted":true`
	}
	return fmt.Sprintf(`{"seq":"%d","id":%q,"changes":[%s]%s,"doc":%s}`, seq, id, strings.Join(rs, ","), del, doc)
}

// rowsOf takes rows from sub until it has n, failing after a minute; it
// returns id:revs for each.
func rowsOf(t *testing.T, sub *sharedfeed.Subscription, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got []string
	for len(got) < n {
		rows, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %v: %v", got, err)
		}
		for _, r := range rows {
			if r.Doc != nil {
				t.Errorf("row %s handed on with its document", r.ID)
			}
			got = append(got, r.ID+":"+strings.Join(r.Revs, ","))
		}
	}
	return got
}

func waitWake(t *testing.T, w *sharedfeed.Watch) {
	t.Helper()
	select {
	case <-w.C():
	case <-time.After(time.Minute):
		t.Fatal("the watch never fired")
	}
}

// TestFilters: selector subscriptions get the rows whose winning document
// matches (deleted ones as {_id, _rev, _deleted}), listing only the
// winning revision, without documents; doc_ids and unfiltered ones beside
// them on the same feed are unchanged; watches fire (coalesced) only for
// rows their filter takes; a watch holds no rows and never overflows; a
// selector needs an include_docs source; Close is idempotent and the feed
// closes with its last member.
func TestFilters(t *testing.T) {
	ff := &fakeFeed{release: make(chan struct{}), includeDocs: make(chan bool, 10), rows: []string{
		row(1, "a1", []string{"1-a"}, `{"_id":"a1","_rev":"1-a","owner":"alice"}`),
		row(2, "b1", []string{"1-b"}, `{"_id":"b1","_rev":"1-b","owner":"bob"}`),
		row(3, "c1", []string{"2-w", "2-l"}, `{"_id":"c1","_rev":"2-w","owner":"alice"}`),
		row(4, "a1", []string{"2-d"}, `{"_id":"a1","_rev":"2-d","_deleted":true}`),
		row(5, "d1", []string{"3-x"}, `null`),
		row(6, "b2", []string{"1-c"}, `{"_id":"b2","_rev":"1-c","owner":"bob"}`),
		row(7, "s1", []string{"1-s"}, `{"_id":"s1","_rev":"1-s","owner":"u\u00ad1"}`),
		row(8, "s2", []string{"1-s"}, `{"_id":"s2","_rev":"1-s","owner":["u1"],"tag":"u1"}`),
		row(9, "s3", []string{"1-s"}, `{"_id":"s3","_rev":"1-s","owner":"u1","tag":"x"}`),
	}}
	hub := sharedfeed.New(sharedfeed.Options{Buffer: 3})
	ctx := context.Background()
	src := fakeSource(t, ff, true)

	if _, err := hub.Subscribe(ctx, fakeSource(t, ff, false), sharedfeed.Filter{Selector: mango.MustParse(`{}`)}); !errors.Is(err, sharedfeed.ErrNeedsDocs) {
		t.Errorf("selector on a feed without docs: %v, want ErrNeedsDocs", err)
	}
	alice, err := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "alice"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if !<-ff.includeDocs {
		t.Error("the selector feed was read without include_docs=true")
	}
	deleted, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"_deleted": true}`)})
	ids, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{DocIDs: []string{"b1", "d1"}})
	all, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{})
	last, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{DocIDs: []string{"b2"}})
	// Equality selectors are indexed by their value: the index must
	// still take what collates equal (a soft hyphen is ignorable to ICU),
	// never an array holding the value, and check the other conditions.
	u1, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "u1"}`)})
	u1x, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"tag": "x", "owner": "u1"}`)})
	byID, _ := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"_id": {"$eq": "s2"}}`)})
	bobWatch, err := hub.Watch(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "bob"}`)})
	if err != nil {
		t.Fatal(err)
	}
	carolWatch, _ := hub.Watch(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "carol"}`)})
	idWatch, _ := hub.Watch(ctx, src, sharedfeed.Filter{DocIDs: []string{"d1"}})
	if st := hub.Stats(); st != (sharedfeed.Stats{Feeds: 1, Subscriptions: 8, Watches: 3}) {
		t.Errorf("Stats = %+v, want 1 feed, 8 subscriptions, 3 watches", st)
	}
	close(ff.release)

	if got, want := rowsOf(t, alice, 2), []string{"a1:1-a", "c1:2-w"}; !slices.Equal(got, want) {
		t.Errorf("alice got %v, want %v (the winner only of the conflicted c1)", got, want)
	}
	if got, want := rowsOf(t, deleted, 1), []string{"a1:2-d"}; !slices.Equal(got, want) {
		t.Errorf("deleted got %v, want %v (d1: no document)", got, want)
	}
	if got, want := rowsOf(t, ids, 2), []string{"b1:1-b", "d1:3-x"}; !slices.Equal(got, want) {
		t.Errorf("doc_ids got %v, want %v", got, want)
	}
	// all's buffer of 3 overflowed: six rows, nobody read them.
	if _, err := all.Next(ctx); !errors.Is(err, sharedfeed.ErrOverflow) {
		t.Errorf("unfiltered subscription with a buffer of 3: %v, want ErrOverflow", err)
	}
	waitWake(t, bobWatch)
	waitWake(t, idWatch)
	if last, _, lost := bobWatch.Marks(); string(last) != `"2"` && string(last) != `"6"` || lost {
		t.Errorf("bob's watch: last %s (lost %v), want bob's row 2 or 6", last, lost)
	}
	// last's row is the sixth: once it is in, rows 1-5 have been
	// dispatched to every member (the three after it are read below).
	if got := rowsOf(t, last, 1); !slices.Equal(got, []string{"b2:1-c"}) {
		t.Errorf("last got %v", got)
	}
	if got, want := rowsOf(t, u1, 2), []string{"s1:1-s", "s3:1-s"}; !slices.Equal(got, want) {
		t.Errorf("u1 got %v, want %v", got, want)
	}
	if got, want := rowsOf(t, u1x, 1), []string{"s3:1-s"}; !slices.Equal(got, want) {
		t.Errorf("u1 with tag x got %v, want %v", got, want)
	}
	if got, want := rowsOf(t, byID, 1), []string{"s2:1-s"}; !slices.Equal(got, want) {
		t.Errorf("_id s2 got %v, want %v", got, want)
	}
	select {
	case <-carolWatch.C():
		t.Error("carol's watch fired: no row is carol's")
	default:
	}
	if n := hub.Stats().Overflows; n != 1 {
		t.Errorf("Overflows = %d, want 1 (the watches hold no rows)", n)
	}
	for _, c := range []interface{ Close() }{alice, deleted, ids, all, last, u1, u1x, byID, bobWatch, carolWatch, idWatch} {
		c.Close()
	}
	bobWatch.Close()
	if st := hub.Stats(); st != (sharedfeed.Stats{Overflows: 1}) {
		t.Errorf("after closing all: %+v", st)
	}
}

// TestWatchFailure: a feed that fails ends its subscriptions with the
// error; its watches move to the next feed: signalled and marked lost at
// once, then, once that feed started, marked with its start (rows before it
// may have been missed) and signalled again; they then fire for its rows
// and mark the last one.
func TestWatchFailure(t *testing.T) {
	ff := &fakeFeed{release: make(chan struct{}), includeDocs: make(chan bool, 10), holdInfo: make(chan struct{}),
		failAfter: make(chan struct{}),
		rows:      []string{row(31, "b9", []string{"1-b"}, `{"_id":"b9","_rev":"1-b","owner":"bob"}`)}}
	ff.failChanges.Store(true)
	hub := sharedfeed.New(sharedfeed.Options{})
	ctx := context.Background()
	src := fakeSource(t, ff, true)
	sub, err := hub.Subscribe(ctx, src, sharedfeed.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	w, err := hub.Watch(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "bob"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// The feed fails once the watch has joined it: on a loaded machine
	// the 400 could otherwise end it before Watch, which would then start
	// the next feed itself and wait on its held info request.
	close(ff.failAfter)
	var herr *couch.HTTPError
	if _, err := sub.Next(ctx); !errors.As(err, &herr) || herr.Status != http.StatusBadRequest {
		t.Errorf("subscription: %v, want the feed's 400", err)
	}
	waitWake(t, w)
	if last, until, lost := w.Marks(); last != nil || until != nil || !lost {
		t.Errorf("after the failure: Marks = %s, %s, %v; want nil, nil, lost", last, until, lost)
	}
	if st := hub.Stats(); st.Feeds != 1 || st.Watches != 1 || st.Subscriptions != 0 {
		t.Errorf("after the failure: %+v, want the watch on the next feed", st)
	}
	ff.failChanges.Store(false)
	close(ff.holdInfo)
	waitWake(t, w)
	if last, until, lost := w.Marks(); last != nil || string(until) != `"20"` || lost {
		t.Errorf("once the next feed started: Marks = %s, %s, %v; want nil, \"20\" (its start), not lost", last, until, lost)
	}
	close(ff.release)
	waitWake(t, w)
	if last, _, _ := w.Marks(); string(last) != `"31"` {
		t.Errorf("after bob's row: last = %s, want \"31\"", last)
	}
}

// TestSelectorFeedPouchDB: the same against PouchDB Server, whose
// include_docs feed is what a selector subscription reads.
func TestSelectorFeedPouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	db := s.CreateDB(t, "central")
	hub := sharedfeed.New(sharedfeed.Options{})
	ctx := context.Background()
	src := source(t, db, "docs")
	src.IncludeDocs = true
	alice, err := hub.Subscribe(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "alice", "n": {"$gte": 2}}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := hub.Watch(ctx, src, sharedfeed.Filter{Selector: mango.MustParse(`{"owner": "bob"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()
	s.PutDocs(t, db, map[string]any{"_id": "a1", "owner": "alice", "n": 1}, map[string]any{"_id": "a2", "owner": "alice", "n": 2})
	s.PutDocs(t, db, map[string]any{"_id": "a3", "owner": "alice", "n": 3})
	got := rowsOf(t, alice, 2)
	if len(got) != 2 || !strings.HasPrefix(got[0], "a2:") || !strings.HasPrefix(got[1], "a3:") {
		t.Errorf("alice got %v, want a2 and a3", got)
	}
	select {
	case <-bob.C():
		t.Error("bob's watch fired for alice's documents")
	default:
	}
	s.PutDocs(t, db, map[string]any{"_id": "b1", "owner": "bob"})
	waitWake(t, bob)
	if last, _, lost := bob.Marks(); last == nil || lost {
		t.Errorf("bob's watch: last %s (lost %v), want his row's seq", last, lost)
	}
}
