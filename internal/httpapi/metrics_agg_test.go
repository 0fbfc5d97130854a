package httpapi_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/replicate"
)

// storeGauges renders the per-database gauges of m's /metrics (what the
// store's jobs make: jobs by state, parked, paused, lag in whole seconds,
// docs written, changes pending, fair-share gauges), one line a series,
// sorted.
func storeGauges(t *testing.T, m *httpapi.Metrics) []string {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"couchrep_replication_jobs", "couchrep_replication_jobs_parked", "couchrep_replication_jobs_paused",
		"couchrep_replication_lag_seconds", "couchrep_replication_docs_written", "couchrep_replication_changes_pending",
		"couchrep_replicator_share_weight", "couchrep_replicator_share_usage_ratio", "couchrep_replicator_share_entitled_ratio",
		"couchrep_replication_jobs_scrape_error"}
	var out []string
	for _, f := range fams {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		for _, mt := range f.GetMetric() {
			var labels []string
			for _, l := range mt.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := mt.GetGauge().GetValue()
			if f.GetName() == "couchrep_replication_lag_seconds" {
				v = math.Round(v)
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", f.GetName(), strings.Join(labels, ","), v))
		}
	}
	slices.Sort(out)
	return out
}

// TestMetricsKeptSumsFollowChanges: the /metrics collector keeps its
// per-database sums between scrapes and applies what changed (RepjobStore
// SummaryChanges): after adds, starts, progress, parks, crashes, pauses and
// removals its gauges are those of a collector that lists every job anew;
// at rest a scrape reads nothing but the store's generation, and after one
// job's progress write only the jobs of that job's generation shard.
func TestMetricsKeptSumsFollowChanges(t *testing.T) {
	st, _ := pagingStore(t, 40)
	ctx := t.Context()
	kept := httpapi.NewMetrics(httpapi.NewRepjobStore(st, uuid))
	check := func(what string) {
		t.Helper()
		got := storeGauges(t, kept)
		want := storeGauges(t, httpapi.NewMetrics(httpapi.NewRepjobStore(st, uuid)))
		if !slices.Equal(got, want) {
			t.Fatalf("%s: kept sums\n%s\nwant (every job listed)\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	check("first scrape")
	check("nothing changed")
	for i := range 3 {
		if _, err := st.AddTransient(ctx, []byte(fmt.Sprintf(`{"source":"http://127.0.0.1:1/x%d","target":"http://127.0.0.1:1/b","continuous":true}`, i)), "bob"); err != nil {
			t.Fatal(err)
		}
	}
	check("after adds")
	var ids []string
	pending := int64(5)
	for i := range 6 {
		run, err := st.Accept(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Start(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, run.Record().GetJobId())
		switch i {
		case 0:
			if err := run.Progress(ctx, replicate.Stats{DocsWritten: 7, ChangesPending: &pending, BehindSince: time.Now().Add(-time.Minute)}); err != nil {
				t.Fatal(err)
			}
		case 1:
			if err := run.Park(ctx, time.Now(), replicate.Stats{DocsWritten: 2}); err != nil {
				t.Fatal(err)
			}
		case 2:
			if _, err := run.Crash(ctx, "boom"); err != nil {
				t.Fatal(err)
			}
		}
	}
	check("after starts, progress, a park and a crash")
	if _, err := st.Pause(ctx, ids[3], "test"); err != nil {
		t.Fatal(err)
	}
	if err := st.Remove(ctx, ids[4]); err != nil {
		t.Fatal(err)
	}
	check("after a pause and a removal")

	a := httpapi.NewRepjobStore(st, uuid)
	// A full listing streams its jobs (Each), one record decoded at a
	// time, bounded by a bound of its own, not the scrape's (here: its
	// context canceled before the listing).
	sctx, scancel := context.WithCancel(ctx)
	d, err := a.SummaryChanges(sctx)
	scancel()
	listed := 0
	if err == nil && d.Each != nil {
		err = d.Each(func(*httpapi.Job) { listed++ })
	}
	if err != nil || !d.Full || listed < 40 || len(d.Jobs) != 0 {
		t.Fatalf("first SummaryChanges: full %t, %d jobs streamed, %d listed, %v; want every job streamed", d.Full, listed, len(d.Jobs), err)
	}
	if d, err := a.SummaryChanges(ctx); err != nil || d.Full || len(d.Jobs)+len(d.Removed) != 0 {
		t.Fatalf("SummaryChanges at rest: %+v, %v; want nothing", d, err)
	}
	run, err := st.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.SummaryChanges(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.SummaryChanges(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run.Progress(ctx, replicate.Stats{DocsWritten: 1}); err != nil {
		t.Fatal(err)
	}
	d, err = a.SummaryChanges(ctx)
	if err != nil || d.Full || len(d.Jobs) == 0 || len(d.Jobs) > 4 {
		t.Fatalf("SummaryChanges after one progress write: full %t, %d jobs, %v; want that job and its shard's few", d.Full, len(d.Jobs), err)
	}
	if !slices.ContainsFunc(d.Jobs, func(j *httpapi.Job) bool { return j.JobID == run.Record().GetJobId() && j.Stats.GetDocsWritten() == 1 }) {
		t.Fatalf("SummaryChanges after one progress write lacks the job written")
	}
	check("after a progress write")
}
