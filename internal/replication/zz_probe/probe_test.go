package zzprobe

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replication"
	"github.com/couchrep/couchrep/internal/testserver"
)

type timingRT struct {
	mu sync.Mutex
	d  map[string]time.Duration
	n  map[string]int
	tr http.RoundTripper
}

func (t *timingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.tr.RoundTrip(r)
	k := r.Method + " " + r.URL.Path[strings.LastIndex(r.URL.Path, "/"):]
	t.mu.Lock()
	t.d[k] += time.Since(start)
	t.n[k]++
	t.mu.Unlock()
	return resp, err
}

func TestProbe(t *testing.T) {
	s1, s2 := testserver.StartPouchDB(t), testserver.StartPouchDB(t)
	src := s1.CreateDB(t, "bench")
	pad := strings.Repeat("x", 1000)
	for i := 0; i < 10000; i += 1000 {
		docs := make([]map[string]any, 0, 1000)
		for j := i; j < i+1000; j++ {
			docs = append(docs, testserver.Doc(fmt.Sprintf("doc%06d", j), []string{"1-a"}, map[string]any{"pad": pad}))
		}
		s1.PutRevs(t, src, docs...)
	}
	for _, w := range []int{1, 2, 4} {
		tgt := s2.CreateDB(t, fmt.Sprintf("t%d", w))
		rt := &timingRT{d: map[string]time.Duration{}, n: map[string]int{}, tr: http.DefaultTransport}
		doc, _ := json.Marshal(map[string]any{"source": src, "target": tgt, "worker_processes": w})
		p, _ := replication.ParseParams(doc)
		start := time.Now()
		_, err := replication.New(p, replication.Options{Logger: zerolog.Nop(), HTTPClient: &http.Client{Transport: rt}}).Run(context.Background())
		el := time.Since(start)
		t.Logf("workers=%d %v %.0f docs/s err=%v", w, el, 10000/el.Seconds(), err)
		for k, v := range rt.d {
			if rt.n[k] > 2 {
				t.Logf("   %-20s n=%d total=%v avg=%v", k, rt.n[k], v, v/time.Duration(rt.n[k]))
			}
		}
	}
}
