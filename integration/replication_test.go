package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/testserver"
)

// params builds replication Params from a replication document.
func params(t testing.TB, doc map[string]any) replicate.Params {
	t.Helper()
	b, _ := json.Marshal(doc)
	p, err := replicate.ParseParams(b)
	if err != nil {
		t.Fatalf("ParseParams(%s): %v", b, err)
	}
	return p
}

func run(t testing.TB, p replicate.Params) replicate.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := replicate.New(p, replicate.Options{ServerUUID: "test-uuid", Logger: zerolog.Nop()}).Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// leaves returns every leaf revision of every document (deleted ones
// included) of db, read with open_revs=all&revs=true, normalised for
// comparison: attachments reduced to content_type, digest and length
// (pouchdb-server rewrites revpos on replicated writes).
func leaves(t testing.TB, s *testserver.Server, db string) map[string][]map[string]any {
	t.Helper()
	var ch struct {
		Results []struct{ ID string } `json:"results"`
	}
	s.GetJSON(t, db+"_changes?style=all_docs", &ch)
	out := map[string][]map[string]any{}
	for _, r := range ch.Results {
		var revs []map[string]any
		s.GetJSON(t, db+strings.ReplaceAll(url.PathEscape(r.ID), "+", "%2B")+"?open_revs=all&revs=true", &revs)
		var docs []map[string]any
		for _, x := range revs {
			d, ok := x["ok"].(map[string]any)
			if !ok {
				t.Fatalf("%s: open_revs row %v", r.ID, x)
			}
			if atts, ok := d["_attachments"].(map[string]any); ok {
				for name, a := range atts {
					m := a.(map[string]any)
					atts[name] = map[string]any{"content_type": m["content_type"], "digest": m["digest"], "length": m["length"]}
				}
			}
			docs = append(docs, d)
		}
		sort.Slice(docs, func(i, j int) bool { return docs[i]["_rev"].(string) < docs[j]["_rev"].(string) })
		out[r.ID] = docs
	}
	return out
}

// verify checks that target holds exactly the source's leaves (only for
// the given ids when ids is non-nil).
//
// On a CouchDB cluster the target's _changes reads one copy per range,
// which may not yet have a write the replication's quorum (2 of 3)
// acknowledged: there it reads again until the copies agree, or a minute
// passed, and reports the last read.
func verify(t testing.TB, s, ts *testserver.Server, src, tgt string, ids []string) {
	t.Helper()
	want := leaves(t, s, src)
	if ids != nil {
		sub := map[string][]map[string]any{}
		for _, id := range ids {
			sub[id] = want[id]
		}
		want = sub
	}
	got := leaves(t, ts, tgt)
	if ts.Clustered(t) {
		for deadline := time.Now().Add(time.Minute); !sameLeaves(want, got) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond) // polling the copies' catching up
			got = leaves(t, ts, tgt)
		}
	}
	for id, w := range want {
		if !reflect.DeepEqual(w, got[id]) {
			t.Errorf("doc %q differs:\n source %v\n target %v", id, w, got[id])
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("target has unexpected doc %q", id)
		}
	}
}

// sameLeaves tells whether got holds exactly want's documents and leaves.
func sameLeaves(want, got map[string][]map[string]any) bool {
	if len(want) != len(got) {
		return false
	}
	for id, w := range want {
		if !reflect.DeepEqual(w, got[id]) {
			return false
		}
	}
	return true
}

func history(prefix string, n int) []string {
	h := make([]string, n)
	for i := range h {
		h[i] = fmt.Sprintf("%d-%s%d", n-i, prefix, n-i)
	}
	return h
}

// fillSource writes the mixed corpus of the issue: plain docs, conflicts,
// deletions, a 200-revision history, attachments up to 5 MB, URL-hostile
// ids, a design doc and a _local doc (which must not be copied).
func fillSource(t testing.TB, s *testserver.Server, db string) {
	t.Helper()
	var docs []map[string]any
	for i := 0; i < 50; i++ {
		docs = append(docs, testserver.Doc(fmt.Sprintf("plain-%03d", i), []string{"1-a"}, map[string]any{"n": i, "s": strings.Repeat("x", 100)}))
	}
	for _, id := range []string{"a/b", "a b", "ü", "+", "%", "a+b?c#d&e"} {
		docs = append(docs, testserver.Doc(id, []string{"1-u"}, map[string]any{"hostile": true}))
	}
	docs = append(docs,
		testserver.Doc("conflict", []string{"2-b", "1-a"}, map[string]any{"side": "b"}),
		testserver.Doc("conflict", []string{"2-c", "1-a"}, map[string]any{"side": "c"}),
		testserver.Deleted(testserver.Doc("conflict", []string{"3-d", "2-c", "1-a"}, nil)),
		testserver.Deleted(testserver.Doc("gone", []string{"2-g2", "1-g1"}, nil)),
		testserver.Doc("long", history("h", 200), map[string]any{"long": true}),
		testserver.Doc("_design/app", []string{"1-d"}, map[string]any{
			"filters": map[string]any{"odd": "function(doc, req) { return doc.n % 2 == 1; }"}}),
		testserver.WithAttachment(testserver.Doc("att-small", []string{"1-s"}, nil), "a.txt", "text/plain", []byte("hello")),
		testserver.WithAttachment(testserver.Doc("att-big", []string{"1-b"}, nil), "big.bin", "application/octet-stream", bytes.Repeat([]byte{1, 2, 3, 4, 5}, 1<<20)),
	)
	s.PutRevs(t, db, docs...)
	s.Do(t, http.MethodPut, db+"_local/mine", map[string]any{"x": 1}, http.StatusCreated)
}

func TestReplicationPouchDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "source")
	fillSource(t, s, src)

	t.Run("full", func(t *testing.T) {
		tgt := s.CreateDB(t, "full")
		res := run(t, params(t, map[string]any{"source": src, "target": tgt, "worker_batch_size": 7}))
		verify(t, s, s, src, tgt, nil)
		var body map[string]any
		if err := json.Unmarshal(res.Body, &body); err != nil || body["ok"] != true || body["session_id"] == nil {
			t.Errorf("result body %s", res.Body)
		}
		if res.Stats.DocWriteFailures != 0 || res.Stats.DocsWritten == 0 {
			t.Errorf("stats %+v", res.Stats)
		}
		// _local docs are not copied.
		if _, status, _ := doRaw(http.MethodGet, tgt+"_local/mine", nil); status != http.StatusNotFound {
			t.Errorf("_local/mine on target: status %d", status)
		}
		// A second run finds the checkpoint and has nothing to do.
		res2 := run(t, params(t, map[string]any{"source": src, "target": tgt, "worker_batch_size": 7}))
		if !res2.NoChanges || !bytes.Contains(res2.Body, []byte(`"no_changes":true`)) {
			t.Errorf("second run: %s", res2.Body)
		}
	})
	t.Run("create_target", func(t *testing.T) {
		tgt := s.DBURL("created")
		run(t, params(t, map[string]any{"source": src, "target": tgt, "create_target": true}))
		verify(t, s, s, src, tgt, nil)
	})
	t.Run("doc_ids", func(t *testing.T) {
		tgt := s.CreateDB(t, "docids")
		ids := []string{"conflict", "a/b", "_design/app", "att-small"}
		run(t, params(t, map[string]any{"source": src, "target": tgt, "doc_ids": []string{"conflict", "a%2Fb", "_design/app", "att-small"}}))
		verify(t, s, s, src, tgt, ids)
	})
	t.Run("named_filter", func(t *testing.T) {
		tgt := s.CreateDB(t, "filtered")
		run(t, params(t, map[string]any{"source": src, "target": tgt, "filter": "app/odd"}))
		var odd []string
		for i := 1; i < 50; i += 2 {
			odd = append(odd, fmt.Sprintf("plain-%03d", i))
		}
		verify(t, s, s, src, tgt, odd)
	})
	t.Run("since_seq", func(t *testing.T) {
		db := s.CreateDB(t, "since-src")
		s.PutRevs(t, db, testserver.Doc("before", []string{"1-a"}, nil))
		var info struct {
			UpdateSeq json.RawMessage `json:"update_seq"`
		}
		s.GetJSON(t, db, &info)
		s.PutRevs(t, db, testserver.Doc("after", []string{"1-a"}, nil))
		tgt := s.CreateDB(t, "since-tgt")
		run(t, params(t, map[string]any{"source": db, "target": tgt, "since_seq": info.UpdateSeq}))
		verify(t, s, s, db, tgt, []string{"after"})
	})
}

func doRaw(method, u string, body []byte) ([]byte, int, error) {
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.Bytes(), resp.StatusCode, nil
}

// countingProxy forwards to target, counting documents fetched through
// _bulk_get/open_revs and, when tooMany is set, answering every other
// request with 429. Once holdAfter (if set) documents have been fetched,
// further fetches are held until their client gives up.
type countingProxy struct {
	*httptest.Server
	fetched   sync.Map // doc id -> *atomic.Int64
	served    atomic.Int64
	holdAfter atomic.Int64
	requests  atomic.Int64
	tooMany   atomic.Bool
}

func newProxy(t testing.TB, target string) *countingProxy {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &countingProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.requests.Add(1)
		if p.tooMany.Load() && n%2 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":"too_many_requests","reason":"slow down"}`))
			return
		}
		fetch := strings.HasSuffix(r.URL.Path, "/_bulk_get") && r.Method == http.MethodPost ||
			r.URL.Query().Get("open_revs") != ""
		if hold := p.holdAfter.Load(); fetch && hold > 0 && p.served.Load() >= hold {
			<-r.Context().Done()
			return
		}
		if strings.HasSuffix(r.URL.Path, "/_bulk_get") && r.Method == http.MethodPost {
			var body bytes.Buffer
			_, _ = body.ReadFrom(r.Body)
			var q struct {
				Docs []struct{ ID string } `json:"docs"`
			}
			_ = json.Unmarshal(body.Bytes(), &q)
			for _, d := range q.Docs {
				c, _ := p.fetched.LoadOrStore(d.ID, new(atomic.Int64))
				c.(*atomic.Int64).Add(1)
			}
			p.served.Add(int64(len(q.Docs)))
			r.Body = io.NopCloser(bytes.NewReader(body.Bytes()))
		} else if r.URL.Query().Get("open_revs") != "" {
			id := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 2)[1]
			c, _ := p.fetched.LoadOrStore(id, new(atomic.Int64))
			c.(*atomic.Int64).Add(1)
			p.served.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

func TestReplicationResumeFromCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "src")
	const n = 2000
	for i := 0; i < n; i += 500 {
		var docs []map[string]any
		for j := i; j < i+500; j++ {
			docs = append(docs, testserver.Doc(fmt.Sprintf("d%05d", j), []string{"1-a"}, map[string]any{"j": j}))
		}
		s.PutRevs(t, src, docs...)
	}
	tgt := s.CreateDB(t, "tgt")
	proxy := newProxy(t, s.URL)
	psrc := proxy.URL + strings.TrimPrefix(src, strings.TrimSuffix(s.URL, "/"))
	if u, _ := url.Parse(s.URL); u.User != nil {
		psrc = strings.Replace(psrc, "http://", "http://"+u.User.String()+"@", 1)
	}

	// First run: the proxy serves 500 documents and then holds every
	// fetch, so the run cannot finish however fast the machine is; it is
	// stopped once a checkpoint has been recorded.
	proxy.holdAfter.Store(500)
	p := params(t, map[string]any{"source": psrc, "target": tgt, "worker_batch_size": 100,
		"worker_processes": 1, "checkpoint_interval": 50})
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	res, err := replicate.New(p, replicate.Options{ServerUUID: "u", Logger: zerolog.Nop(),
		OnProgress: func(st replicate.Stats) {
			if v := seqPrefixInt(st.CheckpointedSourceSeq); v > 0 {
				once.Do(cancel)
			}
		}}).Run(ctx)
	cancel()
	if err != nil {
		t.Fatalf("first run: %v", err)
	}
	var first struct {
		SourceLastSeq json.RawMessage `json:"source_last_seq"`
	}
	if err := json.Unmarshal(res.Body, &first); err != nil || first.SourceLastSeq == nil {
		t.Fatalf("first run result %s", res.Body)
	}
	lastSeq := int(seqPrefixInt(couch.Seq(first.SourceLastSeq)))
	if lastSeq <= 0 || lastSeq > 500 {
		t.Fatalf("first run checkpointed seq %d, want 1..500 (the proxy served 500 documents)", lastSeq)
	}
	// Second run resumes: documents up to the checkpoint are not fetched again.
	proxy.holdAfter.Store(0)
	run(t, p)
	verify(t, s, s, src, tgt, nil)
	twice := 0
	proxy.fetched.Range(func(k, v any) bool {
		if v.(*atomic.Int64).Load() > 1 {
			twice++
		}
		return true
	})
	// At most the batches in flight after the last checkpoint (1 worker,
	// batch 100, plus one batch queued) are fetched twice.
	if twice > 200 {
		t.Errorf("%d documents fetched twice after resuming from seq %d", twice, lastSeq)
	}
}

func TestReplicationContinuous(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "src")
	tgt := s.CreateDB(t, "tgt")
	s.PutRevs(t, src, testserver.Doc("early", []string{"1-a"}, nil))
	p := params(t, map[string]any{"source": src, "target": tgt, "continuous": true, "connection_timeout": 3000})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	written := make(chan int64, 100)
	errc := make(chan error, 1)
	go func() {
		_, err := replicate.New(p, replicate.Options{ServerUUID: "u", Logger: zerolog.Nop(),
			ProgressInterval: 50 * time.Millisecond,
			OnProgress:       func(st replicate.Stats) { written <- st.DocsWritten }}).Run(ctx)
		errc <- err
	}()
	await := func(want int64) {
		t.Helper()
		timeout := time.After(2 * time.Minute)
		for {
			select {
			case n := <-written:
				if n >= want {
					return
				}
			case err := <-errc:
				t.Fatalf("continuous replication ended: %v", err)
			case <-timeout:
				t.Fatalf("docs_written never reached %d", want)
			}
		}
	}
	await(1)
	s.PutRevs(t, src, testserver.Doc("late", []string{"1-a"}, nil))
	await(2)
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	verify(t, s, s, src, tgt, nil)
}

func TestReplicationTargetRateLimited(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PouchDB Server")
	}
	s := testserver.StartPouchDB(t)
	src := s.CreateDB(t, "src")
	var docs []map[string]any
	for i := 0; i < 300; i++ {
		docs = append(docs, testserver.Doc(fmt.Sprintf("d%03d", i), []string{"1-a"}, map[string]any{"i": i}))
	}
	s.PutRevs(t, src, docs...)
	s.CreateDB(t, "tgt")
	proxy := newProxy(t, s.URL)
	proxy.tooMany.Store(true)
	res := run(t, params(t, map[string]any{"source": src, "target": dbVia(s, proxy.URL, "tgt"), "worker_batch_size": 50}))
	if res.Stats.DocsWritten != 300 {
		t.Errorf("docs_written = %d, want 300", res.Stats.DocsWritten)
	}
	verify(t, s, s, src, s.DBURL("tgt"), nil)
}

func seqPrefixInt(q couch.Seq) int64 {
	if n, ok := q.Int(); ok {
		return n
	}
	n, _ := strconv.ParseInt(strings.SplitN(strings.Trim(string(q), "\""), "-", 2)[0], 10, 64)
	return n
}
