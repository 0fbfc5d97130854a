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
	"github.com/couchrep/couchrep/internal/startlimit"
	"github.com/couchrep/couchrep/internal/timerwheel"
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
	a *jobActor
	// p and o are the job's (replicate's, which its runs share).
	p    *replicate.Params
	o    *replicate.Options
	log  zerolog.Logger
	open func(ctx context.Context, p replicate.Params, o replicate.Options) (park.Wake, error)

	mu   sync.Mutex
	wake park.Wake // nil until opened
	// fresh: wake was opened since the job last parked (a change between
	// the feed's close and the watch's start would not signal it).
	fresh bool
	// opened is when wake was opened by this parker (zero: passed in,
	// open since the job first parked); a change before it does not
	// signal it.
	opened time.Time
	// off: the job's source cannot wake it (unsupported): it no longer
	// parks, and keeps its feed; until offUntil, if set (a server whose
	// _db_updates could not be read is asked again once the hub's verdict
	// expired: dbupdates.DefaultUnsupportedFor).
	off      bool
	offUntil time.Time
	retrying bool
	// hibernate, if set, hands the parked job to the node's registry
	// (Options.Hibernate) instead of sleeping in the actor; false: it
	// sleeps here.
	hibernate func(seq couch.Seq) bool
}

// parking returns the job's parker, or nil when the job never parks: not
// continuous, no checkpoints, idle_park_after 0, or no wake-up source on
// this node. A filtered job (doc_ids, a selector) that shares its source's
// feed waits on a watch on that feed (replicate.WatchFeed); a whole-database
// job on its server's _db_updates. The wake-up source is opened now, so that the job knows
// whether it can park before its first run (a server whose _db_updates
// cannot be read keeps its jobs' feeds).
func (a *jobActor) parking(ctx context.Context, p *replicate.Params, o *replicate.Options, wake park.Wake) *parker {
	if !p.Continuous || !p.UseCheckpoints || p.IdleParkAfter <= 0 {
		return nil
	}
	pk := &parker{a: a, p: p, o: o, log: a.log, open: a.o.Wake}
	if pk.open == nil && o.Feeds != nil && replicate.ParksOnSharedFeed(*p) {
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
		if a.o.DBUpdates == nil || !replicate.ParksOnDBUpdates(*p) {
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
	if wake != nil {
		// A woken job's: open since it first parked.
		pk.wake = wake
		return pk
	}
	pk.ensure(ctx)
	// Opened before the job's first run: a change after the run's feed
	// closes signals it, so the first park needs no look at the source.
	pk.fresh = false
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
	if pk.off && (pk.offUntil.IsZero() || time.Now().Before(pk.offUntil)) {
		return false
	}
	pk.off, pk.offUntil = false, time.Time{}
	if pk.wake != nil {
		if err := park.Err(pk.wake); err != nil {
			pk.log.Debug().Err(err).Msg("replication job: its wake-up source stopped working; it keeps its feed")
			pk.wake.Close()
			pk.wake, pk.off, pk.offUntil = nil, true, time.Now().Add(dbupdates.DefaultUnsupportedFor)
			return false
		}
		return true
	}
	c, cancel := context.WithTimeout(ctx, wakeOpenTimeout)
	w, err := pk.open(c, *pk.p, *pk.o)
	cancel()
	switch {
	case err == nil && w == nil:
		pk.off = true
		return false
	case errors.Is(err, dbupdates.ErrUnsupported):
		pk.log.Debug().Err(err).Msg("replication job: the source server's _db_updates cannot be read; it keeps its feed")
		pk.off, pk.offUntil = true, time.Now().Add(dbupdates.DefaultUnsupportedFor)
		return false
	case err != nil:
		if ctx.Err() == nil {
			pk.log.Debug().Err(err).Msg("replication job: opening its wake-up source failed; it parks once that works")
		}
		return false
	}
	pk.wake, pk.fresh, pk.opened = w, true, time.Now()
	return true
}

// parkLater is the engine's Options.ParkLater for a run that may not park
// (its server's _db_updates could not be read): once the verdict expired
// it opens the wake-up source again on a goroutine of its own, and answers
// true at the engine's next ask if that worked. It never blocks.
func (pk *parker) parkLater(ctx context.Context) func() bool {
	return func() bool {
		pk.mu.Lock()
		if pk.wake != nil && !pk.off {
			pk.mu.Unlock()
			return true
		}
		due := pk.off && !pk.offUntil.IsZero() && !time.Now().Before(pk.offUntil) && !pk.retrying
		if due {
			pk.retrying = true
		}
		pk.mu.Unlock()
		if due {
			go func() {
				if pk.ensure(ctx) {
					pk.log.Debug().Msg("replication job: its wake-up source works now; it parks when idle")
				}
				pk.mu.Lock()
				pk.retrying = false
				pk.mu.Unlock()
			}()
		}
		return false
	}
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

// wait parks the job whose engine run ended parked (res.Parked): it
// records the job parked, looks at the source once if its wake-up source
// was just opened (a change between the feed's close and the watch's start
// would not signal it) or opened after the read that let a quiet run park
// early (replicate.Parked.Quiet), then leaves the job to sleep. It runs on the
// engine's last goroutine's successor; sleep is the one that stays.
func (pk *parker) wait(ctx context.Context, res replicate.Result, start func(),
	done func(replicate.Result, error)) {
	parked := res.Parked
	// What a stop of the parked job needs of the run: its id and stats.
	res = replicate.Result{ID: res.ID, Stats: res.Stats}
	if parked.Resume || !pk.ensure(ctx) {
		// A change came in as the run parked, or the job cannot park now:
		// run again at once (a run that cannot park keeps its feed).
		start()
		return
	}
	pk.mu.Lock()
	wake, fresh := pk.wake, pk.fresh
	if at, quiet := parked.Quiet(); quiet && at.Before(pk.opened) {
		// The run parked as soon as it found nothing to replicate, which
		// it knew from a read of the source older than the wake-up
		// source: a change between the two may not have reached its feed
		// yet and would not signal the wake-up source. Look once.
		fresh = true
	}
	pk.fresh = false
	pk.mu.Unlock()
	pk.record(ctx, parked.Since(), res.Stats)
	pk.a.parkedNow.Store(true)
	if l := pk.a.lease; l != nil {
		// The connections the run left idle in the node's pool: the node's
		// descriptors follow the jobs that work, not those that sleep.
		l.CloseIdle()
	}
	pk.log.Debug().Str("seq", parked.Seq().String()).Msg("replication job: parked")
	if fresh && pk.moved(ctx, parked, false, false) {
		pk.resume(ctx, res, start, done)
		return
	}
	if pk.hibernate != nil && pk.hibernate(parked.Seq()) {
		return
	}
	(&sleeper{pk: pk, ctx: ctx, wake: wake, parked: parked, res: res, start: start, done: done}).sleep()
}

// sleepState is where a sleeping job is.
type sleepState uint8

const (
	asleep  sleepState = iota // waiting for a signal: no goroutine
	looking                   // a goroutine looks at the source
	gone                      // resumed or ended: signals are ignored
)

// sleeper is a parked job while it sleeps: no goroutine of its own. Its
// wake-up source calls signal (park.Notifier; a source that is not one has
// a goroutine relay its C), so does its recheck timer (park_recheck,
// jittered, on the node's timer wheel), and the job's context ending calls
// canceled (context.AfterFunc). A signal starts one goroutine that looks at
// the source (paced node-wide for a recheck); a signal during a look makes
// it look again after. The look that finds the source moved resumes the
// job; a job whose context ended is ended as a stop.
type sleeper struct {
	pk     *parker
	ctx    context.Context
	wake   park.Wake
	parked *replicate.Parked
	res    replicate.Result
	start  func()
	done   func(replicate.Result, error)

	mu      sync.Mutex
	state   sleepState
	again   bool // a signal came during the look
	timer   *timerwheel.Timer
	stopCtx func() bool
	relay   chan struct{} // closed to end the relay of C (a Wake that is not a Notifier)
}

// sleep arms the sleeper and returns.
func (s *sleeper) sleep() {
	wheel := s.pk.a.o.Timers
	if wheel == nil {
		wheel = timerwheel.Default()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer = wheel.AfterFunc(park.Jitter(s.pk.p.ParkRecheck), func() { s.signal(true) })
	if n, ok := s.wake.(park.Notifier); ok {
		n.OnSignal(func() { s.signal(false) })
	} else {
		s.relay = make(chan struct{})
		go s.relayC(s.wake.C(), s.relay)
	}
	select {
	case <-s.wake.C():
		// A signal of the last run's idle time (the change may have come
		// after the feed closed): look once.
		s.state = looking
		go s.look(false)
	default:
	}
	s.stopCtx = context.AfterFunc(s.ctx, s.canceled)
}

// relayC turns the signals of a Wake that cannot call a function into
// signal calls; the price is this goroutine.
func (s *sleeper) relayC(c <-chan struct{}, stop <-chan struct{}) {
	for {
		select {
		case <-c:
			s.signal(false)
		case <-stop:
			return
		}
	}
}

// signal is a wake-up (recheck: the timer's); it must return at once.
func (s *sleeper) signal(recheck bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case asleep:
		s.state = looking
		go s.look(recheck)
	case looking:
		s.again = true
	}
}

// look asks whether the source moved (a recheck waits for the node's
// pace first), again while signals came meanwhile; it resumes the job
// when it did, or when the wake-up source stopped working (parking off).
func (s *sleeper) look(recheck bool) {
	pk := s.pk
	for {
		if recheck {
			_ = pk.a.o.Rechecks.Wait(s.ctx) // a context that ended makes moved true
		}
		failed := park.Err(s.wake) != nil
		moved := failed || pk.moved(s.ctx, s.parked, recheck, false)
		s.mu.Lock()
		if s.state == gone {
			s.mu.Unlock()
			return
		}
		if moved {
			s.state = gone
			s.mu.Unlock()
			s.stop()
			if failed {
				pk.ensure(s.ctx) // turns parking off: back to a feed of the job's own
			}
			pk.resume(s.ctx, s.res, s.start, s.done)
			return
		}
		if recheck {
			s.timer.Reset(park.Jitter(pk.p.ParkRecheck))
		}
		if !s.again {
			s.state = asleep
			s.mu.Unlock()
			return
		}
		s.again, recheck = false, false
		s.mu.Unlock()
	}
}

// canceled is called when the job's context ends (a stop, a drain, a
// shutdown, the job lost): a sleeping job ends as a stopped run would; a
// look under way sees the context ended and does the same.
func (s *sleeper) canceled() {
	s.mu.Lock()
	if s.state != asleep {
		s.mu.Unlock()
		return
	}
	s.state = gone
	s.mu.Unlock()
	s.stop()
	s.done(s.res, nil)
}

// stop disarms the sleeper's timer, hook and relay (not under mu: the
// wheel may be waiting to call signal).
func (s *sleeper) stop() {
	s.timer.Stop()
	if n, ok := s.wake.(park.Notifier); ok {
		n.OnSignal(nil)
	}
	if s.relay != nil {
		close(s.relay)
	}
	s.stopCtx()
}

// resume records the job resumed and starts a new engine run from the
// checkpoint; a job whose context ended meanwhile ends as a stop.
func (pk *parker) resume(ctx context.Context, res replicate.Result, start func(), done func(replicate.Result, error)) {
	if ctx.Err() != nil {
		done(res, nil)
		return
	}
	pk.a.parkedNow.Store(false)
	pk.record(ctx, time.Time{}, res.Stats)
	pk.log.Debug().Msg("replication job: resuming")
	start()
}

// moved asks whether the parked job's source moved; an error counts as
// moved (the new run reports it as a run does). A wake-up source that
// knows which rows are the job's (replicate.FeedWake) answers itself.
// Otherwise the look takes a start-up slot of the source's server
// (Options.Startup, [replicator] startup_concurrency) for its request or
// two: a wake-up of every watch of a server (its _db_updates feed
// restarted) sends the server that many at a time, not ten thousand. A
// recheck asks Parked.Moved (update_seq first: one GET /db when nothing
// moved), a wake-up Parked.Changed (the source said it was written: one
// _changes request).
func (pk *parker) moved(ctx context.Context, parked *replicate.Parked, recheck, unchecked bool) bool {
	pk.mu.Lock()
	w := pk.wake
	pk.mu.Unlock()
	if m, ok := w.(interface{ Moved(couch.Seq) bool }); ok && !unchecked {
		return m.Moved(parked.Seq()) || ctx.Err() != nil
	}
	if acquire := pk.a.o.Startup; acquire != nil {
		release, err := acquire(ctx, startlimit.ServerOf(pk.p.Source.URL))
		if err != nil {
			return true // the job's context ended
		}
		defer release()
	}
	c, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if g := pk.a.o.StartupRequests; g != nil && pk.a.o.Startup != nil {
		c = couch.WithGate(c, g)
	}
	look := parked.Changed
	if recheck {
		look = parked.Moved
	}
	moved, err := look(c)
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
