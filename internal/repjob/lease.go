package repjob

import (
	"context"
	"errors"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/pause"
)

// KeepLease holds this process's lease on replication jobs until ctx ends:
// jobs the store accepts from then on are held under it, and one renewal
// every third of the activity timeout proves them all alive, however many
// there are (an idle job writes nothing to the store). When the lease is
// lost (the process was silent for a whole timeout and the activity
// monitor re-enqueued its jobs) the jobs under it hear of it through
// Run.Watch, and a new lease is opened for the jobs accepted next. When
// ctx ends the lease is closed: removed if it holds no job any more (stop
// the jobs first), else left to expire.
func (s *Store) KeepLease(ctx context.Context) {
	every := s.ActivityTimeout() / 3
	var l *jobqueue.Lease
	defer func() {
		s.lease.Store(nil)
		if l != nil {
			c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if err := l.Close(c); err != nil {
				s.log.Warn().Err(err).Msg("repjob: closing the lease")
			}
			cancel()
		}
	}()
	// A round is due a third of the timeout (every) after the previous
	// one began, and at once after the lease was lost.
	for due := time.Now(); pause.For(ctx, time.Until(due)) == nil; {
		due = time.Now().Add(every)
		if l == nil {
			if err := s.Init(ctx); err != nil {
				s.log.Warn().Err(err).Msg("repjob: opening a lease")
				continue
			}
			nl, err := s.q.OpenLease(ctx, JobType)
			if err != nil {
				s.log.Warn().Err(err).Msg("repjob: opening a lease")
				continue
			}
			l = nl
			s.lease.Store(l)
			continue
		}
		err := l.Renew(ctx)
		switch {
		case errors.Is(err, jobqueue.ErrLeaseLost):
			s.log.Warn().Str("lease", l.ID()).Msg("repjob: lease lost (silent for an activity timeout): its jobs stop; opening another")
			s.lease.Store(nil)
			l = nil
			due = time.Now()
		case err != nil && ctx.Err() == nil:
			s.log.Warn().Err(err).Msg("repjob: renewing the lease")
		}
	}
}

// Watch registers the run's callbacks when it is held under the store's
// lease (see KeepLease and jobs.Job.Watch): onKick when a user canceled or
// removed the job, onLost when the lease was lost. leased is false for a
// run accepted without a lease, which must record progress at least twice
// per activity timeout instead.
func (r *Run) Watch(onKick, onLost func()) (stop func(), leased bool) {
	return r.j.Watch(onKick, onLost)
}

// Abandon gives up the run without ending it in the store (a final write
// failed): see jobs.Job.Abandon.
func (r *Run) Abandon() { r.j.Abandon() }
