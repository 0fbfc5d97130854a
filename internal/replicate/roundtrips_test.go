package replicate

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// barrier holds the first n requests that reach it until all n are in
// flight together; later ones pass. A run that sent them one after
// another would leave the first waiting: then the barrier gives up after
// a minute and records that they were not together.
type barrier struct {
	mu      sync.Mutex
	n       int
	arrived []string
	all     chan struct{}
	failed  bool
}

func newBarrier(n int) *barrier { return &barrier{n: n, all: make(chan struct{})} }

func (b *barrier) wait(what string) {
	b.mu.Lock()
	if len(b.arrived) >= b.n {
		b.mu.Unlock()
		return
	}
	b.arrived = append(b.arrived, what)
	if len(b.arrived) == b.n {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-time.After(time.Minute):
		b.mu.Lock()
		b.failed = true
		b.mu.Unlock()
	}
}

// Start-up and checkpoints cost round trips, not requests (issue 25): the
// source's and the target's info and both checkpoint reads go out
// together; a checkpoint commits and writes both sides in one round
// (instance_start_time "0").
func TestStartupAndCheckpointRoundTrips(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	for i := range 20 {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
	}
	rounds := map[string]*barrier{"start-up": newBarrier(4), "checkpoint": newBarrier(4)}
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		path := r.URL.Path
		switch {
		case r.Method == http.MethodGet && (path == "/src/" || path == "/tgt/" || path == "/src" || path == "/tgt" || strings.Contains(path, "/_local/")):
			rounds["start-up"].wait(r.Method + " " + path)
		case strings.HasSuffix(path, "/_ensure_full_commit"), r.Method == http.MethodPut && strings.Contains(path, "/_local/"):
			rounds["checkpoint"].wait(r.Method + " " + path)
		}
		return false
	}
	res, err := runFake(fakeParams(t, "", f.URL+"/src", f.URL+"/tgt"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.DocsWritten != 20 {
		t.Errorf("docs_written %d, want 20", res.Stats.DocsWritten)
	}
	for name, b := range rounds {
		b.mu.Lock()
		if b.failed || len(b.arrived) != b.n {
			t.Errorf("%s: %d requests %q were not in flight together (want %d)", name, len(b.arrived), b.arrived, b.n)
		}
		b.mu.Unlock()
	}
}

// Where instance_start_time is not "0" (PouchDB Server, CouchDB 3.4.3 on
// one node) the final checkpoint takes two rounds: both commits together
// (their answers are checked first: a database restarted since the run
// began may have lost writes), then both checkpoint writes together.
func TestCheckpointRoundsWithStartTime(t *testing.T) {
	f := newFakeCouch(t)
	f.startTime = "1732694400000000"
	f.addDB("src")
	f.addDB("tgt")
	for i := range 20 {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
	}
	commits, puts := newBarrier(2), newBarrier(2)
	var mu sync.Mutex
	var order []string
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		path := r.URL.Path
		switch {
		case strings.HasSuffix(path, "/_ensure_full_commit"):
			commits.wait(path)
		case r.Method == http.MethodPut && strings.Contains(path, "/_local/"):
			puts.wait(path)
		default:
			return false
		}
		mu.Lock()
		order = append(order, r.Method)
		mu.Unlock()
		return false
	}
	res, err := runFake(fakeParams(t, "", f.URL+"/src", f.URL+"/tgt"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.DocsWritten != 20 {
		t.Errorf("docs_written %d, want 20", res.Stats.DocsWritten)
	}
	for name, b := range map[string]*barrier{"commits": commits, "checkpoint writes": puts} {
		b.mu.Lock()
		if b.failed || len(b.arrived) != 2 {
			t.Errorf("%s were not in flight together: %q", name, b.arrived)
		}
		b.mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"POST", "POST", "PUT", "PUT"}; !slices.Equal(order, want) {
		t.Errorf("checkpoint requests %q, want %q (commits first, then the writes)", order, want)
	}
}

// A batch's _bulk_docs is in flight while its worker reads the next batch
// (CouchDB's worker spawns its writer): with one worker and two batches,
// the first _bulk_docs is held until the second _bulk_get has arrived. A
// worker that wrote before reading on would never send it (in either
// order: the write has a goroutine of its own).
func TestWriteOverlapsNextRead(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	for i := range 20 {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
	}
	b := newBarrier(2)
	var mu sync.Mutex
	bulkGets := 0
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost {
			return false
		}
		switch {
		case strings.HasSuffix(r.URL.Path, "/_bulk_docs"):
			b.wait("_bulk_docs")
		case strings.HasSuffix(r.URL.Path, "/_bulk_get"):
			mu.Lock()
			bulkGets++
			n := bulkGets
			mu.Unlock()
			if n == 2 {
				b.wait("second _bulk_get")
			}
		}
		return false
	}
	res, err := runFake(fakeParams(t, `,"worker_processes":1,"worker_batch_size":10`, f.URL+"/src", f.URL+"/tgt"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.DocsWritten != 20 {
		t.Errorf("docs_written %d, want 20", res.Stats.DocsWritten)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	got := slices.Sorted(slices.Values(b.arrived))
	if want := []string{"_bulk_docs", "second _bulk_get"}; b.failed || !slices.Equal(got, want) {
		t.Errorf("in flight together: %q (failed %v), want %q", b.arrived, b.failed, want)
	}
}

// A one-shot feed of a source with numeric seqs is read in windows of
// seqs up to the update_seq at start-up, two requests in flight (the
// first two are held until both have arrived: read page after page, the
// second would never come), each with limit= its width; then page after
// page from there. Every document arrives once, at its current revision,
// also when updates left seqs without rows (rows beyond a window are
// dropped: the next window has them).
func TestChangesWindows(t *testing.T) {
	// Windows of one batch (100), then one batch per worker (4 × 100) up
	// to the start-up update_seq; then a page of one batch after it.
	windows := func(u int) []string {
		q := []string{"since=&limit=100"}
		for lo := 100; lo < u; lo += 400 {
			q = append(q, fmt.Sprintf("since=%d&limit=%d", lo, min(400, u-lo)))
		}
		return append(q, fmt.Sprintf("since=%d&limit=100", u))
	}
	for _, tc := range []struct {
		name    string
		updated int // documents whose row moved to the end of the feed: seqs without rows
		queries []string
	}{
		{"dense", 0, windows(2300)},
		{"with updates", 1000, windows(3300)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.numeric = true
			f.addDB("src")
			f.addDB("tgt")
			for i := range 2300 {
				f.put("src", map[string]any{"_id": fmt.Sprintf("d%04d", i)})
			}
			for i := range tc.updated {
				d := f.dbs["src"]
				id := fmt.Sprintf("d%04d", i*2)
				d.seq++
				doc := d.docs[id]
				doc.seq = d.seq // its row moves to the end of the feed
				d.docs[id] = doc
			}
			b := newBarrier(2)
			f.hook = func(w http.ResponseWriter, r *http.Request) bool {
				if strings.HasSuffix(r.URL.Path, "/_changes") {
					b.wait(r.URL.RawQuery)
				}
				return false
			}
			res, err := runFake(fakeParams(t, `,"worker_batch_size":100`, f.URL+"/src", f.URL+"/tgt"))
			if err != nil {
				t.Fatal(err)
			}
			if res.Stats.DocsWritten != 2300 {
				t.Errorf("docs_written %d, want 2300", res.Stats.DocsWritten)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for id, doc := range f.dbs["src"].docs {
				if got := f.dbs["tgt"].docs[id].rev; got != doc.rev {
					t.Errorf("%s: target has %q, want %q", id, got, doc.rev)
				}
			}
			var got []string
			for _, q := range f.changesQuery {
				v, _ := url.ParseQuery(q)
				got = append(got, "since="+v.Get("since")+"&limit="+v.Get("limit"))
			}
			slices.Sort(got)
			want := slices.Clone(tc.queries)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("_changes requests %q, want %q", got, want)
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.failed || len(b.arrived) != 2 {
				t.Errorf("the first two windows were not in flight together: %q", b.arrived)
			}
		})
	}
}

// A window whose answer is cut mid-body stops the windows after it before
// they hand on a row (their rows would be cut into batches ahead of the
// missing ones, and a checkpoint could pass over those); the feed is read
// on from the last row handed on, and every document arrives.
func TestChangesWindowCut(t *testing.T) {
	f := newFakeCouch(t)
	f.numeric = true
	f.addDB("src")
	f.addDB("tgt")
	for i := range 2300 {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%04d", i)})
	}
	var cut atomic.Bool
	f.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasSuffix(r.URL.Path, "/_changes") || r.URL.Query().Get("since") != "100" || !cut.CompareAndSwap(false, true) {
			return false
		}
		rec := httptest.NewRecorder()
		f.serve(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body[:len(body)/2])
		return true
	}
	res, err := runFake(fakeParams(t, `,"worker_batch_size":100`, f.URL+"/src", f.URL+"/tgt"))
	if err != nil {
		t.Fatal(err)
	}
	if !cut.Load() {
		t.Fatal("the second window was never asked for")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	missing := 0
	for id, doc := range f.dbs["src"].docs {
		if f.dbs["tgt"].docs[id].rev != doc.rev {
			missing++
		}
	}
	if missing != 0 || res.Stats.DocsWritten < 2300 {
		t.Errorf("%d documents missing on the target, docs_written %d", missing, res.Stats.DocsWritten)
	}
}
