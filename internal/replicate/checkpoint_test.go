package replicate

import (
	"encoding/json"
	"strconv"
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

// mine marks entries as couchrep's own.
func mine(e []HistoryEntry) []HistoryEntry {
	for i := range e {
		e[i].Replicator = ReplicatorMark
	}
	return e
}

// Cases follow compare_replication_logs/2 and compare_rep_history/2 in
// couch_replicator_scheduler_job.erl; from is whose checkpoint the run
// resumes from (entries without couchrep's mark are another replicator's).
func TestCompareCheckpoints(t *testing.T) {
	tests := []struct {
		name     string
		src, tgt Checkpoint
		seq      string
		rest     int
		from     string
	}{
		{"both missing", Checkpoint{}, Checkpoint{}, "", 0, ""},
		{"same session", Checkpoint{SessionID: "s", SourceLastSeq: couch.Seq("42"), History: mine(h("s", "a"))},
			Checkpoint{SessionID: "s", History: mine(h("s"))}, "42", 2, StartCheckpoint},
		{"same session, CouchDB's", Checkpoint{SessionID: "s", SourceLastSeq: couch.Seq("42"), History: h("s", "a")},
			Checkpoint{SessionID: "s", History: h("s")}, "42", 2, StartForeignCheckpoint},
		{"target missing", Checkpoint{SessionID: "s", SourceLastSeq: couch.Seq("42"), History: h("s")}, Checkpoint{}, "", 0, ""},
		{"source entry found in target", Checkpoint{SessionID: "x", History: mine(h("b", "a"))},
			Checkpoint{SessionID: "y", History: h("c", "b")}, `"seq-b"`, 1, StartCheckpoint},
		{"target entry found in source rest", Checkpoint{SessionID: "x", History: h("d", "c", "a")},
			Checkpoint{SessionID: "y", History: h("c", "z")}, `"seq-c"`, 1, StartForeignCheckpoint},
		{"no common ancestry", Checkpoint{SessionID: "x", History: h("a", "b")},
			Checkpoint{SessionID: "y", History: h("c", "d")}, "", 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seq, rest, from := compareCheckpointsFrom(tc.src, tc.tgt)
			if string(seq) != tc.seq || len(rest) != tc.rest || from != tc.from {
				t.Errorf("got seq %q, %d history entries, from %q; want %q, %d, %q", seq, len(rest), from, tc.seq, tc.rest, tc.from)
			}
			if seq2, rest2 := compareCheckpoints(tc.src, tc.tgt); string(seq2) != string(seq) || len(rest2) != len(rest) {
				t.Errorf("compareCheckpoints differs from compareCheckpointsFrom")
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
		`"docs_written":2,"doc_write_failures":0,"bulk_get_docs":0,"bulk_get_attempts":0,"replicator":"couchrep"},` +
		`{"session_id":"old","recorded_seq":"seq-old","missing_checked":0,"missing_found":0,"docs_read":0,` +
		`"docs_written":0,"doc_write_failures":0,"bulk_get_docs":0,"bulk_get_attempts":0}]}`
	if string(b) != want {
		t.Errorf("checkpoint JSON\n got %s\nwant %s", b, want)
	}
}

// TestSeqTrackerOutOfOrder: batches finishing in any order move through
// only over contiguous done batches, and the queue of a long run stays
// bounded by the batches in flight.
func TestSeqTrackerOutOfOrder(t *testing.T) {
	tests := []struct {
		name   string
		window int // batches in flight at once
	}{
		{"one at a time", 1},
		{"four workers", 4},
		{"wide", 33},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newSeqTracker(nil)
			var inFlight []uint64
			seqOf := func(n uint64) string { return strconv.FormatUint(n*10, 10) }
			for range 1000 {
				inFlight = append(inFlight, tr.start(couch.Seq(seqOf(tr.next))))
				if len(inFlight) < tc.window {
					continue
				}
				// Finish the newest first: through may only move when the
				// oldest is done.
				oldest := inFlight[0]
				for j := len(inFlight) - 1; j >= 0; j-- {
					if j > 0 && tr.finish(inFlight[j]) {
						t.Fatalf("through advanced to %s before batch %d was done", tr.through, oldest)
					}
				}
				if !tr.finish(oldest) {
					t.Fatalf("finishing batch %d did not advance through", oldest)
				}
				if got, want := string(tr.through), seqOf(inFlight[len(inFlight)-1]); got != want {
					t.Fatalf("through %s, want %s", got, want)
				}
				if tr.finish(oldest) {
					t.Fatal("finishing a batch twice advanced through")
				}
				inFlight = inFlight[:0]
				if len(tr.queue)-tr.head != 0 {
					t.Fatalf("%d batches left in the queue", len(tr.queue)-tr.head)
				}
			}
			if cap(tr.queue) > 2*tc.window+8 {
				t.Errorf("queue capacity %d for %d batches in flight", cap(tr.queue), tc.window)
			}
			// A sliding window: the queue never empties.
			for range 1000 {
				inFlight = append(inFlight, tr.start(couch.Seq(seqOf(tr.next))))
				if len(inFlight) <= tc.window {
					continue
				}
				if !tr.finish(inFlight[0]) {
					t.Fatalf("finishing the oldest batch %d did not advance through", inFlight[0])
				}
				if got, want := string(tr.through), seqOf(inFlight[0]); got != want {
					t.Fatalf("through %s, want %s", got, want)
				}
				inFlight = inFlight[1:]
			}
			if cap(tr.queue) > 4*tc.window+16 {
				t.Errorf("sliding window: queue capacity %d for %d batches in flight", cap(tr.queue), tc.window)
			}
		})
	}
}
