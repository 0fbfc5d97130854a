package httpapi

import (
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// TestLiveStats: a running job's progress event replaces its stored stats
// for the job the store shows running on the reporting node in the same
// run; other events drop them; a full listing drops those of jobs that do
// not run there any more.
func TestLiveStats(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	stored := &messages.ReplicationStats{DocsWritten: 1}
	job := func(state repjob.State, node string, at time.Time) *Job {
		return &Job{JobID: "j", State: state, Node: node, LastStarted: at, Stats: stored}
	}
	progress := func(node string, at time.Time, written int64) *messages.ReplicationJobEvent {
		return &messages.ReplicationJobEvent{JobId: "j", Node: node, Progress: true, State: repjob.StateRunning.Proto(),
			StartedAt: timestamppb.New(at), Stats: &messages.ReplicationStats{DocsWritten: written}}
	}
	cases := []struct {
		name   string
		events []*messages.ReplicationJobEvent
		job    *Job
		want   int64
	}{
		{"no event", nil, job(repjob.StateRunning, "n1", started), 1},
		{"progress of the running job", []*messages.ReplicationJobEvent{progress("n1", started, 5), progress("n1", started, 9)},
			job(repjob.StateRunning, "n1", started), 9},
		{"the job runs elsewhere now", []*messages.ReplicationJobEvent{progress("n1", started, 5)}, job(repjob.StateRunning, "n2", started), 1},
		{"an earlier run's report", []*messages.ReplicationJobEvent{progress("n1", started, 5)},
			job(repjob.StateRunning, "n1", started.Add(time.Minute)), 1},
		{"the job is no longer running", []*messages.ReplicationJobEvent{progress("n1", started, 5)}, job(repjob.StatePending, "n1", started), 1},
		{"the run ended", []*messages.ReplicationJobEvent{progress("n1", started, 5),
			{JobId: "j", Node: "n1", State: repjob.StatePending.Proto()}}, job(repjob.StateRunning, "n1", started), 1},
		{"a new run started", []*messages.ReplicationJobEvent{progress("n1", started, 5),
			{JobId: "j", Node: "n1", State: repjob.StateRunning.Proto()}}, job(repjob.StateRunning, "n1", started), 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := &Metrics{}
			for _, e := range c.events {
				m.ObserveLive(e)
			}
			got := m.withLive(c.job)
			if got.Stats.GetDocsWritten() != c.want {
				t.Fatalf("docs_written %d, want %d", got.Stats.GetDocsWritten(), c.want)
			}
			if c.job.Stats != stored {
				t.Fatal("withLive changed the store's job")
			}
		})
	}

	t.Run("a listing prunes jobs not running there", func(t *testing.T) {
		m := &Metrics{}
		m.ObserveLive(progress("n1", started, 5))
		m.pruneLive([]*Job{job(repjob.StateRunning, "n1", started)})
		if len(m.live.m) != 1 {
			t.Fatalf("the running job's entry was pruned")
		}
		m.pruneLive([]*Job{job(repjob.StateCrashing, "n1", started)})
		if len(m.live.m) != 0 {
			t.Fatalf("%d entries left after the job stopped running", len(m.live.m))
		}
	})
}

// TestJobSumAnswersAsTheJob: the collector keeps of each job a 96-byte
// summary (not its history, endpoints, document or stats message) that
// answers the sums' questions as the job does (series, lag, parked,
// paused, documents written, changes pending), and turns back into a Job
// with what withLive reads.
func TestJobSumAnswersAsTheJob(t *testing.T) {
	now := time.Now()
	pending, none := int64(7), int64(0)
	behind := timestamppb.New(now.Add(-30 * time.Second))
	for _, j := range []*Job{
		{JobID: "parked", Server: "http://s/", Database: "_replicator", State: repjob.StateRunning, Node: "n1",
			LastStarted: now.Add(-time.Hour), ParkedSince: now.Add(-time.Minute), Source: "http://s/a/", Target: "http://s/b/",
			History: schedpolicy.History{{}},
			Stats: &messages.ReplicationStats{DocsWritten: 12, ChangesPending: &none,
				WriteFailures: []*messages.DocWriteFailure{{}}}},
		{JobID: "lagging", Server: "http://s/", Database: "db/_replicator", State: repjob.StateRunning, Node: "n1",
			LastStarted: now.Add(-time.Hour), Stats: &messages.ReplicationStats{DocsWritten: 3, ChangesPending: &pending, BehindSince: behind}},
		{JobID: "paused", Transient: true, State: repjob.StatePending, PausedAt: now,
			Stats: &messages.ReplicationStats{ChangesPending: &pending, BehindSince: behind}},
		{JobID: "failed", Transient: true, State: repjob.StateFailed},
	} {
		s := sumOf(j)
		key := aggKey{kind: "transient"}
		if !j.Transient {
			key = aggKey{kind: "persistent", server: j.Server, db: j.Database}
		}
		if aggKeyOf(&s) != key || s.parked != j.Parked() || s.paused != j.Paused() || s.written != j.Stats.GetDocsWritten() ||
			s.hasPending != (j.Stats.GetChangesPending() != 0 || j.Stats != nil && j.Stats.ChangesPending != nil) ||
			s.pending != j.Stats.GetChangesPending() {
			t.Errorf("%s: summary %+v answers otherwise than the job", j.JobID, s)
		}
		if lag := lagSince(&s); j.Lag(now) == 0 && !lag.IsZero() || j.Lag(now) != 0 && lag.Sub(behind.AsTime()).Abs() > time.Microsecond {
			t.Errorf("%s: summary behind since %s, the job's lag %s", j.JobID, lag, j.Lag(now))
		}
		back := s.job(j.JobID)
		if back.JobID != j.JobID || back.State != j.State || back.Node != j.Node || !back.LastStarted.Equal(j.LastStarted) ||
			back.Lag(now) != j.Lag(now) && j.PausedAt.IsZero() || back.Stats.GetDocsWritten() != j.Stats.GetDocsWritten() {
			t.Errorf("%s: summary as a job %+v, want %+v", j.JobID, back, j)
		}
	}
	if size := unsafe.Sizeof(jobSum{}); size > 96 {
		t.Errorf("a kept summary is %d bytes, want at most 96", size)
	}
}

// TestKeptJobsShareNames: the collector's kept jobs share one copy of each
// server, database and node name (thousands of per-user jobs, a few names).
func TestKeptJobsShareNames(t *testing.T) {
	var a jobsAgg
	a.reset()
	for _, id := range []string{"j1", "j2"} {
		a.set(id, &Job{JobID: id, Server: strings.Clone("http://s/"), Database: strings.Clone("_replicator"),
			Node: strings.Clone("n1"), State: repjob.StateRunning})
	}
	j1, j2 := a.jobs["j1"], a.jobs["j2"]
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(j1.server, j2.server) || !same(j1.database, j2.database) || !same(j1.node, j2.node) {
		t.Fatal("kept jobs hold copies of their names of their own")
	}
}
