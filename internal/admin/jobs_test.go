package admin

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

func TestJobFilter(t *testing.T) {
	f := JobFilter(&messages.ListJobsRequest{
		States:   []messages.JobStatus{messages.JobStatus_JOB_STATUS_RUNNING, messages.JobStatus_JOB_STATUS_CRASHING},
		Database: "a/_replicator", Node: "n1",
	})
	if f.DB != "a/_replicator" || f.Node != "n1" || len(f.States) != 2 || f.States[0] != repjob.StateRunning || f.States[1] != repjob.StateCrashing {
		t.Fatalf("filter %+v", f)
	}
}

// TestJobStatusMapping: every job state maps to the admin status of its
// name and back, and every admin status but UNSPECIFIED is a job state.
func TestJobStatusMapping(t *testing.T) {
	for _, st := range repjob.States {
		s := jobStatus(st)
		if want := "JOB_STATUS_" + strings.ToUpper(st.String()); s.String() != want {
			t.Errorf("%s -> %s, want %s", st, s, want)
		}
		if back := stateOf(s); back != st {
			t.Errorf("%s -> %s -> %s", st, s, back)
		}
		if name := StatusName(s); name != st.String() {
			t.Errorf("StatusName(%s) = %q", s, name)
		}
		if back, err := ParseStatus(st.String()); err != nil || back != s {
			t.Errorf("ParseStatus(%q) = %s, %v", st.String(), back, err)
		}
	}
	if s, err := ParseStatus("asleep"); err == nil || !strings.Contains(err.Error(), `"asleep"`) {
		t.Errorf("ParseStatus(asleep) = %s, %v", s, err)
	}
	for v := range messages.JobStatus_name {
		if v == 0 {
			continue
		}
		if _, err := repjob.ParseState(stateOf(messages.JobStatus(v)).String()); err != nil {
			t.Errorf("%s is no job state: %v", messages.JobStatus(v), err)
		}
	}
}

func TestJobSummary(t *testing.T) {
	pending := int64(7)
	started := timestamppb.Now()
	history := &messages.JobHistory{Events: []*messages.JobEvent{{Type: messages.JobEventType_JOB_EVENT_TYPE_STARTED}}}
	base := func() *messages.ReplicationJob {
		return &messages.ReplicationJob{JobId: "j1", RepId: "r1+continuous", Kind: messages.ReplicationKind_REPLICATION_KIND_PERSISTENT,
			DbName: "db/_replicator", DocId: "d", Source: "http://s/", Target: "http://t/", Continuous: true, Node: "old",
			LastStarted: started, ErrorCount: 2, LastError: "boom", History: history,
			Stats: &messages.ReplicationStats{DocsWritten: 5, DocsRead: 6, ChangesPending: &pending, CheckpointedSourceSeq: "9"}}
	}
	for _, tc := range []struct {
		name        string
		rec         *repjob.Record
		withHistory bool
		check       func(*messages.JobSummary) bool
	}{
		{"running shows its worker node, no error", &repjob.Record{ReplicationJob: base(), QueueState: jobqueue.StateRunning, WorkerNode: "n2"}, false,
			func(s *messages.JobSummary) bool {
				return s.Status == messages.JobStatus_JOB_STATUS_RUNNING && s.Node == "n2" && s.Error == "" && s.History == nil &&
					s.Kind == "persistent" && s.Stats.GetChangesPending() == 7 && s.Stats.GetDocsWritten() == 5 && s.ErrorCount == 2
			}},
		{"crashing shows the error, no node", &repjob.Record{ReplicationJob: func() *messages.ReplicationJob {
			m := base()
			m.State = messages.ReplicationState_REPLICATION_STATE_CRASHING
			return m
		}(), QueueState: jobqueue.StatePending}, true,
			func(s *messages.JobSummary) bool {
				return s.Status == messages.JobStatus_JOB_STATUS_CRASHING && s.Node == "" && s.Error == "boom" && len(s.History) == 1
			}},
		{"credentials in the error and endpoints are masked", &repjob.Record{ReplicationJob: func() *messages.ReplicationJob {
			m := base()
			m.State = messages.ReplicationState_REPLICATION_STATE_CRASHING
			m.Source, m.LastError = "http://bob:s3cr3t@s/", "GET http://bob:s3cr3t@s/: Authorization: Basic s3cr3t"
			return m
		}(), QueueState: jobqueue.StatePending}, false,
			func(s *messages.JobSummary) bool {
				return s.Source == "http://bob:*****@s/" && s.Error == "GET http://bob:*****@s/: Authorization: Basic *****"
			}},
		{"canceled finished job", &repjob.Record{ReplicationJob: func() *messages.ReplicationJob {
			m := base()
			m.LastError = ""
			m.Stats = nil
			return m
		}(), QueueState: jobqueue.StateFinished, Canceled: true}, false,
			func(s *messages.JobSummary) bool {
				return s.Status == messages.JobStatus_JOB_STATUS_FAILED && s.Error == "canceled" && s.Stats.GetChangesPending() == -1
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := JobSummary(tc.rec, tc.withHistory)
			if !tc.check(s) {
				t.Fatalf("summary %v", s)
			}
			if !proto.Equal(s.StartTime, started) || s.Id != "j1" || s.ReplicationId != "r1+continuous" {
				t.Fatalf("identity fields: %v", s)
			}
		})
	}
}
