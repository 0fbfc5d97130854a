package replicate

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestWriteFailuresKept: each document the target refuses is kept with its
// id, revision, status and the target's error and reason — a _bulk_docs row
// naming no revision (CouchDB's rows of a new_edits=false write name none),
// a document refused whole with 413, an id longer than
// max_document_id_length — and counted; with stop_on_write_failure the run
// fails with the first one's reason and checkpoints nothing.
func TestWriteFailuresKept(t *testing.T) {
	// refuse answers the target's _bulk_docs as CouchDB does: a 413 for a
	// batch holding "big", a forbidden row naming no revision for
	// "secret", the others stored.
	refuse := func(f *fakeCouch) func(w http.ResponseWriter, r *http.Request) bool {
		return func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.HasSuffix(r.URL.Path, "/tgt/_bulk_docs") {
				return false
			}
			body, _ := io.ReadAll(r.Body)
			var q struct{ Docs []map[string]any }
			_ = json.Unmarshal(body, &q)
			var kept []any
			var rows []map[string]string
			for _, d := range q.Docs {
				switch d["_id"] {
				case "big": // the batch, and then the document alone
					writeJSON(w, 413, map[string]string{"error": "too_large", "reason": "the request entity is too large"})
					return true
				case "secret":
					rows = append(rows, map[string]string{"id": "secret", "error": "forbidden", "reason": "no secrets here"})
				default:
					kept = append(kept, d)
				}
			}
			f.mu.Lock()
			for _, d := range kept {
				doc := d.(map[string]any)
				db := f.dbs["tgt"]
				db.seq++
				delete(doc, "_revisions")
				db.docs[doc["_id"].(string)] = fakeDoc{body: doc, rev: doc["_rev"].(string), seq: db.seq}
			}
			f.mu.Unlock()
			writeJSON(w, 201, rows)
			return true
		}
	}
	for _, tc := range []struct {
		name  string
		extra string
		stop  bool
	}{
		{name: "counted and kept", extra: `,"worker_batch_size":10`},
		{name: "stop_on_write_failure", extra: `,"worker_batch_size":10,"stop_on_write_failure":true`, stop: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.addDB("src")
			f.addDB("tgt")
			for _, id := range []string{"a", "secret", "big", "b", strings.Repeat("x", 40)} {
				f.put("src", map[string]any{"_id": id})
			}
			f.hook = refuse(f)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p := fakeParams(t, tc.extra, f.URL+"/src", f.URL+"/tgt")
			res, err := New(p, Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond, MaxDocumentIDLength: 32}).Run(ctx)
			if tc.stop {
				if !errors.Is(err, ErrDocWriteFailed) || !strings.Contains(err.Error(), "no secrets here") && !strings.Contains(err.Error(), "too large") &&
					!strings.Contains(err.Error(), "max_document_id_length") {
					t.Fatalf("err %v, want ErrDocWriteFailed with a document's reason", err)
				}
				if n := len(f.dbs["tgt"].local); n != 0 {
					t.Fatalf("%d checkpoints after a stop on a refused document", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fs := res.Stats.WriteFailures
			byID := map[string]WriteFailure{}
			for _, f := range fs {
				byID[f.ID] = f
			}
			long := byID[strings.Repeat("x", 40)]
			if len(fs) != 3 || res.Stats.DocWriteFailures != 3 || res.Stats.DocsWritten != 2 {
				t.Fatalf("%d failures %+v, stats %+v", len(fs), fs, res.Stats)
			}
			if s := byID["secret"]; s.Status != 403 || s.Error != "forbidden" || s.Reason != "no secrets here" || !strings.HasPrefix(s.Rev, "1-") || s.At.IsZero() {
				t.Errorf("secret: %+v", s)
			}
			if b := byID["big"]; b.Status != 413 || b.Error != "too_large" || !strings.HasPrefix(b.Rev, "1-") {
				t.Errorf("big: %+v", b)
			}
			if long.Status != 0 || long.Error != "doc_id_too_long" || !strings.HasPrefix(long.Rev, "1-") {
				t.Errorf("long id: %+v", long)
			}
		})
	}
}
