package replicate

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
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

// A batch's _bulk_docs is in flight while its worker reads the next batch
// (CouchDB's worker spawns its writer): with one worker and two batches,
// the first _bulk_docs is held until the second _bulk_get has arrived. A
// worker that wrote before reading on would never send it.
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
	if want := []string{"_bulk_docs", "second _bulk_get"}; b.failed || !slices.Equal(b.arrived, want) {
		t.Errorf("in flight together: %q (failed %v), want %q", b.arrived, b.failed, want)
	}
}
