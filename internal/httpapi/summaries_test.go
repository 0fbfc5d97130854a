package httpapi_test

import (
	"testing"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
)

// TestListSummariesFollowsWrites: ListSummaries keeps its listing while
// no job record is written, and lists again after any write (an add, a
// state change, a removal), so /metrics never shows a stale count.
func TestListSummariesFollowsWrites(t *testing.T) {
	st, _ := pagingStore(t, 30)
	a := httpapi.NewRepjobStore(st, uuid)
	ctx := t.Context()
	count := func(want int, what string) []*httpapi.Job {
		t.Helper()
		jobs, err := a.ListSummaries(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != want {
			t.Fatalf("%s: %d jobs listed, want %d", what, len(jobs), want)
		}
		return jobs
	}
	first := count(30, "first listing")
	first[0] = nil // the caller's slice: the store's listing is not changed
	again := count(30, "nothing written")
	if again[0] == nil {
		t.Fatal("a caller's change of the returned slice reached the next listing")
	}
	res, err := st.AddTransient(ctx, []byte(`{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","continuous":true}`), "bob")
	if err != nil {
		t.Fatal(err)
	}
	count(31, "after an add")
	if _, err := st.Cancel(ctx, res.Record.GetJobId(), "test"); err != nil {
		t.Fatal(err)
	}
	jobs := count(30, "after a cancel")
	for _, j := range jobs {
		if j.JobID == res.Record.GetJobId() {
			t.Fatalf("cancelled job %s still listed", j.JobID)
		}
	}
	// A state change of one job (no add or removal) is seen too.
	if _, err := st.Accept(ctx, false); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, j := range count(30, "after an accept") {
		if j.State == repjob.StateRunning {
			running++
		}
	}
	if running != 1 {
		t.Fatalf("%d jobs running after an accept, want 1", running)
	}
}
