package repjob

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
)

// Run is a replication job accepted by this node: the worker's handle on
// it. Its methods check the worker lock: an error wrapping
// jobs.ErrWorkerConflict means another node (or the activity monitor) took
// the job, jobs.ErrCanceled that a user removed or canceled it; either way
// the worker must stop at once and write nothing more. Finishing methods
// (Complete, Fail, Crash, Stop) end the run. A Run is safe for concurrent
// use.
type Run struct {
	s  *Store
	mu sync.Mutex
	j  *jobqueue.Job
	m  *messages.ReplicationJob
	// started: Start recorded this run (guarded by mu).
	started bool
}

// Accept takes the next due replication job from the queue (lowest
// fair-share deadline first), waiting for one if wait is set. Without wait
// it returns an error wrapping jobs.ErrNotFound when nothing is due. Call
// Start next.
func (s *Store) Accept(ctx context.Context, wait bool) (*Run, error) {
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var j *jobqueue.Job
	for {
		lease, err := s.acceptLease(ctx, wait)
		if err != nil {
			return nil, fmt.Errorf("repjob: accept: %w", err)
		}
		j, err = s.q.Accept(ctx, JobType, jobqueue.AcceptOptions{Wait: wait, Lease: lease})
		if errors.Is(err, jobqueue.ErrLeaseLost) && lease != nil && wait {
			// The activity monitor expired the lease (this process was
			// silent for a whole timeout): wait for the next one
			// rather than fail, and have KeepLease open it now.
			s.leaseLost(lease)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("repjob: accept: %w", err)
		}
		break
	}
	r, err := recordFromInfo(j.Info())
	if err != nil {
		// A record we cannot read can never run: finish it as failed so
		// that it does not come back forever.
		if ferr := j.Finish(ctx, nil); ferr != nil {
			s.log.Warn().Err(ferr).Str("job_id", j.ID()).Msg("repjob: finish undecodable job")
		}
		return nil, err
	}
	return &Run{s: s, j: j, m: r.ReplicationJob}, nil
}

// AcceptMany is Accept for up to n jobs in one store transaction
// (jobqueue.Queue.AcceptMany): what an accept loop with many free slots
// uses when many jobs are pending at once (a node's start, or a dead
// node's jobs back in the queue). With wait it waits for at least one.
// share, if not nil, bounds the batch to the node's share of the pending
// jobs (jobqueue.AcceptOptions.Share; none: jobqueue.ErrOverShare).
// Call Start on each.
func (s *Store) AcceptMany(ctx context.Context, wait bool, n int, share func(pending int) int) ([]*Run, error) {
	if n < 2 {
		r, err := s.Accept(ctx, wait)
		if err != nil {
			return nil, err
		}
		return []*Run{r}, nil
	}
	if err := s.Init(ctx); err != nil {
		return nil, err
	}
	var jobs []*jobqueue.Job
	for {
		lease, err := s.acceptLease(ctx, wait)
		if err != nil {
			return nil, fmt.Errorf("repjob: accept: %w", err)
		}
		jobs, err = s.q.AcceptMany(ctx, JobType, n, jobqueue.AcceptOptions{Wait: wait, Lease: lease, Share: share})
		if errors.Is(err, jobqueue.ErrLeaseLost) && lease != nil && wait {
			s.leaseLost(lease) // as Accept does
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("repjob: accept: %w", err)
		}
		break
	}
	runs := make([]*Run, 0, len(jobs))
	for _, j := range jobs {
		r, err := recordFromInfo(j.Info())
		if err != nil {
			// A record we cannot read can never run (as Accept does).
			if ferr := j.Finish(ctx, nil); ferr != nil {
				s.log.Warn().Err(ferr).Str("job_id", j.ID()).Msg("repjob: finish undecodable job")
			}
			s.log.Warn().Err(err).Str("job_id", j.ID()).Msg("repjob: accepted an undecodable job; finished it")
			continue
		}
		runs = append(runs, &Run{s: s, j: j, m: r.ReplicationJob})
	}
	return runs, nil
}

// ID returns the job id.
func (r *Run) ID() string { return r.j.ID() }

// Record returns a copy of the job as this worker last wrote or read it
// (after Hibernate, only its id until Load or a write).
func (r *Run) Record() *messages.ReplicationJob {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		return &messages.ReplicationJob{JobId: r.j.ID()}
	}
	return proto.Clone(r.m).(*messages.ReplicationJob)
}

// Hibernate drops the run's copy of the record and the queue's copy of its
// data: a parked job whose actor went away keeps its worker lock and its
// place under the node's lease, a few hundred bytes. The next write reads
// the record back in its transaction; Load reads it back now.
func (r *Run) Hibernate() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m = nil
	r.j.DropData()
}

// Load reads the record back from the store after Hibernate (nothing to
// do if the run has it). It does not check the worker lock: the run's next
// write does (a lost job is an error IsLost reports then).
func (r *Run) Load(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil {
		return nil
	}
	var m *messages.ReplicationJob
	err := r.s.db.ReadTransact(ctx, func(tx kv.ReadTx) error {
		var err error
		m, err = r.load(tx)
		return err
	})
	if err != nil {
		return fmt.Errorf("repjob: load job %q: %w", r.j.ID(), err)
	}
	r.m = m
	return nil
}

// load reads the run's record in tx.
func (r *Run) load(tx kv.ReadTx) (*messages.ReplicationJob, error) {
	info, err := r.s.q.GetTx(tx, JobType, r.j.ID())
	if err != nil {
		return nil, err
	}
	rec, err := recordFromInfo(info)
	if err != nil {
		return nil, err
	}
	return rec.ReplicationJob, nil
}

// Priority is the fair-share deadline the job was accepted with.
func (r *Run) Priority() uint64 { return r.j.Info().Priority }

// write runs fn on a copy of the record and stores it with op (the jobs
// worker call) in one transaction together with fn's ledger writes; on
// success the copy becomes the run's record.
func (r *Run) write(ctx context.Context, what string, change bool,
	fn func(m *messages.ReplicationJob, l ledger, now time.Time) error,
	op func(tx kv.Tx, data []byte) error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var next *messages.ReplicationJob
	cur := r.m
	err := r.s.db.Transact(ctx, func(tx kv.Tx) error {
		if r.m == nil {
			// Hibernated: the record comes back from the store.
			m, err := r.load(tx)
			if err != nil {
				return err
			}
			cur = m
		}
		next = proto.Clone(cur).(*messages.ReplicationJob)
		now := r.s.now()
		next.LastUpdated = ts(now)
		if err := fn(next, r.s.ledger(tx), now); err != nil {
			return err
		}
		data, err := marshal(next)
		if err != nil {
			return err
		}
		if err := op(tx, data); err != nil {
			return err
		}
		// The queue record is stamped at commit: the listing gets the job
		// as written.
		known := &Record{ReplicationJob: next, QueueState: r.j.Info().State}
		switch {
		case change:
			return r.s.noteChange(tx, r.j.ID(), known)
		case next.GetRepId() != cur.GetRepId(): // the id _scheduler/jobs sorts by
			return r.s.relist(tx, r.j.ID(), known)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("repjob: %s job %q: %w", what, r.j.ID(), err)
	}
	r.m = next
	return nil
}

// Start records that node started the job: state running, history
// "started", and the shared fair-share frontier raised to the job's
// priority.
func (r *Run) Start(ctx context.Context, node string) error {
	return r.start(ctx, node, false)
}

// StartParked is Start for a job whose record says it is parked (a node
// adopting it, or the one restarting, goes straight to sleep): the record
// keeps its parked_since, so every view still shows it parked.
func (r *Run) StartParked(ctx context.Context, node string) error {
	return r.start(ctx, node, true)
}

func (r *Run) start(ctx context.Context, node string, parked bool) error {
	prio := r.j.Info().Priority
	err := r.write(ctx, "start", true, func(m *messages.ReplicationJob, l ledger, now time.Time) error {
		m.State = StateRunning.Proto()
		m.Node = node
		m.LastStarted = ts(now)
		if !parked {
			m.ParkedSince = nil
		}
		h := schedpolicy.HistoryFromProto(m.History).Append(schedpolicy.Event{Type: schedpolicy.EventStarted, At: now},
			r.s.Policy().MaxHistory)
		m.History = h.Proto()
		return l.accepted(prio)
	}, r.j.UpdateTx)
	if err == nil {
		r.mu.Lock()
		r.started = true
		r.mu.Unlock()
	}
	return err
}

// ranFrom is when this run started, for its share account: its Start, or
// now if it never started (a stop during startup_jitter), which refunds
// the quantum reserved when it was enqueued and charges nothing more,
// rather than the time since an earlier run's start (or the epoch). r.mu is
// held.
func (r *Run) ranFrom(m *messages.ReplicationJob, now time.Time) time.Time {
	if !r.started {
		return now
	}
	return m.GetLastStarted().AsTime()
}

// ClaimRepID records the replication id the job computed as it started
// (base+ext; filterCode is the named filter's code it was computed with).
// If another pending or running job owns the id it returns a *Duplicate
// (wrapping ErrDuplicate) and changes nothing; an owner that finished or
// vanished is usurped. changed reports that the job had a different id
// before (its filter changed on the source).
func (r *Run) ClaimRepID(ctx context.Context, base, ext, filterCode string) (changed bool, err error) {
	repID := base + ext
	var dup *Duplicate
	err = r.write(ctx, "claim replication id for", false, func(m *messages.ReplicationJob, l ledger, now time.Time) error {
		dup, changed = nil, false
		tx := l.tx
		owner, err := r.s.claimIfFree(tx, repID, r.j.ID())
		if err != nil {
			return err
		}
		if owner != "" {
			info, err := r.s.q.GetTx(tx, JobType, owner)
			if err != nil {
				return err
			}
			o, err := recordFromInfo(info)
			if err != nil {
				return err
			}
			dup = &Duplicate{RepID: repID, OwnerJobID: owner, OwnerKind: o.Kind}
			return nil
		}
		if m.RepId != "" && m.RepId != repID {
			changed = true
			if err := r.s.releaseRepID(tx, m.RepId, r.j.ID()); err != nil {
				return err
			}
		}
		m.RepId, m.BaseId, m.FilterCode = repID, base, filterCode
		return nil
	}, func(tx kv.Tx, data []byte) error {
		if dup != nil {
			return r.j.UpdateTx(tx, nil)
		}
		return r.j.UpdateTx(tx, data)
	})
	if err != nil {
		return false, err
	}
	if dup != nil {
		return false, dup
	}
	return changed, nil
}

// Progress records the job's stats; it also proves the worker alive to the
// activity monitor. Call it at every checkpoint, and at least twice per
// activity timeout unless the run is held under a lease (Watch).
func (r *Run) Progress(ctx context.Context, st replicate.Stats) error {
	return r.write(ctx, "update", false, func(m *messages.ReplicationJob, _ ledger, now time.Time) error {
		withRunStats(m, st, now)
		return nil
	}, r.j.UpdateTx)
}

// Park records that the running job parked at since (a zero time: it
// resumed), with its stats then. The job stays running; the views show it
// parked until it resumes or its run ends.
func (r *Run) Park(ctx context.Context, since time.Time, st replicate.Stats) error {
	return r.write(ctx, "park", false, func(m *messages.ReplicationJob, _ ledger, now time.Time) error {
		m.ParkedSince = nil
		if !since.IsZero() {
			m.ParkedSince = ts(since)
			withRunStats(m, st, now)
		}
		return nil
	}, r.j.UpdateTx)
}

// Complete finishes a one-shot job that replicated everything: state
// completed, with its final stats and CouchDB's POST /_replicate reply.
func (r *Run) Complete(ctx context.Context, res replicate.Result) error {
	return r.finish(ctx, "complete", StateCompleted, "", func(m *messages.ReplicationJob) {
		withRunStats(m, res.Stats, r.s.now())
		m.ResetAt = nil
		m.Result = append([]byte(nil), res.Body...)
		m.ErrorCount = 0
	})
}

// Fail finishes the job for good as failed with reason (invalid parameters,
// a filter that does not exist, a duplicate of a persistent job).
func (r *Run) Fail(ctx context.Context, reason string) error {
	return r.finish(ctx, "fail", StateFailed, reason, nil)
}

func (r *Run) finish(ctx context.Context, what string, st State, reason string,
	extra func(*messages.ReplicationJob)) error {
	return r.write(ctx, what, true, func(m *messages.ReplicationJob, l ledger, now time.Time) error {
		m.State = st.Proto()
		m.LastError = reason
		m.FinishedAt = ts(now)
		m.ParkedSince = nil
		if extra != nil {
			extra(m)
		}
		if m.Kind == messages.ReplicationKind_REPLICATION_KIND_TRANSIENT {
			l.tx.Set(r.s.k.expireKey(now, r.j.ID()), nil)
		}
		return l.chargeRun(m.ShareKey, r.ranFrom(m, now), now)
	}, r.j.FinishTx)
}

// Crash ends the run after a failure that may heal: the job goes back to
// the queue as crashing, with "crashed" in its history, due after the
// backoff of its consecutive crashes (min(min_backoff·2^(n-1),
// max_backoff), reset by a run longer than health_threshold). It returns
// when the job may run again.
func (r *Run) Crash(ctx context.Context, reason string) (time.Time, error) {
	var until time.Time
	err := r.resubmit(ctx, "crash", false, func(m *messages.ReplicationJob, now time.Time) time.Time {
		p := r.s.Policy()
		h := schedpolicy.HistoryFromProto(m.History).Append(
			schedpolicy.Event{Type: schedpolicy.EventCrashed, At: now, Reason: reason}, p.MaxHistory)
		m.History = h.Proto()
		m.State = StateCrashing.Proto()
		m.LastError = reason
		m.ErrorCount = int32(h.ConsecutiveCrashes(p.HealthThreshold))
		until = h.BackoffUntil(p)
		return until
	})
	return until, err
}

// Stop ends the run cleanly (rotation, excess jobs, shutdown, a changed
// replication id): the job goes back to the queue as pending, due now, with
// a fresh fair-share deadline and "stopped" in its history.
func (r *Run) Stop(ctx context.Context) error {
	return r.stop(ctx, false)
}

// StopParked is Stop for a parked job handed back by a shutdown or a drain:
// its record keeps parked_since (the views show it pending, as any job in
// the queue), so that the node taking it next starts it parked
// (StartParked) without reading its source.
func (r *Run) StopParked(ctx context.Context) error {
	return r.stop(ctx, true)
}

// Check writes nothing but proves the worker still holds the job: an error
// IsLost reports if a user canceled or removed it, or another worker took
// it.
func (r *Run) Check(ctx context.Context) error {
	return r.write(ctx, "check", false, func(*messages.ReplicationJob, ledger, time.Time) error { return nil }, r.j.UpdateTx)
}

func (r *Run) stop(ctx context.Context, parked bool) error {
	return r.resubmit(ctx, "stop", parked, func(m *messages.ReplicationJob, now time.Time) time.Time {
		h := schedpolicy.HistoryFromProto(m.History).Append(
			schedpolicy.Event{Type: schedpolicy.EventStopped, At: now}, r.s.Policy().MaxHistory)
		m.History = h.Proto()
		m.State = StatePending.Proto()
		return time.Time{}
	})
}

func (r *Run) resubmit(ctx context.Context, what string, parked bool, fn func(m *messages.ReplicationJob, now time.Time) time.Time) error {
	var opts jobqueue.ResubmitOptions
	return r.write(ctx, what, true, func(m *messages.ReplicationJob, l ledger, now time.Time) error {
		opts = jobqueue.ResubmitOptions{ScheduledAt: fn(m, now), SetPriority: true}
		if !parked {
			m.ParkedSince = nil
		}
		if err := l.chargeRun(m.ShareKey, r.ranFrom(m, now), now); err != nil {
			return err
		}
		prio, err := l.enqueue(m.ShareKey, now)
		opts.Priority = prio
		return err
	}, func(tx kv.Tx, data []byte) error { return r.j.ResubmitTx(tx, data, opts) })
}

// IsLost reports whether err means the worker lost the job (another worker
// took it, or a user removed or canceled it): stop at once, write nothing.
func IsLost(err error) bool {
	return errors.Is(err, jobqueue.ErrWorkerConflict) || errors.Is(err, jobqueue.ErrCanceled) || errors.Is(err, jobqueue.ErrNotFound)
}
