package docproc

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/repjob"
)

const validBody = `{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b"}`

func bodyFP(t *testing.T, doc string) string {
	t.Helper()
	b, _, err := ReplicationBody(json.RawMessage(doc))
	if err != nil {
		t.Fatal(err)
	}
	return Fingerprint(b)
}

func TestDecide(t *testing.T) {
	fp := bodyFP(t, validBody)
	completed := `{"_id":"r","_rev":"2-x","source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","_replication_state":"completed"}`
	edited := `{"_id":"r","_rev":"3-x","source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/c","_replication_state":"completed"}`
	failed := `{"_id":"r","_rev":"2-x","source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","_replication_state":"failed","_replication_state_reason":"why"}`
	editedFailed := `{"_id":"r","_rev":"3-x","source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/c","_replication_state":"failed"}`
	tests := []struct {
		name   string
		doc    Doc
		known  Known
		action Action
		why    string
	}{
		{"design doc", Doc{ID: "_design/x", Body: json.RawMessage(`{}`)}, Known{}, ActionSkip, whyDesign},
		{"local doc", Doc{ID: "_local/x"}, Known{}, ActionSkip, whyDesign},
		{"new doc", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{}, ActionAdd, whyNew},
		{"unchanged running", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}, JobState: repjob.StateRunning}, ActionSkip, whyUnchanged},
		{"edited params", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: "other"}, JobState: repjob.StateRunning}, ActionAdd, whyEdited},
		{"job vanished", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}}, ActionAdd, whyJobMissing},
		{"finished, not yet written", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}, JobState: repjob.StateCompleted}, ActionSkip, whyWriteBack},
		{"state removed by user: rerun", Doc{ID: "r", Body: json.RawMessage(validBody)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp, Written: true}, JobState: repjob.StateCompleted}, ActionAdd, whyRerun},
		{"own terminal write", Doc{ID: "r", Body: json.RawMessage(completed)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp, Written: true}, JobState: repjob.StateCompleted}, ActionSkip, whyTerminal},
		{"own terminal write, not yet recorded written", Doc{ID: "r", Body: json.RawMessage(completed)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}, JobState: repjob.StateCompleted}, ActionSkip, whyTerminal},
		{"own failed write of an invalid doc", Doc{ID: "r", Body: json.RawMessage(failed)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp, State: repjob.StateFailed}, JobState: repjob.StateFailed}, ActionSkip, whyTerminal},
		// CouchDB ignores a document carrying completed or failed
		// (couch_replicator_doc_processor:process_change): recorded from
		// the document, never run.
		{"terminal by someone else", Doc{ID: "r", Body: json.RawMessage(completed)}, Known{}, ActionRecord, whyForeign},
		{"failed by someone else", Doc{ID: "r", Body: json.RawMessage(failed)}, Known{}, ActionRecord, whyForeign},
		{"edited after completed", Doc{ID: "r", Body: json.RawMessage(edited)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp, Written: true}, JobState: repjob.StateCompleted}, ActionRecord, whyKept},
		{"edited after failed", Doc{ID: "r", Body: json.RawMessage(editedFailed)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp, Written: true, State: repjob.StateFailed}, JobState: repjob.StateFailed}, ActionRecord, whyKept},
		{"marked completed while running", Doc{ID: "r", Body: json.RawMessage(completed)}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}, JobState: repjob.StateRunning}, ActionRecord, whyMarked},
		{"deleted with job", Doc{ID: "r", Deleted: true}, Known{Record: &DocRecord{JobID: "j", Fingerprint: fp}}, ActionRemove, whyDeleted},
		{"deleted unknown", Doc{ID: "r", Deleted: true}, Known{}, ActionSkip, whyDeleted},
		{"missing source", Doc{ID: "r", Body: json.RawMessage(`{"target":"http://127.0.0.1:1/b"}`)}, Known{}, ActionFail, "Missing `source` field"},
		{"bad continuous", Doc{ID: "r", Body: json.RawMessage(`{"source":"http://h/a","target":"http://h/b","continuous":"yes"}`)}, Known{}, ActionFail, "parameter `continuous` must be a boolean"},
		{"not an object", Doc{ID: "r", Body: json.RawMessage(`[1]`)}, Known{}, ActionFail, "replication document must be a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.doc, tt.known)
			if d.Action != tt.action || d.Why != tt.why {
				t.Fatalf("Decide = %v %q, want %v %q", d.Action, d.Why, tt.action, tt.why)
			}
			if d.Action == ActionAdd {
				if strings.Contains(string(d.Body), `"_`) {
					t.Errorf("body keeps underscore fields: %s", d.Body)
				}
				if d.Fingerprint == "" || d.Fingerprint != Fingerprint(d.Body) {
					t.Errorf("fingerprint %q does not match body", d.Fingerprint)
				}
			}
		})
	}
}

func TestReplicationBodyIgnoresStateAndOrder(t *testing.T) {
	a := `{"_id":"x","_rev":"1-a","target":"http://h/b", "source":"http://h/a","continuous":true}`
	b := `{"source":"http://h/a","continuous":true,"target":"http://h/b","_replication_state":"completed","_replication_stats":{"docs_read":1}}`
	ba, sa, err := ReplicationBody(json.RawMessage(a))
	if err != nil {
		t.Fatal(err)
	}
	bb, sb, err := ReplicationBody(json.RawMessage(b))
	if err != nil {
		t.Fatal(err)
	}
	if string(ba) != string(bb) || Fingerprint(ba) != Fingerprint(bb) {
		t.Fatalf("bodies differ: %s vs %s", ba, bb)
	}
	if sa != 0 || sb != repjob.StateCompleted {
		t.Fatalf("states %q %q", sa, sb)
	}
}

func TestIsReplicatorDB(t *testing.T) {
	for name, want := range map[string]bool{
		"_replicator": true, "other/_replicator": true, "a/b/_replicator": true,
		"replicator": false, "other_replicator": false, "_replicator/x": false, "_users": false,
	} {
		if got := IsReplicatorDB(name); got != want {
			t.Errorf("IsReplicatorDB(%q) = %v", name, got)
		}
	}
}

func TestWithTerminalState(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	start := now.Add(-time.Minute)
	tests := []struct {
		name       string
		doc        string
		job        Job
		updateDocs bool
		want       map[string]any // field -> value (nil: absent)
	}{
		{"completed", `{"_id":"r","_rev":"1-a","source":"s","_replication_state_reason":"old","_replication_id":"foo3"}`,
			Job{State: repjob.StateCompleted, RepID: "abc+continuous", Stats: map[string]any{"docs_read": 3}, StartTime: start}, false,
			map[string]any{"_replication_state": "completed", "_replication_state_time": "2026-01-02T03:04:05Z",
				"_replication_id": nil, "_replication_state_reason": nil, "source": "s", "_rev": "1-a"}},
		{"completed, update_docs", `{"_id":"r","_rev":"1-a","source":"s","_replication_id":"foo3"}`,
			Job{State: repjob.StateCompleted, RepID: "abc+continuous", Stats: map[string]any{"docs_read": 3}, StartTime: start}, true,
			map[string]any{"_replication_state": "completed", "_replication_id": "abc+continuous"}},
		{"failed", `{"_id":"r","_rev":"1-a","_replication_stats":{"docs_read":1}}`,
			Job{State: repjob.StateFailed, Reason: "Missing `source` field"}, false,
			map[string]any{"_replication_state": "failed", "_replication_state_reason": "Missing `source` field", "_replication_stats": nil}},
		{"same state keeps time", `{"_id":"r","_rev":"2-a","_replication_state":"failed","_replication_state_time":"2020-01-01T00:00:00Z"}`,
			Job{State: repjob.StateFailed, Reason: "x"}, false,
			map[string]any{"_replication_state_time": "2020-01-01T00:00:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := withTerminalState(json.RawMessage(tt.doc), &tt.job, now, tt.updateDocs)
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range tt.want {
				gv, ok := got[k]
				if v == nil && ok {
					t.Errorf("%s = %v, want absent", k, gv)
				}
				if v != nil && gv != v {
					t.Errorf("%s = %v, want %v", k, gv, v)
				}
			}
			if tt.job.State == repjob.StateCompleted {
				stats, _ := got["_replication_stats"].(map[string]any)
				if stats["docs_read"] != float64(3) || stats["start_time"] != "2026-01-02T03:03:05Z" {
					t.Errorf("stats = %v", stats)
				}
			}
		})
	}
}
