package replicate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func fakeParams(t *testing.T, extra string, src, tgt string) Params {
	t.Helper()
	p, err := ParseParams([]byte(`{"source":"` + src + `","target":"` + tgt + `"` + extra + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func runFake(p Params) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return New(p, Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond}).Run(ctx)
}

// PouchDB Server crashes on _changes?filter=_selector, so the selector path
// is tested against the CouchDB-shaped fake.
func TestSelectorReplication(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	for i := 0; i < 10; i++ {
		typ := "a"
		if i%2 == 1 {
			typ = "b"
		}
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%d", i), "type": typ})
	}
	p := fakeParams(t, `,"selector":{"type":"a"}`, f.URL+"/src", f.URL+"/tgt")
	res, err := runFake(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.changesBodies) != 1 || f.changesBodies[0] != `{"selector":{"type":"a"}}` ||
		!strings.Contains(f.changesQuery[0], "filter=_selector") {
		t.Errorf("changes requests: %q %q", f.changesQuery, f.changesBodies)
	}
	tgt := f.dbs["tgt"]
	if len(tgt.docs) != 5 {
		t.Errorf("target has %d docs, want 5", len(tgt.docs))
	}
	for id, d := range tgt.docs {
		if d.body["type"] != "a" {
			t.Errorf("doc %s of type %v copied", id, d.body["type"])
		}
	}
	base, _, _ := ID(p, "u")
	if res.ID != base || f.localDoc("src", base) == nil || f.localDoc("tgt", base) == nil {
		t.Errorf("checkpoint _local/%s missing (result id %s)", base, res.ID)
	}
	if res.Stats.DocsWritten != 5 || res.Stats.MissingRevisionsFound != 5 {
		t.Errorf("stats %+v", res.Stats)
	}
	// Opaque seqs are kept as strings. A one-shot run checkpoints the seq
	// of the last change it processed (d8's), not the feed's last_seq, as
	// CouchDB does.
	var body struct {
		SourceLastSeq json.RawMessage `json:"source_last_seq"`
	}
	_ = json.Unmarshal(res.Body, &body)
	if string(body.SourceLastSeq) != `"9-fake"` {
		t.Errorf("source_last_seq %s", body.SourceLastSeq)
	}
}

func TestBadInput(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String() + "/src"
	l.Close()

	tests := []struct {
		name string
		// hook injects the fault; deadSource uses a closed port as source.
		hook       func(w http.ResponseWriter, r *http.Request) bool
		deadSource bool
		// targetDoc puts a document on the target first (an empty target
		// is not asked _revs_diff).
		targetDoc bool
		want      error
		reason    string
	}{
		{name: "unreachable source", deadSource: true, want: ErrDBNotFound, reason: "could not open source database"},
		{name: "401 on target", hook: func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasPrefix(r.URL.Path, "/tgt") {
				writeJSON(w, 401, map[string]string{"error": "unauthorized", "reason": "Name or password is incorrect."})
				return true
			}
			return false
		}, want: ErrUnauthorized, reason: "Name or password is incorrect"},
		{name: "malformed JSON from _revs_diff", hook: func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/_revs_diff") {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"d0": {"missing": [`))
				return true
			}
			return false
		}, targetDoc: true, want: ErrWorkerFailed, reason: "revs_diff"},
		{name: "feed stops mid-line", hook: func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/_changes") {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"results":[{"seq":"1-fake","id":"d0","changes":[{"rev":"1-`))
				return true
			}
			return false
		}, want: ErrChangesFailed, reason: "changes"},
		{name: "changes 500 forever", hook: func(w http.ResponseWriter, r *http.Request) bool {
			if strings.HasSuffix(r.URL.Path, "/_changes") {
				writeJSON(w, 500, map[string]string{"error": "internal", "reason": "boom"})
				return true
			}
			return false
		}, want: ErrChangesFailed, reason: "boom"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.addDB("src")
			f.addDB("tgt")
			f.put("src", map[string]any{"_id": "d0"})
			if tc.targetDoc {
				f.put("tgt", map[string]any{"_id": "other"})
			}
			f.hook = tc.hook
			src := f.URL + "/src"
			if tc.deadSource {
				src = dead
			}
			_, err := runFake(fakeParams(t, `,"retries_per_request":1`, src, f.URL+"/tgt"))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			t.Logf("crash reason: %v", err)
			if !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("reason %q lacks %q", err, tc.reason)
			}
			// No checkpoint was recorded on either side.
			f.hook = nil
			for _, db := range []string{"src", "tgt"} {
				if n := len(f.dbs[db].local); n != 0 {
					t.Errorf("%s has %d _local docs after a failed run", db, n)
				}
			}
		})
	}
}

// TestRevsDiffEmptyTarget: a target without documents at the start is not
// asked _revs_diff (everything is missing there); any other target is, and
// what it already has is not fetched again.
func TestRevsDiffEmptyTarget(t *testing.T) {
	tests := []struct {
		name string
		// onTarget are ids put on the target (the same revisions as the
		// source's when also on the source) before the run.
		onTarget      []string
		wantRevsDiff  bool
		wantFetched   int
		wantTargetLen int
	}{
		{name: "empty target", wantRevsDiff: false, wantFetched: 30, wantTargetLen: 30},
		{name: "unrelated doc on target", onTarget: []string{"other"}, wantRevsDiff: true, wantFetched: 30, wantTargetLen: 31},
		{name: "half already there", onTarget: []string{"d00", "d01", "d02", "d03", "d04", "d05", "d06", "d07", "d08", "d09", "d10", "d11", "d12", "d13", "d14"},
			wantRevsDiff: true, wantFetched: 15, wantTargetLen: 30},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.addDB("src")
			f.addDB("tgt")
			for i := 0; i < 30; i++ {
				f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
			}
			for _, id := range tc.onTarget {
				if d, ok := f.dbs["src"].docs[id]; ok {
					f.dbs["tgt"].docs[id] = d
					continue
				}
				f.put("tgt", map[string]any{"_id": id})
			}
			var revsDiff, fetched atomic.Int64
			f.hook = func(w http.ResponseWriter, r *http.Request) bool {
				switch {
				case strings.HasSuffix(r.URL.Path, "/_revs_diff"):
					revsDiff.Add(1)
				case strings.HasSuffix(r.URL.Path, "/_bulk_get"):
					body, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(body))
					var q struct{ Docs []json.RawMessage }
					_ = json.Unmarshal(body, &q)
					fetched.Add(int64(len(q.Docs)))
				}
				return false
			}
			res, err := runFake(fakeParams(t, `,"worker_batch_size":5,"worker_processes":3`, f.URL+"/src", f.URL+"/tgt"))
			if err != nil {
				t.Fatal(err)
			}
			if got := revsDiff.Load() > 0; got != tc.wantRevsDiff {
				t.Errorf("_revs_diff requests: %d, want some: %v", revsDiff.Load(), tc.wantRevsDiff)
			}
			if got := fetched.Load(); got != int64(tc.wantFetched) {
				t.Errorf("fetched %d revisions, want %d", got, tc.wantFetched)
			}
			if n := len(f.dbs["tgt"].docs); n != tc.wantTargetLen {
				t.Errorf("target has %d docs, want %d", n, tc.wantTargetLen)
			}
			if res.Stats.DocsWritten != int64(tc.wantFetched) || res.Stats.RevisionsChecked != 30 {
				t.Errorf("stats %+v", res.Stats)
			}
		})
	}
}

// TestChangesPaging: a one-shot feed of a source with numeric seqs (as
// PouchDB Server's, which builds a page whole before its first byte) is
// read in pages of one batch, then growing 4× (capped at 32 batches); its
// rows here are sparse (three seqs a document), so no windows are read
// first (TestChangesWindows). doc_ids feeds, and the feed of a source with
// opaque seqs (clustered CouchDB, which streams it), are one request.
func TestChangesPaging(t *testing.T) {
	tests := []struct {
		name, extra string
		docs        int
		opaque      bool
		wantLimits  []string
	}{
		{name: "one batch", extra: `,"worker_batch_size":5`, docs: 3, wantLimits: []string{"5"}},
		{name: "exact batch", extra: `,"worker_batch_size":5`, docs: 5, wantLimits: []string{"5", "20"}},
		{name: "growing", extra: `,"worker_batch_size":5`, docs: 30, wantLimits: []string{"5", "20", "80"}},
		{name: "capped", extra: `,"worker_batch_size":1`, docs: 100, wantLimits: []string{"1", "4", "16", "32", "32", "32"}},
		{name: "doc_ids in one request", extra: `,"worker_batch_size":5,"doc_ids":["d00","d01","d02","d03","d04","d05","d06"]`, docs: 30, wantLimits: []string{""}},
		{name: "opaque seqs in one request", extra: `,"worker_batch_size":5`, docs: 30, opaque: true, wantLimits: []string{""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.numeric = !tc.opaque
			f.addDB("src")
			f.addDB("tgt")
			for range 3 {
				for i := 0; i < tc.docs; i++ {
					f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
				}
			}
			res, err := runFake(fakeParams(t, tc.extra, f.URL+"/src", f.URL+"/tgt"))
			if err != nil {
				t.Fatal(err)
			}
			var limits []string
			for _, q := range f.changesQuery {
				v, _ := url.ParseQuery(q)
				limits = append(limits, v.Get("limit"))
			}
			if fmt.Sprint(limits) != fmt.Sprint(tc.wantLimits) {
				t.Errorf("limits %q, want %q", limits, tc.wantLimits)
			}
			want := tc.docs
			if strings.Contains(tc.extra, "doc_ids") {
				want = 7
			}
			if n := len(f.dbs["tgt"].docs); n != want || res.Stats.DocsWritten != int64(want) {
				t.Errorf("target has %d docs (stats %+v), want %d", n, res.Stats, want)
			}
			var body struct {
				SourceLastSeq json.RawMessage `json:"source_last_seq"`
			}
			_ = json.Unmarshal(res.Body, &body)
			// The seq of the last change processed (CouchDB's one-shot
			// checkpoint), not the feed's last_seq: the wanted documents'
			// last updates are the third round's (seqs 2×docs+1 on).
			wantSeq, _ := json.Marshal(f.seqOf(2*tc.docs + want))
			if string(body.SourceLastSeq) != string(wantSeq) {
				t.Errorf("source_last_seq %s, want %s", body.SourceLastSeq, wantSeq)
			}
		})
	}
}
