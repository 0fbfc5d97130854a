package repjob

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// What an operator sees of a job beyond CouchDB's counters: the documents
// its target refused, its lag, and whether it is paused or reset.
//
// The refused documents live in the job's record (stats.write_failures),
// not beside it: every view reads the record already (one lifecycle: the
// list goes where the job goes, removed with it, taken over with it), and
// it is small by construction — at most MaxWriteFailures entries and
// maxFailureBytes in all (a record is one value of the store, at most
// 100 KB on FoundationDB), ids and reasons cut at maxFailureField bytes.

// Bounds of the write failures a record keeps.
const (
	MaxWriteFailures = replicate.MaxWriteFailures
	maxFailureBytes  = 32 << 10
	maxFailureField  = 512
)

// PausedUntil is the scheduled time of a paused job in the queue: pending,
// never due (jobqueue keys times by Unix nanoseconds: before 2262).
var PausedUntil = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// Sentinel errors of job control.
var (
	// ErrPaused: the job is paused (resume it first).
	ErrPaused = errors.New("repjob: job paused")
	// ErrFinished: the job completed or failed; there is nothing to pause.
	ErrFinished = errors.New("repjob: job finished")
)

// cut shortens s to at most n bytes (on a rune boundary), marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n - len("…")
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// failuresProto converts a run's write failures to the stored form.
func failuresProto(fs []replicate.WriteFailure) []*messages.DocWriteFailure {
	if len(fs) == 0 {
		return nil
	}
	out := make([]*messages.DocWriteFailure, len(fs))
	for i, f := range fs {
		out[i] = &messages.DocWriteFailure{Id: cut(f.ID, maxFailureField), Rev: cut(f.Rev, maxFailureField),
			Status: int32(f.Status), Error: cut(f.Error, maxFailureField), Reason: cut(f.Reason, maxFailureField), At: ts(f.At)}
	}
	return out
}

// MergeWriteFailures returns the write failures of old and new together,
// each once, oldest first, the newest MaxWriteFailures of them within
// maxFailureBytes. A run reports all of its failures every time, so a
// record merges the same ones again and again: merging is idempotent.
func MergeWriteFailures(old, new []*messages.DocWriteFailure) []*messages.DocWriteFailure {
	if len(new) == 0 {
		return old
	}
	type key struct {
		id, rev, err string
		at           int64
	}
	seen := make(map[key]bool, len(old)+len(new))
	all := make([]*messages.DocWriteFailure, 0, len(old)+len(new))
	for _, f := range slices.Concat(old, new) {
		k := key{f.GetId(), f.GetRev(), f.GetError(), f.GetAt().AsTime().UnixNano()}
		if !seen[k] {
			seen[k] = true
			all = append(all, f)
		}
	}
	slices.SortStableFunc(all, func(a, b *messages.DocWriteFailure) int {
		return a.GetAt().AsTime().Compare(b.GetAt().AsTime())
	})
	if len(all) > MaxWriteFailures {
		all = all[len(all)-MaxWriteFailures:]
	}
	size, i := 0, len(all)
	for i > 0 {
		size += proto.Size(all[i-1])
		if size > maxFailureBytes {
			break
		}
		i--
	}
	return all[i:]
}

// withRunStats sets the record's stats to a run's st: its write failures
// merged into the record's, and behind_since carried or set (Lag).
func withRunStats(m *messages.ReplicationJob, st replicate.Stats, now time.Time) {
	old := m.GetStats()
	next := StatsProto(st)
	next.WriteFailures = MergeWriteFailures(old.GetWriteFailures(), next.WriteFailures)
	next.BehindSince = behindSince(old, next, now)
	m.Stats = next
	if m.ResetAt != nil && st.StartFrom == replicate.StartReset && next.GetCheckpointedSourceSeq() != next.GetStartSeq() {
		m.ResetAt = nil // the reset run's first checkpoint: a restart goes on from it
	}
}

// behindSince is when the job, as next shows it, last made progress with
// changes pending: nil when none are pending (or unknown); else the time of
// the last advance of its checkpointed sequence, or when changes were first
// seen pending after none, whichever is later. The run's own report
// (next.behind_since, from the engine: when it saw them) is taken unless
// the record already knew the job behind at the same checkpoint (an earlier
// run saw it first); now when the run reported none.
func behindSince(old, next *messages.ReplicationStats, now time.Time) *timestamppb.Timestamp {
	if next.ChangesPending == nil || next.GetChangesPending() <= 0 {
		return nil
	}
	if old.GetBehindSince() != nil && old.GetChangesPending() > 0 &&
		old.GetCheckpointedSourceSeq() == next.GetCheckpointedSourceSeq() &&
		(next.GetBehindSince() == nil || old.GetBehindSince().AsTime().Before(next.GetBehindSince().AsTime())) {
		return old.GetBehindSince()
	}
	if next.GetBehindSince() != nil {
		return next.GetBehindSince()
	}
	return ts(now)
}

// OverlayStats is what views show of a running job: its live stats (from
// its node's progress events) with the record's write failures of earlier
// runs and its behind_since.
func OverlayStats(stored, live *messages.ReplicationStats) *messages.ReplicationStats {
	if live == nil {
		return stored
	}
	c := proto.Clone(live).(*messages.ReplicationStats)
	c.WriteFailures = MergeWriteFailures(stored.GetWriteFailures(), live.GetWriteFailures())
	c.BehindSince = behindSince(stored, live, time.Now())
	return c
}

// Lag is how long the job has made no progress while changes are pending
// (couchrep_replication_lag_seconds): now minus behind_since, 0 when caught
// up, unknown, paused or finished. See docs/operations.md.
func Lag(r *Record, now time.Time) time.Duration {
	if r == nil || r.GetPausedAt() != nil || r.State().Terminal() {
		return 0
	}
	b := r.GetStats().GetBehindSince()
	if b == nil || r.GetStats().GetChangesPending() <= 0 {
		return 0
	}
	return max(now.Sub(b.AsTime()), 0)
}

// Pause pauses job jobID: it stays pending in the queue, never due, until
// Resume, whichever node restarts or takes over (the state is the
// record's paused_at). A running job is stopped by its node (the request
// is returned, for WaitControl: its run records the pause as it ends,
// Run.Pause); a pending or crashing one is paused in this transaction.
// Pausing a paused job does nothing; a completed or failed one fails with
// ErrFinished.
func (s *Store) Pause(ctx context.Context, jobID, by string) (*messages.JobControl, error) {
	return s.operate(ctx, "pause", jobID, messages.JobControl_ACTION_PAUSE, by,
		func(m *messages.ReplicationJob, info *jobqueue.JobInfo, now time.Time) (jobqueue.ResubmitOptions, bool, error) {
			if m.PausedAt != nil {
				return jobqueue.ResubmitOptions{}, false, nil
			}
			if info.State == jobqueue.StateFinished {
				return jobqueue.ResubmitOptions{}, false, fmt.Errorf("%w: %s", ErrFinished, State(m.GetState()))
			}
			s.markStopped(m, now)
			m.PausedAt = ts(now)
			return jobqueue.ResubmitOptions{ScheduledAt: PausedUntil}, true, nil
		})
}

// Resume makes paused job jobID due now (a job not paused is left alone).
func (s *Store) Resume(ctx context.Context, jobID string) error {
	_, err := s.operate(ctx, "resume", jobID, messages.JobControl_ACTION_UNSPECIFIED, "",
		func(m *messages.ReplicationJob, info *jobqueue.JobInfo, now time.Time) (jobqueue.ResubmitOptions, bool, error) {
			if m.PausedAt == nil {
				return jobqueue.ResubmitOptions{}, false, nil
			}
			m.PausedAt = nil
			return jobqueue.ResubmitOptions{}, true, nil
		})
	return err
}

// Reset makes job jobID's next run start from sequence 0 (or its
// since_seq), whatever its checkpoints say; they are kept, and the run's
// checkpoints add to their history. A running job is stopped by its node
// and runs again now (Run.Reset; the request is returned, for
// WaitControl); any other is due now (a paused one stays paused, reset for
// when it resumes).
func (s *Store) Reset(ctx context.Context, jobID, by string) (*messages.JobControl, error) {
	return s.operate(ctx, "reset", jobID, messages.JobControl_ACTION_RESET, by,
		func(m *messages.ReplicationJob, info *jobqueue.JobInfo, now time.Time) (jobqueue.ResubmitOptions, bool, error) {
			m.ResetAt = ts(now)
			m.State = StatePending.Proto()
			m.FinishedAt = nil
			var opts jobqueue.ResubmitOptions
			if m.PausedAt != nil {
				opts.ScheduledAt = PausedUntil
			}
			return opts, true, nil
		})
}

// markStopped records that the job stopped (history "stopped", state
// pending), as CouchDB shows a job its scheduler stopped.
func (s *Store) markStopped(m *messages.ReplicationJob, now time.Time) {
	m.History = schedpolicy.HistoryFromProto(m.History).Append(
		schedpolicy.Event{Type: schedpolicy.EventStopped, At: now}, s.Policy().MaxHistory).Proto()
	m.State = StatePending.Proto()
}

// operate changes a job that does not run with fn in one transaction (the
// job resubmitted with fn's options when fn says so), or, for a running
// job and a control action, asks its node to carry it out and returns the
// request.
func (s *Store) operate(ctx context.Context, what, jobID string, action messages.JobControl_Action, by string,
	fn func(m *messages.ReplicationJob, info *jobqueue.JobInfo, now time.Time) (jobqueue.ResubmitOptions, bool, error)) (*messages.JobControl, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var c *messages.JobControl
	err := s.db.Transact(ctx, func(tx kv.Tx) error {
		c = nil
		info, err := s.q.GetTx(tx, JobType, jobID)
		if err != nil {
			return err
		}
		rec, err := recordFromInfo(info)
		if err != nil {
			return err
		}
		if info.State == jobqueue.StateRunning && action != messages.JobControl_ACTION_UNSPECIFIED {
			c, err = s.addControl(tx, info, action, by)
			return err
		}
		m := proto.Clone(rec.ReplicationJob).(*messages.ReplicationJob)
		now := s.now()
		opts, write, err := fn(m, info, now)
		if err != nil || !write {
			return err
		}
		m.LastUpdated = ts(now)
		if opts.ScheduledAt.IsZero() || info.State == jobqueue.StateFinished {
			prio, err := s.ledger(tx).enqueue(m.ShareKey, now)
			if err != nil {
				return err
			}
			opts.Priority, opts.SetPriority = prio, true
		}
		data, err := marshal(m)
		if err != nil {
			return err
		}
		opts.Data = data
		if err := s.q.ResubmitTx(tx, JobType, jobID, opts); err != nil {
			return err
		}
		return s.noteChange(tx, jobID, &Record{ReplicationJob: m, QueueState: jobqueue.StatePending})
	})
	if err != nil {
		return nil, wrapNotFound(what, jobID, err)
	}
	return c, nil
}

// Pause ends the run on an operator's pause (ACTION_PAUSE): the job goes
// back to the queue pending, never due, its record paused, "stopped" in
// its history, until Store.Resume.
func (r *Run) Pause(ctx context.Context) error {
	return r.resubmit(ctx, "pause", false, func(m *messages.ReplicationJob, now time.Time) time.Time {
		r.s.markStopped(m, now)
		m.PausedAt = ts(now)
		return PausedUntil
	})
}

// Reset ends the run on an operator's reset (ACTION_RESET): the job goes
// back to the queue due now, its next run from sequence 0.
func (r *Run) Reset(ctx context.Context) error {
	return r.resubmit(ctx, "reset", false, func(m *messages.ReplicationJob, now time.Time) time.Time {
		r.s.markStopped(m, now)
		m.ResetAt = ts(now)
		return time.Time{}
	})
}

// Paused reports whether the record says the job is paused.
func (r *Record) Paused() bool { return r != nil && r.GetPausedAt() != nil }
