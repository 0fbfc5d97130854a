package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/testserver"
)

// requestCounter is a reverse proxy in front of a test server that counts
// what passes through it: every request (by kind: method and the path's
// last "_" segment, or "doc"), the _changes feeds open now, and the
// heartbeat newlines the server sent on them. The replicator talks to the
// server only through it, so it sees every request the jobs send.
type requestCounter struct {
	*httptest.Server
	requests atomic.Int64
	open     atomic.Int64
	beats    atomic.Int64

	mu    sync.Mutex
	kinds map[string]int
}

func newRequestCounter(t testing.TB, target string) *requestCounter {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	rp.Transport = tr
	rp.ErrorLog = log.New(io.Discard, "", 0) // feeds cut at the end of a test are not news
	c := &requestCounter{kinds: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.requests.Add(1)
		c.mu.Lock()
		c.kinds[requestKind(r)]++
		c.mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/_changes") && r.URL.Query().Get("feed") == "continuous" {
			c.open.Add(1)
			defer c.open.Add(-1)
			w = &beatCounter{ResponseWriter: w, beats: &c.beats}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(c.Close)
	return c
}

func requestKind(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	kind := "db"
	for _, p := range parts[1:] {
		kind = "doc"
		if strings.HasPrefix(p, "_") {
			kind = p
			break
		}
	}
	return r.Method + " " + kind
}

// kindsSince returns the request kinds counted since before (a copy taken
// earlier), with their counts.
func (c *requestCounter) kindsSince(before map[string]int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, n := range c.kinds {
		if d := n - before[k]; d > 0 {
			out = append(out, fmt.Sprintf("%s: %d", k, d))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func (c *requestCounter) kindsNow() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.kinds)
}

// beatCounter counts the heartbeats (writes of newlines only) of a feed.
type beatCounter struct {
	http.ResponseWriter
	beats *atomic.Int64
}

func (b *beatCounter) Write(p []byte) (int, error) {
	if len(p) > 0 && len(bytes.Trim(p, "\n")) == 0 {
		b.beats.Add(int64(len(p)))
	}
	return b.ResponseWriter.Write(p)
}

func (b *beatCounter) Flush() { b.ResponseWriter.(http.Flusher).Flush() }

func (b *beatCounter) Unwrap() http.ResponseWriter { return b.ResponseWriter }

// scaleNode starts couchrepd for n jobs: max_jobs above n, no startup
// jitter, info logs.
func scaleNode(t testing.TB, n int, env ...string) (*nodeProc, string) {
	t.Helper()
	node := startNode(t, nodeOptions{extra: []string{"--log-level", "info"}, env: append([]string{
		"COUCHREP_REPLICATOR_MAX_JOBS=" + strconv.Itoa(n+n/10+10),
		"COUCHREP_REPLICATOR_STARTUP_JITTER=0",
	}, env...)})
	return node, node.httpAddr("")
}

// docIDJob is the body of the continuous replication of doc id from src to
// tgt (one job per document: each has its own replication id).
func docIDJob(src, tgt, id string) string {
	return fmt.Sprintf(`{"source":%q,"target":%q,"continuous":true,"doc_ids":[%q]}`, src, tgt, id)
}

func scaleDocID(i int) string { return fmt.Sprintf("doc%05d", i) }

// scaleSources is how many source databases the scale test and benchmark
// spread their jobs over: job i reads scaleSourceDB(i % scaleSources).
const scaleSources = 50

func scaleSourceDB(k int) string { return fmt.Sprintf("src%02d", k%scaleSources) }

// submitReplicate posts n jobs (bodies from body(i)) to POST /_replicate
// with conc requests in flight and returns how long it took. Each must be
// answered 202 (a continuous replication).
func submitReplicate(ctx context.Context, addr string, n, conc int, body func(i int) string) (time.Duration, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc}}
	defer client.CloseIdleConnections()
	next := atomic.Int64{}
	errs := make(chan error, conc)
	start := time.Now()
	for range conc {
		go func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					errs <- nil
					return
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/_replicate", strings.NewReader(body(i)))
				if err != nil {
					errs <- err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					errs <- fmt.Errorf("job %d: %w", i, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					errs <- fmt.Errorf("job %d: POST /_replicate: %d %s", i, resp.StatusCode, b)
					return
				}
			}
		}()
	}
	var first error
	for range conc {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return time.Since(start), first
}

// waitFeeds waits until n continuous feeds are open at c, failing the test
// if the node exits or timeout passes.
func waitFeeds(t testing.TB, node *nodeProc, c *requestCounter, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for c.open.Load() < int64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d continuous feeds open after %s", c.open.Load(), n, timeout)
		}
		select {
		case <-node.exited:
			t.Fatalf("couchrepd exited (%v)", node.exitErr)
		case <-time.After(100 * time.Millisecond): // another process's state: poll
		}
	}
}

// waitSubscribed waits until the node's n jobs have subscribed to its
// shared feeds (/metrics couchrep_shared_feed_subscriptions): a job's
// start-up (infos, checkpoints, and the catch-up _changes when its source
// has changes after its checkpoint) ends with its subscription. It fails
// the test if the node exits or timeout passes.
func waitSubscribed(t testing.TB, node *nodeProc, addr string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	subs := func() float64 { return metricSum(t, addr, metricPrefix("couchrep_shared_feed_subscriptions")) }
	for got := subs(); got < float64(n); got = subs() {
		if time.Now().After(deadline) {
			t.Fatalf("%v of %d jobs subscribed to a shared feed after %s", got, n, timeout)
		}
		select {
		case <-node.exited:
			t.Fatalf("couchrepd exited (%v)", node.exitErr)
		case <-time.After(250 * time.Millisecond): // another process's state: poll
		}
	}
}

// docExists reports whether GET dbURL+id answers 200 (dbURL ends in "/").
func docExists(client *http.Client, dbURL, id string) bool {
	resp, err := client.Get(dbURL + id)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestThousandIdleContinuousJobs runs 1,000 continuous replications on one
// couchrepd against PouchDB Server (one doc_ids job per document, 20 jobs
// on each of 50 source databases, one target database) and checks,
// counting at a proxy in front of the server: once every job has started
// (subscribed to its shared feed; the sources are empty, so no job needs a
// catch-up _changes), the node holds one open _changes feed per
// source database, shared by its jobs (share_changes_feeds, the default);
// over a 30 s window with no writes the jobs send no request at all (the
// feeds carry only the server's heartbeats); then a write reaches the
// target through each job of a sample, and only the written documents
// arrive. (PouchDB Server re-reads its changes once per open feed on every
// write, which is one reason to share them.)
func TestThousandIdleContinuousJobs(t *testing.T) {
	skipShort(t)
	n, sample, window := 1000, 25, 30*time.Second
	if v, err := strconv.Atoi(os.Getenv("COUCHREP_SCALE_TEST_JOBS")); err == nil && v > 0 {
		n, sample, window = v, min(sample, v), 12*time.Second // a quicker look while debugging
	}
	srv := testserver.StartPouchDB(t)
	proxy := newRequestCounter(t, srv.URL)
	srcs := make([]string, scaleSources)
	for k := range srcs {
		srcs[k] = srv.CreateDB(t, scaleSourceDB(k))
	}
	tgt := srv.CreateDB(t, "tgt")
	// Jobs that never park: this test is about idle jobs that keep their
	// feeds (one shared feed per source). With parking on, these up-to-date
	// doc_ids jobs park 2 s after they start (quiet starts) and leave their
	// subscriptions before all 1,000 are seen subscribed; parked jobs have
	// tests of their own (park_test.go, hibernate_test.go).
	node, addr := scaleNode(t, n, "COUCHREP_REPLICATOR_IDLE_PARK_AFTER=0")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	took, err := submitReplicate(ctx, addr, n, 16, func(i int) string {
		return docIDJob(proxy.URL+"/"+scaleSourceDB(i)+"/", proxy.URL+"/tgt/", scaleDocID(i))
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSubscribed(t, node, addr, n, 5*time.Minute)
	waitFeeds(t, node, proxy, scaleSources, 5*time.Minute)
	t.Logf("%d jobs submitted in %s, all subscribed and feeds open after %s", n, took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	before, kinds, beats := proxy.requests.Load(), proxy.kindsNow(), proxy.beats.Load()
	select {
	case <-node.exited:
		t.Fatalf("couchrepd exited (%v)", node.exitErr)
	case <-time.After(window): // the measurement window itself, not a wait for an event
	}
	if got := proxy.requests.Load() - before; got != 0 {
		t.Errorf("%d idle jobs sent %d requests in %s (%s), want none", n, got, window, proxy.kindsSince(kinds))
	}
	if open := proxy.open.Load(); open != scaleSources {
		t.Errorf("%d feeds open after the idle window, want %d (one per source)", open, scaleSources)
	}
	// The server heartbeats every feed every 10 s (connection_timeout/3):
	// every feed stayed alive through the window.
	if got := proxy.beats.Load() - beats; got < scaleSources {
		t.Errorf("%d heartbeats passed on in %s on %d feeds, want at least %d", got, window, scaleSources, scaleSources)
	}
	if feeds, subs := metricSum(t, addr, metricPrefix("couchrep_shared_feeds")),
		metricSum(t, addr, metricPrefix("couchrep_shared_feed_subscriptions")); feeds != scaleSources || subs != float64(n) {
		t.Errorf("/metrics: %v shared feeds, %v subscriptions; want %d and %d", feeds, subs, scaleSources, n)
	}
	t.Logf("%d idle jobs, %s: %d requests, %d heartbeats; load %s", n, window,
		proxy.requests.Load()-before, proxy.beats.Load()-beats, loadAvg())

	client := &http.Client{}
	kinds = proxy.kindsNow()
	var ids []string
	for k := range sample {
		i := k * n / sample
		id := scaleDocID(i)
		ids = append(ids, id)
		srv.Do(t, http.MethodPut, srcs[i%scaleSources]+id, map[string]any{"k": k}, http.StatusCreated)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for _, id := range ids {
		for !docExists(client, tgt, id) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not reach the target within 3 minutes; requests meanwhile: %s", id, proxy.kindsSince(kinds))
			}
			time.Sleep(50 * time.Millisecond) // another process's state: poll
		}
	}
	var info struct {
		DocCount int `json:"doc_count"`
	}
	srv.GetJSON(t, tgt, &info)
	if info.DocCount != sample {
		t.Errorf("target has %d documents, want the %d written", info.DocCount, sample)
	}
}
