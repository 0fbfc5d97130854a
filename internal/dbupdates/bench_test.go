package dbupdates

import (
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// benchWatches is the number of watches on the benchmarks' one feed.
const benchWatches = 10000

// watchAll opens benchWatches watches of names on srv's feed and returns
// them and the heap they take per watch.
func watchAll(b *testing.B, h *Hub, srv Server, name func(i int) string) ([]*Watch, float64) {
	b.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ws := make([]*Watch, benchWatches)
	for i := range ws {
		w, err := h.Watch(b.Context(), srv, name(i))
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = w
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	return ws, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / benchWatches
}

// report reports the heap per watch, and the median and 99th percentile
// of lat.
func report(b *testing.B, perWatch float64, lat []time.Duration) {
	b.ReportMetric(perWatch, "B/watch")
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkWake10000Watches: 10,000 watches on one feed of an in-process
// server; an op is one row written to the feed's connection until the
// watch of its database is signalled (loopback HTTP, the row's parsing
// and the look-up among 10,000 watches).
func BenchmarkWake10000Watches(b *testing.B) {
	f := newFake(b)
	h := New(Options{})
	srv := Server{Key: "bench", Name: f.srv.URL + "/", Open: testServer(b, f.srv.URL+"/").Open}
	ws, perWatch := watchAll(b, h, srv, func(i int) string { return fmt.Sprintf("userdb-%05d", i) })
	s := <-f.streams
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := (i * 7919) % benchWatches
		start := time.Now()
		s.lines <- row(ws[k].DB(), "updated", i+2)
		<-ws[k].C()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	report(b, perWatch, lat)
}

// BenchmarkPouchDBWake10000Watches: 10,000 watches on the _db_updates feed
// of PouchDB Server (StartPouchDBWithDBUpdates), 20 of them on databases
// that exist; an op is one document written to one of those (PUT) until
// its watch is signalled.
func BenchmarkPouchDBWake10000Watches(b *testing.B) {
	s := testserver.StartPouchDBWithDBUpdates(b)
	if !s.External() { // COUCHREP_TEST_COUCH_URL: a CouchDB, its admin in the URL
		s.AddAdmin(b, "boss", "pw")
	}
	const real = 20
	urls := make([]string, real)
	for i := range urls {
		urls[i] = s.CreateDB(b, fmt.Sprintf("userdb-%05d", i*(benchWatches/real)))
	}
	// The names as the server's rows give them (an external server's
	// carry the test's prefix).
	u0, _ := url.Parse(urls[0])
	prefix := strings.TrimSuffix(strings.Trim(u0.Path, "/"), "userdb-00000")
	name := func(i int) string { return fmt.Sprintf("%suserdb-%05d", prefix, i) }
	root, _ := url.Parse(s.URL)
	if !s.External() {
		root.User = url.UserPassword("boss", "pw")
	}
	h := New(Options{})
	ws, perWatch := watchAll(b, h, testServer(b, root.String()), name)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % real
		w := ws[k*(benchWatches/real)]
		start := time.Now()
		s.PutDocs(b, urls[k], map[string]any{"n": i})
		select {
		case <-w.C():
		case <-time.After(waitFor):
			b.Fatalf("watch of %s not woken", w.DB())
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	report(b, perWatch, lat)
}
