package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
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
	// Opaque seqs are kept as strings.
	var body struct {
		SourceLastSeq json.RawMessage `json:"source_last_seq"`
	}
	_ = json.Unmarshal(res.Body, &body)
	if string(body.SourceLastSeq) != `"10-fake"` {
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
		want       error
		reason     string
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
		}, want: ErrWorkerFailed, reason: "revs_diff"},
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
