package replicate

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestCountedOnlyOwnWork: Options.OnCounted is told what a run did, never
// the counters it starts from (its checkpoint's history, the job's prior
// counters); and a run's counters start at the larger of its history and
// Prior (of the same replication), so they never go backwards across a
// restart.
func TestCountedOnlyOwnWork(t *testing.T) {
	f := newFakeCouch(t)
	f.addDB("src")
	f.addDB("tgt")
	for i := range 7 {
		f.put("src", map[string]any{"_id": fmt.Sprintf("d%d", i)})
	}
	p := fakeParams(t, "", f.URL+"/src", f.URL+"/tgt")
	base, ext, _ := ID(p, "u")
	run := func(prior *Prior) (Stats, Stats) {
		t.Helper()
		var mu sync.Mutex
		var counted Stats
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := New(p, Options{ServerUUID: "u", Logger: zerolog.Nop(), RetryBackoff: time.Millisecond, Prior: prior,
			OnCounted: func(s Stats) {
				mu.Lock()
				defer mu.Unlock()
				counted.DocsRead += s.DocsRead
				counted.DocsWritten += s.DocsWritten
				counted.RevisionsChecked += s.RevisionsChecked
				counted.MissingRevisionsFound += s.MissingRevisionsFound
			}}).Run(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return res.Stats, counted
	}
	st, counted := run(nil)
	if st.DocsWritten != 7 || counted.DocsRead != 7 || counted.DocsWritten != 7 || counted.RevisionsChecked != 7 {
		t.Fatalf("first run: stats %+v, counted %+v; want 7 written, 7 read and written counted", st, counted)
	}
	// Nothing to copy: the history's 7 are restored, nothing is counted.
	st, counted = run(nil)
	if st.DocsWritten != 7 || st.DocsRead != 7 || !zeroCounts(counted) {
		t.Errorf("second run: stats %+v, counted %+v; want 7 restored, nothing counted", st, counted)
	}
	// The job's last run counted more than its checkpoint says (it ended
	// after the checkpoint): its counters start from those.
	prior := &Prior{RepID: base + ext, Stats: Stats{DocsRead: 9, DocsWritten: 8, RevisionsChecked: 9}}
	st, counted = run(prior)
	if st.DocsRead != 9 || st.DocsWritten != 8 || st.RevisionsChecked != 9 || st.MissingRevisionsFound != 7 || !zeroCounts(counted) {
		t.Errorf("with prior counters: stats %+v, counted %+v; want read 9, written 8, checked 9, found 7, nothing counted", st, counted)
	}
	// Another replication's counters are not this one's.
	prior.RepID = "other"
	if st, _ = run(prior); st.DocsRead != 7 {
		t.Errorf("with another replication's prior counters: docs_read %d, want 7", st.DocsRead)
	}
}

func zeroCounts(s Stats) bool {
	return s.DocsRead == 0 && s.DocsWritten == 0 && s.RevisionsChecked == 0 && s.MissingRevisionsFound == 0
}
