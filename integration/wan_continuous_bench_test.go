package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// arrivals follows a database's continuous _changes feed (read on the
// server itself, not through a link) and records when each document id
// first shows up.
type arrivals struct {
	mu   sync.Mutex
	seen map[string]time.Time
	wake chan struct{}
}

func followArrivals(tb testing.TB, ctx context.Context, dbURL string) *arrivals {
	tb.Helper()
	a := &arrivals{seen: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, dbURL+"_changes?feed=continuous&since=0&heartbeat=1000", nil)
	// identity: PouchDB Server's compression middleware would hold the
	// rows of a gzip-compressed continuous feed.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("following %s: %v", dbURL, err)
	}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			now := time.Now()
			var row struct{ ID string }
			if json.Unmarshal(sc.Bytes(), &row) != nil || row.ID == "" {
				continue
			}
			a.mu.Lock()
			if _, ok := a.seen[row.ID]; !ok {
				a.seen[row.ID] = now
			}
			a.mu.Unlock()
			select {
			case a.wake <- struct{}{}:
			default:
			}
		}
	}()
	return a
}

// await returns when id arrived, or false after within.
func (a *arrivals) await(id string, within time.Duration) (time.Time, bool) {
	deadline := time.After(within)
	for {
		a.mu.Lock()
		at, ok := a.seen[id]
		a.mu.Unlock()
		if ok {
			return at, true
		}
		select {
		case <-a.wake:
		case <-deadline:
			return time.Time{}, false
		}
	}
}

// BenchmarkWANContinuous measures how long a write on the source takes to
// reach the target through a continuous replication across a toxiproxy
// link of COUCHREP_WAN_RTT ms round trip (100 by default; 5 % jitter), the
// other endpoint local: pull (the source behind the link) and push (the
// target behind it). Each iteration writes COUCHREP_WAN_WRITES documents
// (40) one at a time, each once the previous one arrived, and times each
// from the source's answer to the write until the row is in the target's
// own _changes feed (read on the server). Reports p50 and p99 in ms and in
// round trips. The goal (issue 25): p99 ≤ 2 RTT + 50 ms.
func BenchmarkWANContinuous(b *testing.B) {
	rtt := time.Duration(envInt(b, "COUCHREP_WAN_RTT", 100)) * time.Millisecond
	writes := envInt(b, "COUCHREP_WAN_WRITES", 40)
	s := testserver.StartPouchDB(b)
	tp := testserver.StartToxiproxy(b)
	for _, mode := range []string{"pull", "push"} {
		b.Run(mode, func(b *testing.B) {
			l := tp.Link(b, "cont-"+mode, s.URL)
			l.Latency(b, rtt/2, rtt/40)
			var lat []time.Duration
			for i := 0; b.Loop(); i++ {
				src := s.CreateDB(b, fmt.Sprintf("wc%s-src-%d", mode, i))
				tgt := s.CreateDB(b, fmt.Sprintf("wc%s-tgt-%d", mode, i))
				source, target := src, tgt
				if mode == "pull" {
					source = l.URL + strings.TrimPrefix(src, s.URL)
				} else {
					target = l.URL + strings.TrimPrefix(tgt, s.URL)
				}
				ctx, cancel := context.WithCancel(context.Background())
				arr := followArrivals(b, ctx, tgt)
				p := params(b, map[string]any{"source": source, "target": target, "continuous": true})
				done := make(chan error, 1)
				go func() {
					_, err := replicate.New(p, replicate.Options{ServerUUID: "wancont-uuid", Logger: zerolog.Nop()}).Run(ctx)
					done <- err
				}()
				// A first document: the replication is up and its feed open.
				s.PutDocs(b, src, map[string]any{"_id": "warm-up"})
				if _, ok := arr.await("warm-up", time.Minute); !ok {
					cancel()
					var info map[string]any
					s.GetJSON(b, tgt, &info)
					b.Fatalf("the first document did not arrive within a minute (run: %v; target %v; seen %v)", <-done, info, arr.seen)
				}
				for j := range writes {
					id := fmt.Sprintf("w-%04d", j)
					s.PutDocs(b, src, map[string]any{"_id": id, "j": j})
					wrote := time.Now()
					at, ok := arr.await(id, time.Minute)
					if !ok {
						b.Fatalf("%s did not arrive within a minute", id)
					}
					lat = append(lat, at.Sub(wrote))
				}
				cancel()
				<-done
			}
			slices.Sort(lat)
			p50, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(p50)/float64(rtt), "p50-rtt")
			b.ReportMetric(float64(p99)/float64(rtt), "p99-rtt")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		})
	}
}
