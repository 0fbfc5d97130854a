package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// BenchmarkWAN replicates 10,000 documents of about 1 KB between two
// PouchDB Servers with toxiproxy links adding RTT/2 of latency to each
// direction (with 5 % jitter), in three shapes: pull (the source behind a
// link, the target local), push (the source local, the target behind a
// link) and both-remote (each behind its own link). Side by side in each
// round: couchrep (the engine in this process, CouchDB's defaults),
// PouchDB's replicator (npm pouchdb 9.0.0 in node, through the same links)
// and the bound: the source's data in one streamed read through its link
// (_all_docs?include_docs=true), the target's in _bulk_docs
// new_edits=false requests of 500 documents, 4 in flight, through its link
// (prepared beforehand), both at once when both are remote. Metrics per shape and
// RTT: seconds, couchrep's time above the bound in round trips (the goal
// for pull at 100 and 200 ms: at most 3) and above its own time at RTT 0
// in round trips (what the link costs it: the endpoints' work at RTT 0,
// which the bound's single read does not have, taken out).
//
//	go test -run '^$' -bench WAN -benchtime 1x -timeout 60m ./integration/
//
// COUCHREP_WAN_RTTS=100,200 picks the round trips (ms), COUCHREP_WAN_DOCS
// the document count, COUCHREP_WAN_MODES=pull,push,both the shapes, and
// COUCHREP_WAN_POUCHDB=0 leaves PouchDB's replicator out, and
// COUCHREP_WAN_TRACE=file appends every request of couchrep's runs to file
// (sent, headers, end, in ms from the run's start).
func BenchmarkWAN(b *testing.B) {
	script := pouchScript(b)
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_WAN_DOCS")); err == nil && v > 0 {
		n = v
	}
	rtts := []int{0, 50, 100, 200}
	if v := os.Getenv("COUCHREP_WAN_RTTS"); v != "" {
		rtts = nil
		for _, f := range strings.Split(v, ",") {
			ms, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("COUCHREP_WAN_RTTS: %v", err)
			}
			rtts = append(rtts, ms)
		}
	}
	modes := []string{"pull", "push", "both"}
	if v := os.Getenv("COUCHREP_WAN_MODES"); v != "" {
		modes = strings.Split(v, ",")
	}
	trace := os.Getenv("COUCHREP_WAN_TRACE")
	withPouch := os.Getenv("COUCHREP_WAN_POUCHDB") != "0"
	far, near := testserver.StartPouchDB(b), testserver.StartPouchDB(b)
	farSrc, nearSrc := far.CreateDB(b, "src"), near.CreateDB(b, "src")
	seedBench(b, far, farSrc, benchSet{n: n})
	seedBench(b, near, nearSrc, benchSet{n: n})
	write := prepareBound(b, nearSrc).bulkDocs
	tp := testserver.StartToxiproxy(b)
	atZero := map[string]float64{} // couchrep's seconds at RTT 0, per shape
	runs := 0                      // the testing package may call each sub-benchmark more than once
	for _, mode := range modes {
		for _, rtt := range rtts {
			b.Run(fmt.Sprintf("%s/rtt=%dms", mode, rtt), func(b *testing.B) {
				runs++
				farLink := tp.Link(b, fmt.Sprintf("%s-far-%d-%d", mode, rtt, runs), far.URL)
				nearLink := tp.Link(b, fmt.Sprintf("%s-near-%d-%d", mode, rtt, runs), near.URL)
				if rtt > 0 {
					oneWay := time.Duration(rtt) * time.Millisecond / 2
					farLink.Latency(b, oneWay, oneWay/20)
					nearLink.Latency(b, oneWay, oneWay/20)
				}
				// The source's URL, and the target server's database URL
				// of a name (created on the server directly: the
				// bound's, PouchDB's and couchrep's targets).
				var src string
				var tgtServer *testserver.Server
				var tgtBase string
				switch mode {
				case "pull":
					src, tgtServer, tgtBase = farLink.URL+relName(far, "src"), near, near.URL
				case "push":
					src, tgtServer, tgtBase = near.URL+relName(near, "src"), far, farLink.URL
				case "both":
					src, tgtServer, tgtBase = farLink.URL+relName(far, "src"), near, nearLink.URL
				default:
					b.Fatalf("COUCHREP_WAN_MODES: unknown shape %q (pull, push, both)", mode)
				}
				remoteSrc, remoteTgt := mode != "push", mode != "pull"
				ctx, cancel := context.WithTimeout(context.Background(), benchTimeout)
				defer cancel()
				var cr, pr, bound time.Duration
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					btgt := fmt.Sprintf("b%s%d-%d", mode, rtt, i)
					tgtServer.CreateDB(b, btgt)
					d, err := wanBound(ctx, remoteSrc, remoteTgt, src, tgtBase+relName(tgtServer, btgt), write)
					if err != nil {
						b.Fatal(err)
					}
					bound += d
					tgtServer.DeleteDB(b, btgt)

					if withPouch {
						ptgt := fmt.Sprintf("p%s%d-%d", mode, rtt, i)
						tgtServer.CreateDB(b, ptgt)
						r, err := runPouchDB(ctx, script, src, tgtBase+relName(tgtServer, ptgt), 0)
						if err != nil {
							b.Fatal(err)
						}
						pr += time.Duration(r.MS * float64(time.Millisecond))
						tgtServer.DeleteDB(b, ptgt)
					}

					ctgt := fmt.Sprintf("c%s%d-%d", mode, rtt, i)
					tgtServer.CreateDB(b, ctgt)
					o := replicate.Options{ServerUUID: "bench", Logger: zerolog.Nop()}
					var rt *reqTrace
					if trace != "" {
						rt = newReqTrace(wanTransport(b))
						o.HTTPClient = &http.Client{Transport: rt}
					}
					b.StartTimer()
					c, err := runCouchrepWith(ctx, src, tgtBase+relName(tgtServer, ctgt), heapObjects, o)
					b.StopTimer()
					if rt != nil {
						writeTrace(b, trace, fmt.Sprintf("%s, RTT %d ms, round %d", mode, rtt, i), rt)
					}
					if err != nil {
						b.Fatal(err)
					}
					if c.written != int64(n) {
						b.Fatalf("couchrep wrote %d docs, want %d", c.written, n)
					}
					cr += c.wall
					tgtServer.DeleteDB(b, ctgt)
				}
				per := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) }
				b.ReportMetric(per(cr), "couchrep-s")
				b.ReportMetric(per(pr), "pouchdb-s")
				b.ReportMetric(per(bound), "bound-s")
				b.ReportMetric(per(pr)/per(cr), "x-pouchdb")
				// Above the bound, and above couchrep's own time at RTT 0
				// (the endpoints' work, which the link does not change),
				// in round trips.
				over, overZero := 0.0, 0.0
				if rtt > 0 {
					over = (per(cr) - per(bound)) / (float64(rtt) / 1000)
					b.ReportMetric(over, "rtts-over-bound")
					if z, ok := atZero[mode]; ok {
						overZero = (per(cr) - z) / (float64(rtt) / 1000)
						b.ReportMetric(overZero, "rtts-over-rtt0")
					}
				} else {
					atZero[mode] = per(cr)
					b.ReportMetric(100*per(bound)/per(cr), "pct-of-bound")
				}
				b.Logf("%s %d docs, RTT %d ms: couchrep %.2f s, PouchDB %.2f s (%.1fx), bound %.2f s; couchrep - bound = %.1f RTT, couchrep - its RTT 0 time = %.1f RTT; load %s",
					mode, n, rtt, per(cr), per(pr), per(pr)/per(cr), per(bound), over, overZero, loadAvg())
			})
		}
	}
}

// wanTransport is the transport couchrep's engine builds for an endpoint
// (CouchDB's defaults), for a traced run.
func wanTransport(b *testing.B) *http.Transport {
	tr, err := couchTransport()
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

// couchTransport is the transport couchrep's engine builds for an
// endpoint with CouchDB's defaults.
func couchTransport() (*http.Transport, error) {
	tr, err := couch.NewTransport(couch.TransportOptions{BufferSize: 1 << 10})
	if err != nil {
		return nil, err
	}
	tr.MaxConnsPerHost = 2 * replicate.DefaultHTTPConnections
	return tr, nil
}

// wanBound is the WAN's bound: the source's documents in one streamed read
// through its link when it is remote (_all_docs?include_docs=true), the
// target's in _bulk_docs new_edits=false requests of 500 documents
// (prepared beforehand), 4 in flight, through its link when it is remote
// (one request of every document takes PouchDB Server 8.5 s at RTT 0:
// its cost grows faster than the batch), at once; the wall time until
// both are done.
func wanBound(ctx context.Context, remoteSrc, remoteTgt bool, src, tgt string, write [][]byte) (time.Duration, error) {
	var wg sync.WaitGroup
	var readErr, writeErr error
	start := time.Now()
	if remoteSrc {
		wg.Go(func() { readErr = readAllDocs(ctx, src+"_all_docs?include_docs=true") })
	}
	if remoteTgt {
		wg.Go(func() {
			next := make(chan []byte)
			var mu sync.Mutex
			var pool sync.WaitGroup
			for range 4 {
				pool.Go(func() {
					for body := range next {
						if _, err := benchDo(ctx, http.MethodPost, tgt+"_bulk_docs", body); err != nil {
							mu.Lock()
							writeErr = cmpErr(writeErr, err)
							mu.Unlock()
						}
					}
				})
			}
			for _, body := range write {
				next <- body
			}
			close(next)
			pool.Wait()
		})
	}
	wg.Wait()
	return time.Since(start), cmpErr(readErr, writeErr)
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// readAllDocs reads u's whole answer.
func readAllDocs(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", u, resp.StatusCode)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// relName is database name's path on s, escaped, with its trailing slash:
// the name itself, or on an external server (COUCHREP_TEST_COUCH_URL) the
// test's prefixed name, so the benchmark runs against a CouchDB too.
func relName(s *testserver.Server, name string) string {
	return strings.TrimPrefix(s.DBURL(name), s.URL)
}
