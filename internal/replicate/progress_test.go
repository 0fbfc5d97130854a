package replicate

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
)

// TestNoChanges: a one-shot replication that processes no change — doc_ids
// that match nothing, an empty doc_ids, nothing new since the checkpoint —
// writes no checkpoint and answers exactly {"ok":true,"no_changes":true}
// (with the existing checkpoint's history when there is one), as CouchDB
// 3.4.3 does (couch_replicator_scheduler_job:do_last_checkpoint with
// highest_seq_done still ?LOWEST_SEQ; a one-shot feed's last_seq is not
// queued, couch_replicator_changes_reader:process_change/2).
func TestNoChanges(t *testing.T) {
	cases := []struct {
		name, extra string
	}{
		{"doc_ids matching nothing", `,"doc_ids":["nope","nada"]`},
		{"empty doc_ids", `,"doc_ids":[]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeCouch(t)
			f.addDB("src")
			f.addDB("tgt")
			for i := 0; i < 5; i++ {
				f.put("src", map[string]any{"_id": fmt.Sprintf("d%d", i)})
			}
			p := fakeParams(t, c.extra, f.URL+"/src", f.URL+"/tgt")
			res, err := runFake(p)
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Body) != `{"ok":true,"no_changes":true}` || !res.NoChanges {
				t.Fatalf("answer %s (no_changes %v), want {\"ok\":true,\"no_changes\":true}", res.Body, res.NoChanges)
			}
			base, _, _ := ID(p, "u")
			if f.localDoc("src", base) != nil || f.localDoc("tgt", base) != nil {
				t.Errorf("a checkpoint was written for a run that processed no change")
			}
			if n := len(f.dbs["tgt"].docs); n != 0 {
				t.Errorf("target has %d docs, want 0", n)
			}
		})
	}

	t.Run("nothing new since the checkpoint", func(t *testing.T) {
		f := newFakeCouch(t)
		f.addDB("src")
		f.addDB("tgt")
		for i := 0; i < 5; i++ {
			f.put("src", map[string]any{"_id": fmt.Sprintf("d%d", i)})
		}
		p := fakeParams(t, `,"doc_ids":["d1","d3"]`, f.URL+"/src", f.URL+"/tgt")
		first, err := runFake(p)
		if err != nil || first.NoChanges {
			t.Fatalf("first run: %s, %v", first.Body, err)
		}
		f.put("src", map[string]any{"_id": "other"}) // not in doc_ids
		res, err := runFake(p)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(res.Body, &m); err != nil {
			t.Fatal(err)
		}
		if string(m["ok"]) != "true" || string(m["no_changes"]) != "true" || m["history"] == nil || m["_id"] != nil || m["_rev"] != nil {
			t.Fatalf("answer %s, want ok, no_changes and the checkpoint's history (no _id/_rev)", res.Body)
		}
	})
}

// TestStatsSeqsAndPending: source_seq is never behind through_seq, and
// changes_pending is the source's own "pending" where a _changes answer
// gave one (plus, for numeric seqs, the changes cut into batches and not
// yet through), else source_seq minus through_seq for numeric seqs, else
// unknown.
func TestStatsSeqsAndPending(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	cases := []struct {
		name                string
		start, cut, through string // source update_seq at the start; last batch cut; through_seq
		read                couch.FeedEnd
		exhausted           bool
		wantSource          string
		wantPending         *int64
	}{
		{"numeric estimate", "10", "", "4", couch.FeedEnd{}, false, "10", n(6)},
		{"continuous past the start seq", "10", "25", "25", couch.FeedEnd{LastSeq: couch.Seq("25")}, false, "25", n(0)},
		{"through past everything read", "10", "", "30", couch.FeedEnd{}, false, "30", n(0)},
		{"source pending, numeric in flight", "10", "6", "4", couch.FeedEnd{LastSeq: couch.Seq("6"), Pending: n(4)}, false, "10", n(6)},
		{"source pending, opaque", `"10-x"`, `"6-x"`, `"4-x"`, couch.FeedEnd{LastSeq: couch.Seq(`"6-x"`), Pending: n(4)}, false, `"6-x"`, n(4)},
		{"opaque without pending", `"10-x"`, `"6-x"`, `"4-x"`, couch.FeedEnd{LastSeq: couch.Seq(`"6-x"`)}, false, `"6-x"`, nil},
		{"one-shot feed read to its end", `"10-x"`, `"9-x"`, `"9-x"`, couch.FeedEnd{LastSeq: couch.Seq(`"10-x"`)}, true, `"10-x"`, n(0)},
		{"filtered one-shot done, numeric", "10", "7", "7", couch.FeedEnd{LastSeq: couch.Seq("10")}, true, "10", n(0)},
		{"filtered one-shot finishing, numeric", "10", "7", "5", couch.FeedEnd{LastSeq: couch.Seq("10")}, true, "10", n(2)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &runState{r: New(Params{}, Options{}), sourceSeq: couch.Seq(c.start), tracker: newSeqTracker(nil)}
			if c.cut != "" {
				s.cutSeq, s.readSeq = couch.Seq(c.cut), couch.Seq(c.cut)
			}
			if c.read.LastSeq != nil || c.read.Pending != nil || c.exhausted {
				s.feedRead(c.read, c.exhausted)
			}
			s.tracker.through = couch.Seq(c.through)
			st := s.stats()
			if st.SourceSeq.String() != c.wantSource {
				t.Errorf("source_seq %s, want %s", st.SourceSeq, c.wantSource)
			}
			switch {
			case c.wantPending == nil && st.ChangesPending != nil:
				t.Errorf("changes_pending %d, want unknown", *st.ChangesPending)
			case c.wantPending != nil && (st.ChangesPending == nil || *st.ChangesPending != *c.wantPending):
				t.Errorf("changes_pending %v, want %d", st.ChangesPending, *c.wantPending)
			}
		})
	}
}

// TestPendingFromSource: against a CouchDB-shaped source (opaque seqs,
// "pending" in its paged _changes answers) changes_pending is known — from
// the source's own count — once the first page was read, and 0 at the
// end; with opaque seqs there is no estimate to fall back on (before, it
// stayed unknown).
func TestPendingFromSource(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	for i := 0; i < 30; i++ {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%02d", i)})
	}
	p := fakeParams(t, `,"worker_batch_size":5`, f.URL+"/src", f.URL+"/tgt")
	var reports []Stats
	var mu sync.Mutex
	o := Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond, ProgressInterval: time.Millisecond,
		OnProgress: func(s Stats) { mu.Lock(); reports = append(reports, s); mu.Unlock() }}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := New(p, o).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stats.ChangesPending == nil || *res.Stats.ChangesPending != 0 {
		t.Fatalf("final changes_pending %v, want 0", res.Stats.ChangesPending)
	}
	mu.Lock()
	defer mu.Unlock()
	known := false
	for _, s := range reports {
		if known && s.ChangesPending == nil {
			t.Errorf("a report at through_seq %s has changes_pending unknown again", s.ThroughSeq)
		}
		known = known || s.ChangesPending != nil
	}
}
