package replicate

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/sharedfeed"
)

func TestSeqPast(t *testing.T) {
	for _, c := range []struct {
		u, s string
		want bool
	}{
		{"0", "", false},
		{"3", "3", false},
		{"4", "3", true},
		{"3", "4", false}, // a server that went back (restored): not past
		{`"12-g1AAAA"`, `"12-g1BBBB"`, false},
		{`"13-g1AAAA"`, `"12-g1BBBB"`, true},
		{`"13-g1AAAA"`, "", true},
		{`"0-g1AAAA"`, "", false},
		{`"opaque-a"`, `"opaque-a"`, false},
		{`"opaque-b"`, `"opaque-a"`, true},
		{"5", `"5-x"`, false},
	} {
		if got := SeqPast(couch.Seq(c.u), couch.Seq(c.s)); got != c.want {
			t.Errorf("SeqPast(%s, %s) = %v, want %v", c.u, c.s, got, c.want)
		}
	}
}

func TestParksOnDBUpdates(t *testing.T) {
	for _, c := range []struct {
		extra string
		want  bool
	}{
		{`,"continuous":true`, true},
		{``, false},
		{`,"continuous":true,"use_checkpoints":false`, false},
		{`,"continuous":true,"doc_ids":["a"]`, false},
		{`,"continuous":true,"selector":{"a":1}`, false},
		{`,"continuous":true,"filter":"d/f"`, false},
	} {
		p := fakeParams(t, c.extra, "http://h/src", "http://h/tgt")
		p.IdleParkAfter = time.Second
		if got := ParksOnDBUpdates(p); got != c.want {
			t.Errorf("%s: %v, want %v", c.extra, got, c.want)
		}
	}
	p := fakeParams(t, `,"continuous":true`, "http://h/src", "http://h/tgt")
	if ParksOnDBUpdates(p) {
		t.Error("parks with idle_park_after 0")
	}
}

// TestDBUpdatesServer: the watch's server is the source's server root with
// its credentials (a digest in the Key, none in the Name), the database
// its unescaped name; other credentials make another Key.
func TestDBUpdatesServer(t *testing.T) {
	p := fakeParams(t, `,"continuous":true`, "http://bob:secret@h:5984/couch/user%2Fdb-1/", "http://h/tgt")
	srv, db, err := DBUpdatesServer(p, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if db != "user/db-1" {
		t.Errorf("db %q", db)
	}
	if srv.Name != "http://h:5984/couch/" {
		t.Errorf("name %q", srv.Name)
	}
	q := fakeParams(t, `,"continuous":true`, "http://bob:other@h:5984/couch/another/", "http://h/tgt")
	srv2, _, _ := DBUpdatesServer(q, Options{})
	r := fakeParams(t, `,"continuous":true`, "http://bob:secret@h:5984/couch/another/", "http://h/tgt")
	srv3, _, _ := DBUpdatesServer(r, Options{})
	if srv2.Key == srv.Key || srv3.Key != srv.Key {
		t.Errorf("keys: other credentials equal %v, other database differs %v", srv2.Key == srv.Key, srv3.Key != srv.Key)
	}
}

// noEnd is a run's done channel that never says anything.
var noEnd chan struct{}

// awaitNoFeed waits until the server answers no feed.
func awaitNoFeed(t *testing.T, fs *feedServer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for fs.openFeeds() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d feeds still open on the server", fs.openFeeds())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// parkOutcome is what a run's done was called with.
type parkOutcome struct {
	res Result
	err error
}

// startParking starts a continuous run of src→tgt that parks after 50 ms
// idle, and returns its outcomes.
func startParking(t *testing.T, f *fakeCouch, o Options) (Params, <-chan parkOutcome) {
	t.Helper()
	p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
	p.IdleParkAfter = 50 * time.Millisecond
	o.Park = true
	done := make(chan parkOutcome, 1)
	New(p, o).Start(context.Background(), func(res Result, err error) { done <- parkOutcome{res, err} })
	return p, done
}

func awaitParked(t *testing.T, done <-chan parkOutcome) *Parked {
	t.Helper()
	select {
	case out := <-done:
		if out.err != nil || out.res.Parked == nil {
			t.Fatalf("run ended with %v, parked %v", out.err, out.res.Parked)
		}
		return out.res.Parked
	case <-time.After(time.Minute):
		t.Fatal("the idle run did not park within a minute")
	}
	return nil
}

// TestParkIdleRun: an idle continuous run with Options.Park ends parked
// after idle_park_after with its checkpoint written and its feed closed;
// Moved says no until a document changes (a write that changes no document
// wakes nobody, and is asked about once); a new run from the checkpoint
// replicates the change with the stats carried on, and parks again.
func TestParkIdleRun(t *testing.T) {
	f, fs := continuousSource(t)
	progress, o := progressOptions()
	p, done := startParking(t, f, o)
	awaitWritten(t, progress, noEnd, 1)
	pk := awaitParked(t, done)
	if !pk.Seq().Equal(couch.Seq(`"` + seqStr(1) + `"`)) {
		t.Errorf("parked at %s, want %s", pk.Seq(), seqStr(1))
	}
	if at, quiet := pk.Quiet(); quiet {
		t.Errorf("a run that replicated a document parked quiet (as of %s)", at)
	}
	base, _, _ := ID(p, "u")
	for _, db := range []string{"src", "tgt"} {
		if ck := f.localDoc(db, base); ck == nil || ck["source_last_seq"] != seqStr(1) {
			t.Errorf("%s checkpoint %v, want source_last_seq %s", db, ck, seqStr(1))
		}
	}
	if n, _ := fs.counts(); n != 1 {
		t.Errorf("%d continuous requests, want 1", n)
	}
	// The server holds no feed of the parked job.
	awaitNoFeed(t, fs)

	ctx := context.Background()
	if moved, err := pk.Moved(ctx); moved || err != nil {
		t.Fatalf("Moved on an unchanged source: %v, %v", moved, err)
	}
	if changed, err := pk.Changed(ctx); changed || err != nil {
		t.Fatalf("Changed on an unchanged source: %v, %v", changed, err)
	}
	// A write that changes no document (a _security update) moves
	// update_seq: one _changes read finds nothing, and it is not asked
	// again.
	f.mu.Lock()
	f.dbs["src"].seq++
	before := len(f.changesQuery)
	f.mu.Unlock()
	for range 2 {
		if moved, err := pk.Moved(ctx); moved || err != nil {
			t.Fatalf("Moved after a write without a change: %v, %v", moved, err)
		}
	}
	f.mu.Lock()
	asked := len(f.changesQuery) - before
	f.mu.Unlock()
	if asked != 1 {
		t.Errorf("%d _changes reads for one write without a change, want 1", asked)
	}

	if changed, err := pk.Changed(ctx); changed || err != nil {
		t.Fatalf("Changed after a write without a change: %v, %v", changed, err)
	}
	f.put("src", map[string]any{"_id": "b"})
	if moved, err := pk.Moved(ctx); !moved || err != nil {
		t.Fatalf("Moved after a change: %v, %v", moved, err)
	}
	if changed, err := pk.Changed(ctx); !changed || err != nil {
		t.Fatalf("Changed after a change: %v, %v", changed, err)
	}
	done2 := make(chan parkOutcome, 1)
	p2 := p
	o.Park = true
	New(p2, o).Start(ctx, func(res Result, err error) { done2 <- parkOutcome{res, err} })
	awaitWritten(t, progress, noEnd, 2)
	pk2 := awaitParked(t, done2)
	if !pk2.Seq().Equal(couch.Seq(`"` + seqStr(3) + `"`)) {
		t.Errorf("parked again at %s, want %s", pk2.Seq(), seqStr(3))
	}
	f.mu.Lock()
	_, okB := f.dbs["tgt"].docs["b"]
	f.mu.Unlock()
	if !okB {
		t.Error("b not on the target")
	}
}

// TestParkQuietStart: a run that finds nothing to replicate at start-up
// (an empty source; a source with no change after the checkpoint, as
// after a restart) parks after quietParkAfter, not idle_park_after (an
// hour here), and says so (Parked.Quiet, with the time of the info read
// that showed it); on its own feed and on the shared one.
func TestParkQuietStart(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%t", shared), func(t *testing.T) {
			t.Parallel()
			testParkQuietStart(t, shared)
		})
	}
}

func testParkQuietStart(t *testing.T, shared bool) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	newFeedServer(f, "src")
	_, o := progressOptions()
	if shared {
		o.Feeds = sharedfeed.New(sharedfeed.Options{Logger: zerolog.Nop()})
	}
	o.Park = true
	run := func(idle time.Duration) *Parked {
		p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
		p.IdleParkAfter = idle
		done := make(chan parkOutcome, 1)
		started := time.Now()
		New(p, o).Start(context.Background(), func(res Result, err error) { done <- parkOutcome{res, err} })
		pk := awaitParked(t, done)
		if took := time.Since(started); took > 30*time.Second {
			t.Errorf("shared feed %t: parked after %s", shared, took)
		}
		return pk
	}
	// An empty source.
	began := time.Now()
	pk := run(time.Hour)
	if at, quiet := pk.Quiet(); !quiet || at.Before(began) {
		t.Errorf("shared feed %t: empty source: Quiet() = %s, %t; want a time after %s", shared, at, quiet, began)
	}
	// A document: replicated, not quiet (its run parks after its
	// idle_park_after, short here).
	f.put("src", map[string]any{"_id": "a"})
	if _, quiet := run(50 * time.Millisecond).Quiet(); quiet {
		t.Errorf("shared feed %t: a run that replicated a document parked quiet", shared)
	}
	// From that checkpoint, nothing new: quiet again.
	if _, quiet := run(time.Hour).Quiet(); !quiet {
		t.Errorf("shared feed %t: a run with nothing after its checkpoint did not park quiet", shared)
	}
	f.mu.Lock()
	_, ok := f.dbs["tgt"].docs["a"]
	f.mu.Unlock()
	if !ok {
		t.Errorf("shared feed %t: a not on the target", shared)
	}
}

// TestParkSharedFeed: a run on the node's shared feed parks too, and its
// subscription ends with it: the hub has no feed left.
func TestParkSharedFeed(t *testing.T) {
	f, _ := continuousSource(t)
	hub := sharedfeed.New(sharedfeed.Options{Logger: zerolog.Nop()})
	progress, o := progressOptions()
	o.Feeds = hub
	_, done := startParking(t, f, o)
	awaitWritten(t, progress, noEnd, 1)
	awaitParked(t, done)
	deadline := time.Now().Add(time.Minute)
	for hub.Stats().Feeds != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shared feeds after parking: %+v", hub.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestParkNotWhileStopping: a run stopped as it would park ends stopped
// (no Parked), with its checkpoint.
func TestParkStoppedRunDoesNotPark(t *testing.T) {
	f, _ := continuousSource(t)
	progress, o := progressOptions()
	p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
	p.IdleParkAfter = time.Hour
	o.Park = true
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan parkOutcome, 1)
	New(p, o).Start(ctx, func(res Result, err error) { done <- parkOutcome{res, err} })
	awaitWritten(t, progress, noEnd, 1)
	cancel()
	out := <-done
	if out.err != nil || out.res.Parked != nil {
		t.Fatalf("stopped run: %v, parked %v", out.err, out.res.Parked)
	}
}

// TestParkLater: a run without Options.Park but with ParkLater keeps its
// feed while ParkLater says no, asked every idle_park_after, and parks once
// it says yes.
func TestParkLater(t *testing.T) {
	f, _ := continuousSource(t)
	progress, o := progressOptions()
	p := fakeParams(t, `,"continuous":true`, f.URL+"/src", f.URL+"/tgt")
	p.IdleParkAfter = 50 * time.Millisecond
	var asked atomic.Int32
	o.ParkLater = func() bool { return asked.Add(1) >= 3 }
	done := make(chan parkOutcome, 1)
	New(p, o).Start(context.Background(), func(res Result, err error) { done <- parkOutcome{res, err} })
	awaitWritten(t, progress, noEnd, 1)
	awaitParked(t, done)
	if n := asked.Load(); n < 3 {
		t.Errorf("ParkLater asked %d times, want at least 3 before the run parked", n)
	}
}
