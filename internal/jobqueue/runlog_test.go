package jobqueue

import (
	"errors"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/storetest"
)

func stamp(b byte) [kv.VersionstampLength]byte {
	var s [kv.VersionstampLength]byte
	s[7] = b
	return s
}

func TestCheckRuns(t *testing.T) {
	run := func(lock string, start, end byte) Run {
		return Run{ID: "j", Node: "n", Lock: []byte(lock), Start: stamp(start), End: stamp(end)}
	}
	tests := []struct {
		name    string
		runs    []Run
		overlap bool
	}{
		{"none", nil, false},
		{"one run", []Run{run("a", 1, 5)}, false},
		{"handed over", []Run{run("a", 1, 5), run("b", 6, 9), run("c", 10, 10)}, false},
		{"old worker committed after the next accept", []Run{run("a", 1, 7), run("b", 6, 9)}, true},
		{"same commit", []Run{run("a", 1, 6), run("b", 6, 9)}, true},
		{"no start", []Run{{ID: "j", Lock: []byte("a"), End: stamp(3)}}, true},
		{"end before start", []Run{run("a", 5, 3)}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRuns(tc.runs)
			if got := errors.Is(err, ErrRunOverlap); got != tc.overlap {
				t.Fatalf("CheckRuns = %v, want overlap %v", err, tc.overlap)
			}
		})
	}
}

// TestRunLogRecordsHandOver runs a job on one worker, lets the activity
// monitor take it away, runs it on a second worker, and checks that the run
// log has both runs, in order, and that the stale worker's refused commit
// was not logged.
func TestRunLogRecordsHandOver(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		tests := []struct {
			name   string
			runLog bool
			want   int
		}{
			{"on", true, 2},
			{"off", false, 0},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				b := setup(t, Options{NodeName: "n1", RunLog: tc.runLog})
				other := New(b.db, Options{NodeName: "n2", Clock: b.clock.Now, RunLog: tc.runLog})
				mustAdd(t, b, "job", AddOptions{})
				first := mustAccept(t, b)
				if err := first.Update(b.ctx, []byte("progress")); err != nil {
					t.Fatal(err)
				}
				m := b.q.NewMonitor(MonitorOptions{})
				t0 := time.Now()
				if _, err := m.Check(b.ctx, t0); err != nil {
					t.Fatal(err)
				}
				if n, err := m.Check(b.ctx, t0.Add(time.Minute)); err != nil || n != 1 {
					t.Fatalf("monitor requeued %d (%v), want 1", n, err)
				}
				second, err := other.Accept(b.ctx, typA, AcceptOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := first.Update(b.ctx, nil); !errors.Is(err, ErrWorkerConflict) {
					t.Fatalf("stale worker update: %v", err)
				}
				if err := second.Finish(b.ctx, nil); err != nil {
					t.Fatal(err)
				}
				runs, err := b.q.Runs(b.ctx, typA)
				if err != nil {
					t.Fatal(err)
				}
				got := runs["job"]
				if len(got) != tc.want {
					t.Fatalf("runs %+v, want %d", got, tc.want)
				}
				if err := CheckRuns(got); err != nil {
					t.Fatal(err)
				}
				if tc.want == 2 && (got[0].Node != "n1" || got[1].Node != "n2" || got[0].End == got[0].Start || got[1].End == got[1].Start) {
					t.Fatalf("runs %+v: want n1 then n2, each with a commit after its accept", got)
				}
			})
		}
	})
}
