package admin

import (
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// JobFilter turns a ListJobsRequest into the job store's filter.
func JobFilter(req *messages.ListJobsRequest) repjob.Filter {
	f := repjob.Filter{DB: req.GetDatabase(), Node: req.GetNode()}
	for _, s := range req.GetStates() {
		f.States = append(f.States, stateOf(s))
	}
	return f
}

// The admin API's job status and the job's state map to each other here
// and nowhere else: a JobStatus has the number of the repjob.State it
// names (TestJobStatusMapping proves it for every value).

// jobStatus is st as the admin API shows it.
func jobStatus(st repjob.State) messages.JobStatus { return messages.JobStatus(st) }

// stateOf is the job state an admin API status names.
func stateOf(s messages.JobStatus) repjob.State { return repjob.State(s) }

// StatusName is a job status's CouchDB name ("running"), as couchrepctl
// shows it.
func StatusName(s messages.JobStatus) string { return stateOf(s).String() }

// ParseStatus returns the job status CouchDB's name name stands for; an
// error naming it otherwise.
func ParseStatus(name string) (messages.JobStatus, error) {
	st, err := repjob.ParseState(name)
	if err != nil {
		return 0, err
	}
	return jobStatus(st), nil
}

// JobSummary is the admin view of a stored job; withHistory adds its
// scheduler history (newest first).
func JobSummary(r *repjob.Record, withHistory bool) *messages.JobSummary {
	st := r.State()
	s := &messages.JobSummary{
		Id:            r.GetJobId(),
		ReplicationId: r.GetRepId(),
		Status:        jobStatus(st),
		Database:      r.GetDbName(),
		DocId:         r.GetDocId(),
		Source:        redact.URL(r.GetSource()),
		Target:        redact.URL(r.GetTarget()),
		Continuous:    r.GetContinuous(),
		StartTime:     r.GetLastStarted(),
		LastUpdated:   r.GetLastUpdated(),
		ErrorCount:    uint32(max(r.GetErrorCount(), 0)),
		Stats:         jobStats(r.GetStats()),
		Kind:          strings.ToLower(strings.TrimPrefix(r.GetKind().String(), "REPLICATION_KIND_")),
	}
	if st == repjob.StateRunning {
		s.ParkedSince = r.GetParkedSince()
		s.Node = r.WorkerNode
		if s.Node == "" {
			s.Node = r.GetNode()
		}
	}
	if st == repjob.StateCrashing || st == repjob.StateFailed {
		s.Error = redact.Text(r.GetLastError())
		if s.Error == "" && r.Canceled {
			s.Error = "canceled"
		}
	}
	s.PausedAt, s.ResetAt = r.GetPausedAt(), r.GetResetAt()
	s.LagSeconds = repjob.Lag(r, time.Now()).Seconds()
	if withHistory {
		s.History = r.GetHistory().GetEvents()
		s.WriteFailures = WriteFailures(r.GetStats())
	}
	return s
}

// WriteFailures are the documents the job's target refused, newest last,
// as the admin API shows them (texts redacted).
func WriteFailures(st *messages.ReplicationStats) []*messages.JobWriteFailure {
	fs := st.GetWriteFailures()
	if len(fs) == 0 {
		return nil
	}
	out := make([]*messages.JobWriteFailure, len(fs))
	for i, f := range fs {
		out[i] = &messages.JobWriteFailure{Id: f.GetId(), Rev: f.GetRev(), Status: f.GetStatus(),
			Error: redact.Text(f.GetError()), Reason: redact.Text(f.GetReason()), At: f.GetAt()}
	}
	return out
}

func jobStats(st *messages.ReplicationStats) *messages.JobStats {
	out := &messages.JobStats{ChangesPending: -1}
	if st == nil {
		return out
	}
	out.DocsRead = uint64(max(st.GetDocsRead(), 0))
	out.DocsWritten = uint64(max(st.GetDocsWritten(), 0))
	out.DocWriteFailures = uint64(max(st.GetDocWriteFailures(), 0))
	out.MissingRevisionsFound = uint64(max(st.GetMissingRevisionsFound(), 0))
	out.RevisionsChecked = uint64(max(st.GetRevisionsChecked(), 0))
	if st.ChangesPending != nil {
		out.ChangesPending = st.GetChangesPending()
	}
	out.SourceSeq = st.GetSourceSeq()
	out.CheckpointedSourceSeq = st.GetCheckpointedSourceSeq()
	out.ThroughSeq = st.GetThroughSeq()
	out.StartFrom, out.StartSeq = st.GetStartFrom(), st.GetStartSeq()
	return out
}
