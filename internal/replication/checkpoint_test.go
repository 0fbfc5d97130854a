package replication

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

func h(ids ...string) []HistoryEntry {
	out := make([]HistoryEntry, len(ids))
	for i, id := range ids {
		out[i] = HistoryEntry{SessionID: id, RecordedSeq: couch.Seq(`"seq-` + id + `"`)}
	}
	return out
}

// Cases follow compare_replication_logs/2 and compare_rep_history/2 in
// couch_replicator_scheduler_job.erl.
func TestCompareCheckpoints(t *testing.T) {
	tests := []struct {
		name     string
		src, tgt Checkpoint
		seq      string
		rest     int
	}{
		{"both missing", Checkpoint{}, Checkpoint{}, "", 0},
		{"same session", Checkpoint{SessionID: "s", SourceLastSeq: couch.Seq("42"), History: h("s", "a")},
			Checkpoint{SessionID: "s", History: h("s")}, "42", 2},
		{"target missing", Checkpoint{SessionID: "s", SourceLastSeq: couch.Seq("42"), History: h("s")}, Checkpoint{}, "", 0},
		{"source entry found in target", Checkpoint{SessionID: "x", History: h("b", "a")},
			Checkpoint{SessionID: "y", History: h("c", "b")}, `"seq-b"`, 1},
		{"target entry found in source rest", Checkpoint{SessionID: "x", History: h("d", "c", "a")},
			Checkpoint{SessionID: "y", History: h("c", "z")}, `"seq-c"`, 1},
		{"no common ancestry", Checkpoint{SessionID: "x", History: h("a", "b")},
			Checkpoint{SessionID: "y", History: h("c", "d")}, "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seq, rest := compareCheckpoints(tc.src, tc.tgt)
			if string(seq) != tc.seq || len(rest) != tc.rest {
				t.Errorf("got seq %q, %d history entries; want %q, %d", seq, len(rest), tc.seq, tc.rest)
			}
		})
	}
}

func TestSeqTrackerContiguous(t *testing.T) {
	tr := newSeqTracker(couch.Seq("0"))
	b1, b2, b3 := tr.start(couch.Seq("10")), tr.start(couch.Seq("20")), tr.start(couch.Seq("30"))
	steps := []struct {
		finish uint64
		want   string
	}{
		{b2, "0"}, // batch 1 still in flight: through stays
		{b3, "0"},
		{b1, "30"}, // all three contiguous now
	}
	for _, s := range steps {
		tr.finish(s.finish)
		if string(tr.through) != s.want {
			t.Fatalf("after finishing %d: through %s, want %s", s.finish, tr.through, s.want)
		}
	}
	tr.advance(couch.Seq("35"))
	if string(tr.through) != "35" {
		t.Errorf("advance with nothing in flight: %s", tr.through)
	}
}

func TestCheckpointFormat(t *testing.T) {
	start := time.Date(2013, 8, 11, 20, 38, 50, 0, time.UTC)
	c := newCheckpoint("sess", nil, couch.Seq("7"), start, start.Add(time.Minute),
		Stats{RevisionsChecked: 3, MissingRevisionsFound: 2, DocsRead: 2, DocsWritten: 2}, h("old"), false)
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"session_id":"sess","source_last_seq":7,"replication_id_version":4,"history":[` +
		`{"session_id":"sess","start_time":"Sun, 11 Aug 2013 20:38:50 GMT","end_time":"Sun, 11 Aug 2013 20:39:50 GMT",` +
		`"start_last_seq":0,"end_last_seq":7,"recorded_seq":7,"missing_checked":3,"missing_found":2,"docs_read":2,` +
		`"docs_written":2,"doc_write_failures":0,"bulk_get_docs":0,"bulk_get_attempts":0},` +
		`{"session_id":"old","recorded_seq":"seq-old","missing_checked":0,"missing_found":0,"docs_read":0,` +
		`"docs_written":0,"doc_write_failures":0,"bulk_get_docs":0,"bulk_get_attempts":0}]}`
	if string(b) != want {
		t.Errorf("checkpoint JSON\n got %s\nwant %s", b, want)
	}
}
