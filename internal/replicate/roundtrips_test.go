package replicate

import (
	"fmt"
	"net/http"
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
