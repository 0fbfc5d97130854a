package httpapi

import (
	"slices"
	"testing"
	"time"
)

func TestRateTracker(t *testing.T) {
	var rt rateTracker
	t0 := time.Unix(1_000_000, 0)
	job := func(id string, written int64) *Job { return &Job{JobID: id, Stats: &Stats{DocsWritten: written}} }
	for _, step := range []struct {
		at      time.Duration
		written int64
	}{{0, 0}, {2 * time.Second, 50}, {5 * time.Second, 100}, {10 * time.Second, 600}, {15 * time.Second, 500}} {
		rt.observe(t0.Add(step.at), []*Job{job("a", step.written), job("b", 7)})
	}
	got := rt.observe(t0.Add(20*time.Second), []*Job{job("a", 1000)})
	// Samples at 0, 5, 10, 15, 20 s (the one 2 s after the first is
	// skipped); the counters going back at 15 s shows as 0.
	if sp := got["a"].spark(); !slices.Equal(sp, []float64{20, 100, 0, 100}) {
		t.Fatalf("spark = %v", sp)
	}
	if r := got["a"].rate(); r != 50 {
		t.Fatalf("rate = %v, want 1000 docs / 20 s", r)
	}
	if _, ok := rt.jobs["b"]; ok {
		t.Fatal("a job gone from the store is still tracked")
	}
	for i := range 3 * sparkPoints {
		got = rt.observe(t0.Add(time.Minute+time.Duration(i)*sampleEvery), []*Job{job("a", int64(i))})
	}
	if n := len(got["a"].spark()); n != sparkPoints {
		t.Fatalf("spark has %d points, want %d", n, sparkPoints)
	}
}
