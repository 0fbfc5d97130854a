package httpapi

import (
	"slices"
	"testing"
	"time"

	"github.com/couchrep/couchrep/messages"
)

func TestRateTracker(t *testing.T) {
	var rt rateTracker
	t0 := time.Unix(1_000_000, 0)
	job := func(id string, updated time.Duration, written int64) *Job {
		return &Job{JobID: id, LastUpdated: t0.Add(updated), Stats: &messages.ReplicationStats{DocsWritten: written}}
	}
	// Reads every 5 s; the job records its stats every 10 s; the counters
	// go back at 40 s (a restart from an older checkpoint); then the job
	// idles.
	for _, step := range []struct {
		read, updated time.Duration
		written       int64
	}{
		{0, 0, 0}, {5 * time.Second, 0, 0}, {12 * time.Second, 10 * time.Second, 100}, {17 * time.Second, 10 * time.Second, 100},
		{21 * time.Second, 20 * time.Second, 600}, {31 * time.Second, 30 * time.Second, 1000}, {41 * time.Second, 40 * time.Second, 900},
		{50 * time.Second, 40 * time.Second, 900}, {71 * time.Second, 40 * time.Second, 900},
	} {
		rt.observe(t0.Add(step.read), []*Job{job("a", step.updated, step.written), job("b", 0, 7)})
	}
	got := rt.observe(t0.Add(72*time.Second), []*Job{job("a", 40*time.Second, 900)})
	// Samples at 0, 10, 20, 30, 40 (the job's own times) and 71 s (idle
	// for 30 s since 40 s).
	if sp := got["a"].spark(); !slices.Equal(sp, []float64{10, 50, 40, 0, 0}) {
		t.Fatalf("spark = %v", sp)
	}
	// docs/s is the net change over the newest samples spanning a minute
	// (from 10 s to 71 s).
	if r, want := got["a"].rate(), 800.0/61; r != want {
		t.Fatalf("rate = %v, want %v", r, want)
	}
	if _, ok := rt.jobs["b"]; ok {
		t.Fatal("a job gone from the store is still tracked")
	}
	for i := range 3 * sparkPoints {
		got = rt.observe(t0.Add(2*time.Minute+time.Duration(i)*time.Second), []*Job{job("a", 2*time.Minute+time.Duration(i)*time.Second, int64(1000+i))})
	}
	if n := len(got["a"].spark()); n != sparkPoints {
		t.Fatalf("spark has %d points, want %d", n, sparkPoints)
	}
	if r := got["a"].rate(); r != 1 {
		t.Fatalf("rate = %v, want 1 doc/s", r)
	}
}
