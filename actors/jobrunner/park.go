package jobrunner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
)

// parker is a job's parking (internal/park): the wake-up source its
// parked runs wait on, opened when the job starts and held until it ends,
// and the wait itself. A continuous job whose engine run parked
// (replicate.Result.Parked) stays running: one goroutine waits for a
// signal of its Wake or its recheck timer (park_recheck, jittered, paced
// node-wide by Options.Rechecks), asks the source whether it really moved
// (replicate.Parked.Moved), and starts a new engine run from the
// checkpoint when it did. A stop request, a drain or a shutdown cancels
// the job's context, which ends the wait as it ends a run.
type parker struct {
	a    *jobActor
	p    replicate.Params
	o    replicate.Options
	log  zerolog.Logger
	open func(ctx context.Context, p replicate.Params, o replicate.Options) (park.Wake, error)

	mu   sync.Mutex
	wake park.Wake // nil until opened
	// fresh: wake was opened since the job last parked (a change between
	// the feed's close and the watch's start would not signal it).
	fresh bool
	// off: the job's source cannot wake it (unsupported): it no longer
	// parks, and keeps its feed.
	off bool
}

// parking returns the job's parker, or nil when the job never parks: not
// continuous, no checkpoints, idle_park_after 0, or no wake-up source on
// this node. A filtered job (doc_ids, a selector) that shares its source's
// feed waits on a watch on that feed (replicate.WatchFeed); a whole-database
// job on its server's _db_updates. The wake-up source is opened now, so that the job knows
// whether it can park before its first run (a server whose _db_updates
// cannot be read keeps its jobs' feeds).
func (a *jobActor) parking(ctx context.Context, p replicate.Params, o replicate.Options) *parker {
	if !p.Continuous || !p.UseCheckpoints || p.IdleParkAfter <= 0 {
		return nil
	}
	pk := &parker{a: a, p: p, o: o, log: a.log, open: a.o.Wake}
	if pk.open == nil && o.Feeds != nil && replicate.ParksOnSharedFeed(p) {
		// A filtered job (doc_ids, a selector the node evaluates) parks on
		// a watch on its shared feed: thousands of fan-out jobs of one
		// source hold one feed and no engine.
		pk.open = func(ctx context.Context, p replicate.Params, o replicate.Options) (park.Wake, error) {
			w, err := replicate.WatchFeed(ctx, p, o)
			if errors.Is(err, replicate.ErrNoSharedFeed) {
				return nil, nil // a feed of its own: it does not park
			}
			if err != nil {
				return nil, err // a nil *FeedWake must not become a non-nil Wake
			}
			return w, nil
		}
	}
	if pk.open == nil {
		if a.o.DBUpdates == nil || !replicate.ParksOnDBUpdates(p) {
			return nil
		}
		hub := a.o.DBUpdates
		pk.open = func(ctx context.Context, p replicate.Params, o replicate.Options) (park.Wake, error) {
			srv, db, err := replicate.DBUpdatesServer(p, o)
			if err != nil {
				return nil, err
			}
			w, err := hub.Watch(ctx, srv, db)
			if err != nil {
				return nil, err // a nil *Watch must not become a non-nil Wake
			}
			return w, nil
		}
	}
	pk.ensure(ctx)
	return pk
}

// wakeOpenTimeout bounds the opening of a wake-up source (the first
// watch of a server waits for its _db_updates probe).
const wakeOpenTimeout = 30 * time.Second

// ensure opens the wake-up source if it is not open, and reports whether
// the job can park now. A source that cannot work (dbupdates.ErrUnsupported,
// or no source for this job) turns parking off for the rest of the job's
// run; another failure (the server unreachable) is tried again at the next
// park.
func (pk *parker) ensure(ctx context.Context) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.off {
		return false
	}
	if pk.wake != nil {
		if err := park.Err(pk.wake); err != nil {
			pk.log.Debug().Err(err).Msg("replication job: its wake-up source stopped working; it keeps its feed")
			pk.wake.Close()
			pk.wake, pk.off = nil, true
			return false
		}
		return true
	}
	c, cancel := context.WithTimeout(ctx, wakeOpenTimeout)
	w, err := pk.open(c, pk.p, pk.o)
	cancel()
	switch {
	case err == nil && w == nil:
		pk.off = true
		return false
	case errors.Is(err, dbupdates.ErrUnsupported):
		pk.log.Debug().Err(err).Msg("replication job: the source server's _db_updates cannot be read; it keeps its feed")
		pk.off = true
		return false
	case err != nil:
		if ctx.Err() == nil {
			pk.log.Debug().Err(err).Msg("replication job: opening its wake-up source failed; it parks once that works")
		}
		return false
	}
	pk.wake, pk.fresh = w, true
	return true
}

// enabled reports whether the next run may park.
func (pk *parker) enabled() bool {
	if pk == nil {
		return false
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return !pk.off
}

// close closes the wake-up source; the job's run has ended.
func (pk *parker) close() {
	if pk == nil {
		return
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.wake != nil {
		pk.wake.Close()
		pk.wake = nil
	}
	pk.off = true
}

// probeTimeout bounds one look at a parked job's source.
const probeTimeout = time.Minute

// wait is the parked job's goroutine: it records the job parked, waits
// until its source moved, records it resumed and calls start (a new
// engine run, from the checkpoint). When the job's context ends first (a
// stop, a drain, a shutdown, the job lost) it calls done as an engine run
// stopped then would.
func (pk *parker) wait(ctx context.Context, res replicate.Result, start func(),
	done func(replicate.Result, error)) {
	parked := res.Parked
	res.Parked = nil
	if parked.Resume || !pk.ensure(ctx) {
		// A change came in as the run parked, or the job cannot park now:
		// run again at once (a run that cannot park keeps its feed).
		start()
		return
	}
	a := pk.a
	pk.mu.Lock()
	wake, probe := pk.wake, pk.fresh
	pk.fresh = false
	pk.mu.Unlock()
	pk.record(ctx, parked.Since(), res.Stats)
	a.log.Debug().Str("seq", parked.Seq().String()).Msg("replication job: parked")

	timer := time.NewTimer(park.Jitter(pk.p.ParkRecheck))
	defer timer.Stop()
wait:
	for !probe || !pk.moved(ctx, parked) {
		select {
		case <-ctx.Done():
			done(res, nil)
			return
		case <-wake.C():
			if park.Err(wake) != nil {
				pk.ensure(ctx) // turns parking off: the job goes back to its feed
				break wait
			}
			probe = true
		case <-timer.C:
			probe = pk.a.o.Rechecks.Wait(ctx) == nil
			timer.Reset(park.Jitter(pk.p.ParkRecheck))
		}
	}
	if ctx.Err() != nil {
		done(res, nil)
		return
	}
	pk.record(ctx, time.Time{}, res.Stats)
	a.log.Debug().Msg("replication job: its source changed; resuming")
	start()
}

// moved asks whether the parked job's source moved; an error counts as
// moved (the new run reports it as a run does). A wake-up source that
// knows which rows are the job's (replicate.FeedWake) answers itself.
func (pk *parker) moved(ctx context.Context, parked *replicate.Parked) bool {
	pk.mu.Lock()
	w := pk.wake
	pk.mu.Unlock()
	if m, ok := w.(interface{ Moved(couch.Seq) bool }); ok {
		return m.Moved(parked.Seq()) || ctx.Err() != nil
	}
	c, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	moved, err := parked.Moved(c)
	if err != nil && ctx.Err() == nil {
		pk.log.Debug().Err(err).Msg("replication job: reading its source while parked failed; resuming")
	}
	return moved || ctx.Err() != nil
}

// record writes the job parked since (zero: resumed) to the store, for
// every view of every node. A failure is logged: the views are wrong for a
// while, the job is not (losing the job cancels its context).
func (pk *parker) record(ctx context.Context, since time.Time, st replicate.Stats) {
	c, cancel := context.WithTimeout(ctx, progressWriteTimeout)
	defer cancel()
	if err := pk.a.run.Park(c, since, st); err != nil && !repjob.IsLost(err) && ctx.Err() == nil {
		pk.log.Warn().Err(err).Msg("replication job: recording its parked state failed")
	}
}
