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
// the jobs first), else left to expire. While it runs, a waiting Accept
// takes jobs only under an open lease: it waits for the first one, and for
// the next after a loss.
func (s *Store) KeepLease(ctx context.Context) {
	every := s.ActivityTimeout() / 3
	var l *jobqueue.Lease
	s.leaseMu.Lock()
	s.leasing = true
	s.leaseMu.Unlock()
	defer func() {
		s.leaseMu.Lock()
		s.leasing = false
		s.leaseMu.Unlock()
		s.setLease(nil)
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
	for due := time.Now(); s.waitRound(ctx, due); {
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
			s.setLease(l)
			continue
		}
		err := l.Renew(ctx)
		switch {
		case errors.Is(err, jobqueue.ErrLeaseLost):
			s.log.Warn().Str("lease", l.ID()).Msg("repjob: lease lost (silent for an activity timeout): its jobs stop; opening another")
			s.setLease(nil)
			l = nil
			due = time.Now()
		case err != nil && ctx.Err() == nil:
			s.log.Warn().Err(err).Msg("repjob: renewing the lease")
		}
	}
}

// GoKeepLease runs KeepLease in a goroutine of its own and returns a
// channel closed when it has returned. Unlike go KeepLease(ctx), waiting
// Accepts wait for the lease from the moment GoKeepLease returns, however
// late the goroutine starts: start it before the accept loop.
func (s *Store) GoKeepLease(ctx context.Context) (done <-chan struct{}) {
	s.leaseMu.Lock()
	s.leasing = true
	s.leaseMu.Unlock()
	ch := make(chan struct{})
	go func() { defer close(ch); s.KeepLease(ctx) }()
	return ch
}

// waitRound waits until due, or until an Accept found the lease lost
// (leaseLost); it returns false once ctx ended.
func (s *Store) waitRound(ctx context.Context, due time.Time) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.leaseMu.Lock()
	if s.kicked {
		s.kicked = false
		cancel()
	}
	s.leaseKick = cancel
	s.leaseMu.Unlock()
	_ = pause.For(wctx, time.Until(due))
	s.leaseMu.Lock()
	s.leaseKick = nil
	s.kicked = false
	s.leaseMu.Unlock()
	return ctx.Err() == nil
}

// leaseLost is an Accept's report that lease l was found lost (expired by
// the activity monitor): later Accepts wait for the next lease, and
// KeepLease renews (finds it lost, opens another) at once rather than at
// its next round.
func (s *Store) leaseLost(l *jobqueue.Lease) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	if s.lease.Load() == l {
		s.lease.Store(nil)
	}
	if s.leaseKick != nil {
		s.leaseKick()
	} else {
		s.kicked = true
	}
}

// setLease publishes the lease jobs are accepted under (nil: none is open)
// and wakes the Accepts waiting for one; when KeepLease has ended it wakes
// them all (they accept without a lease).
func (s *Store) setLease(l *jobqueue.Lease) {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	s.lease.Store(l)
	if (l != nil || !s.leasing) && s.leaseOpen != nil {
		close(s.leaseOpen)
		s.leaseOpen = nil
	}
}

// acceptLease returns the lease to accept a job under. While KeepLease runs
// but holds no open lease (it is opening the first one, or a new one after
// the last was lost), a waiting Accept (wait) waits for it: a job accepted
// without the lease would have to prove itself alive on its own, a store
// write per job every third of the activity timeout for as long as it
// runs, even idle. Without wait, or without KeepLease, it returns the lease
// open now, if any.
func (s *Store) acceptLease(ctx context.Context, wait bool) (*jobqueue.Lease, error) {
	for {
		s.leaseMu.Lock()
		l := s.lease.Load()
		if l != nil || !s.leasing || !wait {
			s.leaseMu.Unlock()
			return l, nil
		}
		if s.leaseOpen == nil {
			s.leaseOpen = make(chan struct{})
		}
		ch := s.leaseOpen
		s.leaseMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
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
