package jobserver

import (
	"context"
	"time"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/timerwheel"
)

// Hibernated jobs (jobrunner.Hibernated): a parked job's actor hands the
// job to its entry here and exits. The entry keeps the run (its worker
// lock, under the node's lease: no store write while it sleeps), the
// wake-up source with its callback (park.Notifier; a source that is not one
// has a goroutine relay its channel), a recheck timer on the node's wheel
// and the lease's kick and loss callbacks: a few hundred bytes, no
// goroutine, no slot. A signal or the timer (paced node-wide by
// park.Rechecks) wakes it: it waits for a slot (before the accept loop;
// the scheduler counts it as pending, so a full node rotates an active job
// out for it), then an actor starts with jobrunner.Options.Resume, looks at
// the source and hibernates again or runs. A stop (operator, drain,
// shutdown, cancel) ends it here as a stop of its actor would.

// hibernated reports whether e's job sleeps without an actor (or is being
// woken, or ended, without one).
func (e *entry) hibernated() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state != withActor
}

// hibernateFunc is the jobrunner.Options.Hibernate of e's actors.
func (r *Registry) hibernateFunc(e *entry) func(h *jobrunner.Hibernated) bool {
	return func(h *jobrunner.Hibernated) bool { return r.hibernate(e, h) }
}

// hibernate takes e's parked job over from its actor: false if a stop was
// asked for (it reaches the actor, which ends the job), the node is
// stopping, or the run is not held under the node's lease (it must then
// prove itself alive with writes, which its actor does).
func (r *Registry) hibernate(e *entry, h *jobrunner.Hibernated) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.stopReason != "" || r.closing || r.jobs[e.id] != e || r.hib.spawn == nil {
		return false
	}
	timers := r.hib.timers
	if timers == nil {
		timers = timerwheel.Default()
	}
	unwatch, leased := h.Run.Watch(func() { go r.kicked(e) }, func() { go r.lost(e) })
	if !leased {
		unwatch()
		return false
	}
	h.Run.Hibernate()
	// Its slot is free now: the accept loop or a woken job takes it.
	// (The actor's release function is dropped: it would take r.mu.)
	if e.release != nil {
		e.release = nil
		r.taken--
		r.broadcastLocked()
	}
	r.hibernated++
	r.tell(&scheduler.JobExited{ID: e.id})
	e.pid = nil // its actor exits; a wake-up's gets it again (hibernation.pid)

	e.mu.Lock()
	defer e.mu.Unlock()
	e.state, e.hib, e.unwatch, e.look = asleep, h, unwatch, 0
	d := h.Recheck
	if d <= 0 {
		d = time.Until(e.recheckAt)
		if e.recheckAt.IsZero() {
			d = park.Jitter(h.Period)
		}
	}
	d = max(d, 0)
	e.recheckAt = time.Now().Add(d)
	if h.Period > 0 || h.Recheck > 0 {
		e.timer = timers.AfterFunc(d, func() { r.signal(e, true) })
	}
	if n, ok := h.Wake.(park.Notifier); ok {
		n.OnSignal(func() { r.signal(e, false) })
	} else {
		go r.relay(e, h.Wake)
	}
	again := e.again
	e.again = false
	select {
	case <-h.Wake.C():
		again = true // a signal since the last run's idle time, or during the look
	default:
	}
	if again {
		r.wakeLocked(e, false)
	}
	return true
}

// relay turns the signals of a wake-up source that cannot call a function
// into signals of e, while e sleeps.
func (r *Registry) relay(e *entry, w interface{ C() <-chan struct{} }) {
	for range w.C() {
		e.mu.Lock()
		st := e.state
		e.mu.Unlock()
		if st != asleep && st != waking {
			return
		}
		r.signal(e, false)
	}
}

// signal is a wake-up of e (recheck: its timer's); it returns at once.
// A recheck of a job parked on its server's _db_updates is a batched look
// (lookLocked): no actor unless its source moved.
func (r *Registry) signal(e *entry, recheck bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state {
	case asleep:
		if recheck && e.look == 0 {
			if w := lookable(e.hib); w != nil {
				r.lookLocked(e, w)
				return
			}
			if m := answering(e.hib); m != nil {
				r.askLocked(e, m)
				return
			}
		}
		if e.look != 0 && recheck {
			return // its look is under way
		}
		r.wakeLocked(e, recheck)
	case waking, withActor:
		if !recheck {
			e.again = true
		}
	}
}

// lookWake is a wake-up source whose job's recheck reads its database's
// info on a server without an actor (a *dbupdates.Watch): a source that
// answers itself (a shared feed's watch, Moved) is not one.
type lookWake interface {
	Server() park.Server
	DB() string
}

// lookable is h's source when its recheck can be a batched look: its
// parked seq is known and its source is a lookWake.
func lookable(h *jobrunner.Hibernated) lookWake {
	if h == nil || len(h.Seq) == 0 {
		return nil
	}
	if _, self := h.Wake.(interface{ Moved(couch.Seq) bool }); self {
		return nil
	}
	w, _ := h.Wake.(lookWake)
	return w
}

// movedWake is a wake-up source that answers a recheck itself, from what
// it has seen (a shared feed's watch: replicate.FeedWake.Moved, the rows
// the node's one feed of the source read), without a request.
type movedWake interface {
	Moved(couch.Seq) bool
}

// answering is h's source when its recheck is answered by the source
// itself, without an actor: its parked seq is known and the job was
// checked since it was taken (an adopted job, Unchecked, looks at its
// source once, with an actor).
func answering(h *jobrunner.Hibernated) movedWake {
	if h == nil || len(h.Seq) == 0 || h.Unchecked {
		return nil
	}
	m, _ := h.Wake.(movedWake)
	return m
}

// askLocked is e's recheck when its wake-up source answers it (e.mu
// held; e asleep): no actor, no request, so not paced by the node's
// park.Rechecks either (which paces requests: a node of 100,000 parked
// selector jobs at park_recheck 1800 s asks ~56 a second, and woke an
// actor for each, paced at 5 a second, the others waiting in a goroutine
// each). Nothing past its parked seq, it sleeps on; else it wakes as a
// signal wakes it.
func (r *Registry) askLocked(e *entry, m movedWake) {
	e.look++
	if e.look == 0 {
		e.look = 1
	}
	n, h := e.look, e.hib
	go func() { // r.mu is taken before e.mu: the wheel is read without e.mu
		r.mu.Lock()
		timers := r.hib.timers
		r.mu.Unlock()
		if timers == nil {
			timers = timerwheel.Default()
		}
		r.answered(e, h, n, timers, nil, m.Moved(h.Seq))
	}()
}

// lookLocked starts e's batched recheck (e.mu held; e asleep): the node's
// batcher (park.Rechecks.Look, at the node's pace, one POST /_dbs_info for
// up to 100 jobs of a server) reads its source's info, and looked decides.
func (r *Registry) lookLocked(e *entry, w lookWake) {
	e.look++
	if e.look == 0 {
		e.look = 1
	}
	n, h := e.look, e.hib
	go func() {
		r.mu.Lock()
		hib := r.hib
		r.mu.Unlock()
		timers := hib.timers
		if timers == nil {
			timers = timerwheel.Default()
		}
		hib.rechecks.Look(w.Server(), w.DB(), h.Period, func(info couch.DBInfo, err error) {
			r.looked(e, h, n, timers, info, err)
		})
	}()
}

// looked is the answer of e's batched recheck n (of its hibernation h), as
// a recheck's GET /db would have answered the job's actor: nothing past
// its parked seq, it sleeps on (its next recheck armed); its update_seq
// past it, the job wakes for a look at its changes (Parked.Changed, as a
// _db_updates signal wakes it); an error (its database deleted, the server
// unreachable), it wakes for a recheck of its own, which meets the same
// and reports it as a run does.
func (r *Registry) looked(e *entry, h *jobrunner.Hibernated, n uint32, timers *timerwheel.Wheel, info couch.DBInfo, err error) {
	r.answered(e, h, n, timers, err, err == nil && replicate.SeqPast(info.UpdateSeq, h.Seq))
}

// answered ends e's recheck n (of its hibernation h) without an actor: an
// error wakes it for a recheck of its own, a source moved past its parked
// seq wakes it as a signal does, else its next recheck is armed.
func (r *Registry) answered(e *entry, h *jobrunner.Hibernated, n uint32, timers *timerwheel.Wheel, err error, moved bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state != asleep || e.hib != h || e.look != n {
		return
	}
	e.look = 0
	d := park.Jitter(h.Period)
	e.recheckAt = time.Now().Add(d)
	switch {
	case err != nil:
		r.wakeLocked(e, true)
	case moved:
		r.wakeLocked(e, false)
	default:
		e.timer = timers.AfterFunc(d, func() { r.signal(e, true) })
	}
}

// wakeLocked starts e's wake-up: e.mu is held.
func (r *Registry) wakeLocked(e *entry, recheck bool) {
	ctx, cancel := context.WithCancel(context.Background())
	e.state, e.cancelWake, e.wakeRecheck = waking, cancel, recheck
	go r.respawn(ctx, e, recheck)
}

// respawn brings woken e back: the node's recheck pace (a recheck), a slot,
// then its actor, handed the run and the wake-up source. A stop meanwhile
// cancels ctx (stop ends the job); a start that fails ends the job as a
// stop (back to the queue, still parked: it is taken again).
func (r *Registry) respawn(ctx context.Context, e *entry, recheck bool) {
	r.mu.Lock()
	hib := r.hib
	r.mu.Unlock()
	if recheck {
		if hib.rechecks.Wait(ctx) != nil {
			return
		}
	}
	r.mu.Lock()
	prev := e.actorExit
	r.mu.Unlock()
	select {
	case <-prev: // the actor that hibernated it has exited
	case <-ctx.Done():
		return
	}
	release, err := r.acquireFor(ctx, hib.maxJobs, true)
	if err != nil {
		return
	}
	r.mu.Lock()
	e.mu.Lock()
	if e.state != waking || r.closing {
		e.mu.Unlock()
		r.mu.Unlock()
		release()
		return
	}
	h := e.hib
	e.state, e.hib, e.cancelWake, e.again = withActor, nil, nil, false
	e.mu.Unlock()
	r.disarm(e, h)
	r.hibernated--
	e.inc++
	e.spawned, e.stopReason, e.release, e.actorExit = false, "", release, make(chan struct{})
	if hib.pid != nil {
		e.pid = hib.pid(e.id)
	}
	r.tell(&scheduler.JobStarted{ID: e.id, Continuous: e.continuous})
	system := r.system
	r.mu.Unlock()
	if err := hib.spawn(ctx, e, h.Run, &jobrunner.Resume{Wake: h.Wake, Recheck: recheck, Unchecked: h.Unchecked}); err != nil {
		// jobs_sup refused (the node is stopping, or jobs_sup restarting):
		// spawn gave the slot back and removed e; the job goes back to the
		// queue still parked, and is taken again (straight to sleep).
		hib.log.Warn().Err(err).Str("job_id", e.id).Msg("job server: could not wake a hibernated job; back to the queue")
		if err := h.End(context.Background(), system, hib.node, "superseded"); err != nil {
			hib.log.Warn().Err(err).Str("job_id", e.id).Msg("job server: handing a hibernated job back failed")
		}
		return
	}
	r.spawned(system, e)
}

// disarm stops the timer, wake-up callback (of h's source) and lease
// callbacks of e, which no longer sleeps (e.state was changed under e.mu
// before).
func (r *Registry) disarm(e *entry, h *jobrunner.Hibernated) {
	e.mu.Lock()
	t, unwatch := e.timer, e.unwatch
	e.timer, e.unwatch = nil, nil
	e.mu.Unlock()
	var w park.Notifier
	if h != nil {
		w, _ = h.Wake.(park.Notifier)
	}
	if t != nil {
		t.Stop()
	}
	if unwatch != nil {
		unwatch()
	}
	if w != nil {
		w.OnSignal(nil)
	}
}

// kicked: a user canceled or removed e's job (the lease's kick); a check
// finds out, and a job lost is forgotten without a write.
func (r *Registry) kicked(e *entry) {
	e.mu.Lock()
	h := e.hib
	st := e.state
	e.mu.Unlock()
	if h == nil || (st != asleep && st != waking) {
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err := h.Run.Check(c)
	cancel()
	if repjob.IsLost(err) {
		r.drop(e)
	}
}

// lost: the node's lease was lost (its jobs went back to the queue):
// e's hibernated job is forgotten without a write.
func (r *Registry) lost(e *entry) { r.drop(e) }

// drop forgets e's hibernated job, lost to this node: its wake-up source
// closed, nothing written.
func (r *Registry) drop(e *entry) {
	r.mu.Lock()
	e.mu.Lock()
	if e.state != asleep && e.state != waking {
		e.mu.Unlock()
		r.mu.Unlock()
		return
	}
	h := e.hib
	cancel := e.cancelWake
	e.state = ending
	e.mu.Unlock()
	r.hibernated--
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	r.disarm(e, h)
	e.mu.Lock()
	e.hib = nil
	e.mu.Unlock()
	h.Wake.Close()
	r.forget(e)
}
