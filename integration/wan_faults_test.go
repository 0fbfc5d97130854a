package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// The request types of a replication, as the fault proxy tells them apart.
const (
	reqChanges    = "_changes"
	reqPending    = "_changes?limit=0" // the pending count; never faulted
	reqRevsDiff   = "_revs_diff"
	reqBulkGet    = "_bulk_get"
	reqOpenRevs   = "open_revs"
	reqAttGet     = "attachment GET"
	reqBulkDocs   = "_bulk_docs"
	reqAttPut     = "multipart PUT"
	reqLocalGet   = "_local GET"
	reqLocalPut   = "_local PUT"
	reqOther      = "other"
	faultReset    = "reset"
	faultStall    = "stall after headers"
	faultCut      = "cut at a byte"
	wanOneWay     = 5 * time.Millisecond // toxiproxy's latency each way: a 10 ms round trip
	wanJitter     = 2 * time.Millisecond
	wanBatch      = 10 // worker_batch_size of the fault runs
	wanRetries    = 3  // retries_per_request of the fault runs
	wanConnTimout = 3000
)

// classify names the request type of r (the replication's source is
// database wsrc-*, its target wtgt-*).
func classify(r *http.Request) string {
	p := r.URL.EscapedPath()
	q := r.URL.Query()
	parts := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case strings.HasSuffix(p, "/_changes") && q.Get("limit") == "0":
		return reqPending
	case strings.HasSuffix(p, "/_changes"):
		return reqChanges
	case strings.HasSuffix(p, "/_revs_diff"):
		return reqRevsDiff
	case strings.HasSuffix(p, "/_bulk_get"):
		return reqBulkGet
	case strings.HasSuffix(p, "/_bulk_docs"):
		return reqBulkDocs
	case len(parts) >= 2 && parts[1] == "_local" && r.Method == http.MethodGet:
		return reqLocalGet
	case len(parts) >= 2 && parts[1] == "_local" && r.Method == http.MethodPut:
		return reqLocalPut
	case r.Method == http.MethodGet && q.Has("open_revs"):
		return reqOpenRevs
	case r.Method == http.MethodGet && len(parts) == 3 && q.Has("rev"):
		return reqAttGet
	case r.Method == http.MethodPut && strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/related"):
		return reqAttPut
	}
	return reqOther
}

// faultProxy forwards every request to a server (through a toxiproxy
// link) and breaks the nth request of one type once: the server answers
// it in full, then the client gets a reset, the headers and silence, or
// the headers and the body cut at a random byte. It counts requests per
// type and the documents fetched and written per id.
type faultProxy struct {
	*httptest.Server
	kind, fault string
	nth         int64
	rng         *rand.Rand
	armed       atomic.Bool // off: forward and count nothing

	mu       sync.Mutex
	seen     map[string]int64 // request type -> requests
	fetched  map[string]int   // "id rev" -> times fetched (_bulk_get, open_revs)
	written  map[string]int   // "id rev" (a PUT: id) -> times written (_bulk_docs, PUT)
	batch    int              // most revisions in one _bulk_get or _bulk_docs
	injected string           // what was done, for the report
}

func newFaultProxy(t *testing.T, upstream, kind, fault string, nth int64, seed uint64) *faultProxy {
	u, _ := url.Parse(upstream)
	fp := &faultProxy{kind: kind, fault: fault, nth: nth, rng: rand.New(rand.NewPCG(seed, seed)),
		seen: map[string]int64{}, fetched: map[string]int{}, written: map[string]int{}}
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = tr
	rp.FlushInterval = -1
	done := make(chan struct{})
	fp.armed.Store(true)
	fp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := classify(r)
		var body []byte
		if r.Body != nil && (kind == reqBulkGet || kind == reqBulkDocs) {
			body, _ = io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		if !fp.armed.Load() {
			rp.ServeHTTP(w, r)
			return
		}
		fp.mu.Lock()
		fp.seen[kind]++
		n := fp.seen[kind]
		fp.count(kind, r, body)
		hit := kind == fp.kind && n == fp.nth
		fp.mu.Unlock()
		if !hit {
			rp.ServeHTTP(w, r)
			return
		}
		// The server answers the request in full first.
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.URL.Scheme, out.URL.Host, out.Host = u.Scheme, u.Host, u.Host
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, vs := range resp.Header {
			if k != "Content-Length" && k != "Transfer-Encoding" && k != "Connection" {
				w.Header()[k] = vs
			}
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
		switch fp.fault {
		case faultReset:
			fp.note("%s %s: %d answered by the server, the connection reset before any byte", r.Method, kind, resp.StatusCode)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			_ = conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		case faultStall:
			fp.note("%s %s: %d headers sent, then nothing (%d body bytes held back)", r.Method, kind, resp.StatusCode, len(answer))
			w.WriteHeader(resp.StatusCode)
			_ = http.NewResponseController(w).Flush()
			select {
			case <-r.Context().Done():
			case <-done:
			}
		case faultCut:
			cut := 0
			if len(answer) > 1 {
				cut = 1 + fp.rng.IntN(len(answer)-1)
			}
			fp.note("%s %s: %d cut at byte %d of %d", r.Method, kind, resp.StatusCode, cut, len(answer))
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(answer[:cut])
			_ = http.NewResponseController(w).Flush()
			panic(http.ErrAbortHandler)
		}
	}))
	t.Cleanup(func() {
		close(done)
		fp.Close()
		tr.CloseIdleConnections()
	})
	return fp
}

func (fp *faultProxy) note(format string, args ...any) {
	fp.mu.Lock()
	fp.injected = fmt.Sprintf(format, args...)
	fp.mu.Unlock()
}

// count records the revisions a request fetches or writes, and the
// largest batch (fp.mu held).
func (fp *faultProxy) count(kind string, r *http.Request, body []byte) {
	id := func() string {
		parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)
		if len(parts) < 2 {
			return ""
		}
		return strings.SplitN(parts[1], "/", 2)[0]
	}
	var q struct {
		Docs []struct {
			ID   string `json:"id"`
			Rev  string `json:"rev"`
			DID  string `json:"_id"`
			DRev string `json:"_rev"`
		}
	}
	switch kind {
	case reqBulkGet, reqBulkDocs:
		_ = json.Unmarshal(body, &q)
		fp.batch = max(fp.batch, len(q.Docs))
		for _, d := range q.Docs {
			if kind == reqBulkGet {
				fp.fetched[d.ID+" "+d.Rev]++
			} else {
				fp.written[d.DID+" "+d.DRev]++
			}
		}
	case reqOpenRevs:
		var revs []string
		_ = json.Unmarshal([]byte(r.URL.Query().Get("open_revs")), &revs)
		for _, rev := range revs {
			fp.fetched[id()+" "+rev]++
		}
	case reqAttPut:
		fp.written[id()]++
	}
}

// duplicates is how many fetches or writes beyond one per document m
// holds.
func duplicates(m map[string]int) int {
	n := 0
	for _, c := range m {
		if c > 1 {
			n += c - 1
		}
	}
	return n
}

// logLines is a zerolog writer that keeps the lines.
type logLines struct {
	mu    sync.Mutex
	lines []map[string]any
}

func (l *logLines) Write(p []byte) (int, error) {
	var m map[string]any
	if json.Unmarshal(p, &m) == nil {
		l.mu.Lock()
		l.lines = append(l.lines, m)
		l.mu.Unlock()
	}
	return len(p), nil
}

// retries counts the client's "request failed, retrying" warnings per
// request type, and the most attempts of one request.
func (l *logLines) retries() (map[string]int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	most := 0
	for _, m := range l.lines {
		if m["message"] != "couch: request failed, retrying" {
			continue
		}
		u, _ := url.Parse(fmt.Sprint(m["url"]))
		r := &http.Request{Method: fmt.Sprint(m["method"]), URL: u, Header: http.Header{}}
		if r.Method == http.MethodPut && u != nil && !strings.Contains(u.Path, "/_local/") {
			r.Header.Set("Content-Type", "multipart/related")
		}
		kind := reqOther
		if u != nil {
			kind = classify(r)
		}
		out[kind]++
		if a, ok := m["attempt"].(float64); ok && int(a) > most {
			most = int(a)
		}
	}
	return out, most
}

// warnings lists the distinct warning and error messages with their
// counts.
func (l *logLines) warnings() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, m := range l.lines {
		if lv := m["level"]; lv == "warn" || lv == "error" {
			n[fmt.Sprint(m["message"])]++
		}
	}
	var out []string
	for msg, c := range n {
		out = append(out, fmt.Sprintf("%q ×%d", msg, c))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

func (l *logLines) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.lines {
		if m["message"] == msg {
			return true
		}
	}
	return false
}

// wanHeapPeak samples the Go heap's live objects every 10 ms until stop is
// called, and returns the peak above what the heap held when it started,
// after a collection: what earlier tests of this process still hold (a
// 64 MB document of TestVerifyGiantDocument's kept by its test server until
// the package ends) is not this test's.
func wanHeapPeak() (stop func() uint64) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(sample)
	base := sample[0].Value.Uint64()
	var peak atomic.Uint64
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 { close(quit); <-done; return peak.Load() - min(base, peak.Load()) }
}

// fillWAN writes the fault runs' source: 60 documents (5 with two
// revisions in conflict, 3 deleted), 4 with a 200 KiB attachment (streamed:
// over the 64 KiB inline limit, under the 1 MiB a PouchDB target survives
// an aborted PUT of) and a _design doc; the target gets the first 10 plain
// documents already, so that _revs_diff stays in use.
func fillWAN(t *testing.T, s *testserver.Server, src, tgt string) {
	t.Helper()
	var docs, pre []map[string]any
	for i := range 48 {
		d := testserver.Doc(fmt.Sprintf("doc-%03d", i), []string{"1-a"}, map[string]any{"n": i, "s": strings.Repeat("w", 200)})
		docs = append(docs, d)
		if i < 10 {
			pre = append(pre, testserver.Doc(fmt.Sprintf("doc-%03d", i), []string{"1-a"}, map[string]any{"n": i, "s": strings.Repeat("w", 200)}))
		}
	}
	for i := range 5 {
		id := fmt.Sprintf("conflict-%d", i)
		docs = append(docs,
			testserver.Doc(id, []string{"2-b", "1-a"}, map[string]any{"side": "b"}),
			testserver.Doc(id, []string{"2-c", "1-a"}, map[string]any{"side": "c"}))
	}
	for i := range 3 {
		docs = append(docs, testserver.Deleted(testserver.Doc(fmt.Sprintf("gone-%d", i), []string{"2-g", "1-f"}, nil)))
	}
	for i := range 4 {
		data := bytes.Repeat([]byte{byte(i), 1, 2, 3, 4, 5, 6, 7}, 200<<10/8)
		docs = append(docs, testserver.WithAttachment(testserver.Doc(fmt.Sprintf("att-%d", i), []string{"1-t"}, map[string]any{"i": i}), "a.bin", "application/octet-stream", data))
	}
	docs = append(docs, testserver.Doc("_design/wan", []string{"1-d"}, map[string]any{"views": map[string]any{}}))
	s.PutRevs(t, src, docs...)
	s.PutRevs(t, tgt, pre...)
}

// TestWANFaults breaks one request of each type of a replication once,
// three ways, through a 10 ms toxiproxy link to PouchDB Server, and checks
// that the replication completes exactly: every leaf of every document,
// every retry within retries_per_request, no document fetched or written
// again beyond a batch, the heap bounded. The table in RELIABILITY.md
// ("Faults on a long link") is what it logs (-v).
func TestWANFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server and toxiproxy")
	}
	s := testserver.StartPouchDB(t)
	tp := testserver.StartToxiproxy(t)
	link := tp.Link(t, "wan-faults", s.URL)
	link.Latency(t, wanOneWay, wanJitter)
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("COUCHREP_WAN_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (COUCHREP_WAN_SEED=%d replays the cuts)", seed, seed)

	type target struct {
		kind   string
		nth    int64
		params map[string]any
		// resume: a first run without faults leaves checkpoints, and the
		// source gets 10 more documents, so that the checkpoints read
		// exist (a 404's body is not read: its status is the answer).
		resume bool
	}
	// Which request of each type is broken: one in the middle of the run
	// where the run has several.
	targets := []target{
		{reqChanges, 2, nil, false},
		{reqRevsDiff, 2, nil, false},
		{reqBulkGet, 2, nil, false},
		{reqOpenRevs, 5, map[string]any{"use_bulk_get": false}, false},
		{reqAttGet, 2, nil, false},
		{reqBulkDocs, 2, nil, false},
		{reqAttPut, 2, nil, false},
		{reqLocalGet, 1, nil, true},
		{reqLocalPut, 1, nil, false},
	}
	var (
		mu     sync.Mutex
		report []string
	)
	stopHeap := wanHeapPeak()
	n := 0
	for _, tg := range targets {
		for _, fault := range []string{faultReset, faultStall, faultCut} {
			n++
			name := strings.NewReplacer(" ", "_", "?", "", "=", "").Replace(tg.kind + "/" + fault)
			i := n
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				src := s.CreateDB(t, fmt.Sprintf("wsrc-%d", i))
				tgt := s.CreateDB(t, fmt.Sprintf("wtgt-%d", i))
				fillWAN(t, s, src, tgt)
				fp := newFaultProxy(t, link.URL, tg.kind, fault, tg.nth, seed+uint64(i))
				doc := map[string]any{
					"source": fp.URL + fmt.Sprintf("/wsrc-%d/", i), "target": fp.URL + fmt.Sprintf("/wtgt-%d/", i),
					"worker_batch_size": wanBatch, "retries_per_request": wanRetries,
					"connection_timeout": wanConnTimout,
				}
				for k, v := range tg.params {
					doc[k] = v
				}
				logs := &logLines{}
				log := zerolog.New(logs).Level(zerolog.DebugLevel)
				if tg.resume {
					fp.armed.Store(false)
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					_, err := replicate.New(params(t, doc), replicate.Options{ServerUUID: "wan-uuid", Logger: zerolog.Nop()}).Run(ctx)
					cancel()
					if err != nil {
						t.Fatalf("first run: %v", err)
					}
					var late []map[string]any
					for j := range 10 {
						late = append(late, testserver.Doc(fmt.Sprintf("late-%d", j), []string{"1-l"}, map[string]any{"j": j}))
					}
					s.PutRevs(t, src, late...)
					fp.armed.Store(true)
				}
				// A run that fails is what a job's crash is: the job is
				// started again from its checkpoint (at most twice here).
				var runErrs []string
				var res replicate.Result
				for run := 0; run < 3; run++ {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					var err error
					res, err = replicate.New(params(t, doc), replicate.Options{ServerUUID: "wan-uuid", Logger: log,
						RetryBackoff: 50 * time.Millisecond}).Run(ctx)
					cancel()
					if err == nil {
						break
					}
					runErrs = append(runErrs, err.Error())
				}
				if len(runErrs) == 3 {
					t.Fatalf("three runs failed: %q", runErrs)
				}
				fp.mu.Lock()
				injected, seen := fp.injected, fp.seen[tg.kind]
				dupF, dupW := duplicates(fp.fetched), duplicates(fp.written)
				batch := max(fp.batch, wanBatch)
				fp.mu.Unlock()
				if injected == "" {
					t.Fatalf("no %s request number %d to break (the run made %d)", tg.kind, tg.nth, seen)
				}
				verify(t, s, s, src, tgt, nil)
				retries, most := logs.retries()
				if most > wanRetries {
					t.Errorf("a request was tried %d times, retries_per_request is %d", most, wanRetries)
				}
				if dupF > batch || dupW > batch {
					t.Errorf("revisions fetched again %d times, written again %d times: more than a batch (%d)", dupF, dupW, batch)
				}
				if tg.resume && len(runErrs) == 0 && res.Stats.StartFrom != replicate.StartCheckpoint {
					t.Errorf("the second run started from %q, want its checkpoint", res.Stats.StartFrom)
				}
				if res.Stats.DocWriteFailures != 0 {
					t.Errorf("doc_write_failures %d", res.Stats.DocWriteFailures)
				}
				state := "completed"
				if len(runErrs) > 0 {
					state = fmt.Sprintf("crashing ×%d, then completed from the checkpoint; error: %s", len(runErrs), runErrs[0])
				}
				fallback := ""
				if logs.has("replication: _bulk_get failed, fetching documents one by one") {
					fallback = "; _bulk_get fell back to open_revs"
				}
				line := fmt.Sprintf("| %s | %s | %s | retries logged %v (most failed attempts of one request %d)%s; %d %s requests; revisions fetched again %d, written again %d; warnings: %s | %s |",
					tg.kind, fault, injected, retries, most, fallback, seen, tg.kind, dupF, dupW, logs.warnings(), state)
				t.Log(line)
				if os.Getenv("COUCHREP_WAN_DEBUG") != "" {
					logs.mu.Lock()
					for _, m := range logs.lines {
						t.Logf("log: %v", m)
					}
					logs.mu.Unlock()
				}
				mu.Lock()
				report = append(report, line)
				mu.Unlock()
			})
		}
	}
	t.Cleanup(func() {
		peak := stopHeap()
		sort.Strings(report)
		t.Logf("fault table (heap peak %d MiB):\n%s", peak>>20, strings.Join(report, "\n"))
		if peak > 256<<20 {
			t.Errorf("heap peak %d MiB over %d runs of a 1 MiB source", peak>>20, n)
		}
		st := link.Stats(t)
		if len(report) > 0 && (st.SentDown == 0 || link.Connections() == 0) {
			t.Errorf("toxiproxy saw no traffic: %+v, %d connections", st, link.Connections())
		}
	})
}
