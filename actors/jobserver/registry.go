package jobserver

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/startlimit"
	"github.com/couchrep/couchrep/internal/timerwheel"
	"github.com/couchrep/couchrep/messages"
)

// Registry is the one registry of the jobs running on this node — those
// with a job actor, and the parked ones hibernated without one — and of the
// slots the actors take against max_jobs. It belongs to the job server and
// outlives its acceptor's incarnations (a killed and restarted acceptor still
// knows what runs here) and jobs_sup's (a hibernated job has no actor to
// lose: it stays asleep, and its wake-up starts an actor under the new
// jobs_sup); a job leaves it when its run ends, however it ends. Every
// change of the actors is told to the scheduler (JobStarted, JobExited): a
// hibernated job takes no slot and is not rotated. It is safe for
// concurrent use.
type Registry struct {
	mu     sync.Mutex
	taken  int
	paused bool
	wake   chan struct{}
	jobs   map[string]*entry
	system *actor.ActorSystem
	sched  *actor.PID
	// startup bounds the jobs starting at once per source server
	// ([replicator] startup_concurrency); node-wide, so it outlives the
	// acceptor's incarnations with the jobs waiting in it.
	startup *startlimit.Limiter
	// infos shares GET /db and GET / answers among the jobs starting
	// together (replicate.InfoShare); node-wide as startup.
	infos *replicate.InfoShare
	// hib is how hibernated jobs come back (set by the acceptor).
	hib hibernation
	// woken counts hibernated jobs woken up and waiting for a slot: they
	// go before the accept loop, and the scheduler counts them as pending.
	woken int
	// hibernated counts the jobs asleep without an actor.
	hibernated int
	// closing: the node is stopping; no job hibernates or wakes any more.
	closing bool
	// yieldAccept, while the accept loop waits in the queue holding a
	// slot, ends that wait (a woken job needs the slot).
	yieldAccept func()
}

// hibernation is what the registry needs of the acceptor to wake a
// hibernated job, and to end one.
type hibernation struct {
	// spawn starts the actor of e's run for a wake-up; release gives the
	// slot it took back once the actor has exited.
	spawn func(ctx context.Context, e *entry, run *repjob.Run, rs *jobrunner.Resume) error
	// pid is the PID of job id's actor (a hibernated job keeps none).
	pid      func(id string) *actor.PID
	maxJobs  func() int
	rechecks *park.Rechecks
	timers   *timerwheel.Wheel
	node     string
	log      zerolog.Logger
}

// hstate is where a job of the registry is.
type hstate uint8

const (
	withActor hstate = iota // its actor runs it
	asleep                  // hibernated: no actor, waiting for a signal
	waking                  // hibernated, woken: waiting for the pace, a slot, its actor's start
	ending                  // hibernated, being ended (a stop): signals are ignored
)

// entry is one job of this node.
type entry struct {
	id         string
	run        uint64
	continuous bool
	pid        *actor.PID
	spawned    bool
	// stopReason is a stop asked for before the actor was spawned, or
	// while it was handing the job over (a hibernation is then refused).
	stopReason string
	done       chan struct{}
	// inc counts the job's actors: an actor's exit is its own incarnation's.
	inc uint32
	// actorExit is closed when the current incarnation's actor has exited
	// (a wake-up starts the next one only then: jobs_sup refuses a second
	// child of the same name).
	actorExit chan struct{}
	// release gives back the slot of the current actor (nil: none).
	release func()

	// mu guards the hibernation below (never held while taking r.mu).
	mu    sync.Mutex
	state hstate
	hib   *jobrunner.Hibernated
	timer *timerwheel.Timer
	// recheckAt is when the armed recheck was due: a look after a signal
	// that found nothing keeps it.
	recheckAt time.Time
	unwatch   func()
	// again: a signal came while the job was woken.
	again       bool
	cancelWake  context.CancelFunc
	wakeRecheck bool
	// look numbers the batched recheck under way (0: none): its answer
	// counts only while it is the entry's latest and the job still sleeps.
	look uint32
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{wake: make(chan struct{}), jobs: map[string]*entry{}, startup: startlimit.New(0),
		infos: replicate.NewInfoShare()}
}

// attach sets where changes are told (the scheduler of system; nil: nobody).
func (r *Registry) attach(system *actor.ActorSystem, sched *actor.PID) {
	r.mu.Lock()
	r.system, r.sched = system, sched
	r.mu.Unlock()
}

// setHibernation sets how hibernated jobs are woken (the acceptor, at each
// start).
func (r *Registry) setHibernation(h hibernation) {
	r.mu.Lock()
	r.hib = h
	r.mu.Unlock()
}

// tell sends msg to the scheduler; r.mu is held, so changes arrive in order.
func (r *Registry) tell(msg any) {
	if r.system != nil && r.sched != nil {
		r.system.Root.Send(r.sched, msg)
	}
}

// Running returns how many slots are taken (job actors, and a job being
// accepted).
func (r *Registry) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.taken
}

// Held returns how many jobs the node holds: with an actor, and
// hibernated (what its heartbeat publishes, actors.Deps.Held).
func (r *Registry) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.jobs)
}

// Hibernated returns how many parked jobs are asleep without an actor.
func (r *Registry) Hibernated() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hibernated
}

// Jobs returns the ids of the jobs running here (with an actor or
// hibernated), sorted.
func (r *Registry) Jobs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.jobs))
}

// Draining reports whether the node was drained: it hands out no slots.
func (r *Registry) Draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.paused
}

// setPaused stops (or resumes) handing out slots.
func (r *Registry) setPaused(p bool) {
	r.mu.Lock()
	r.paused = p
	r.broadcastLocked()
	r.mu.Unlock()
}

// wakeUp makes waiting acquirers re-read max_jobs.
func (r *Registry) wakeUp() {
	r.mu.Lock()
	r.broadcastLocked()
	r.mu.Unlock()
}

func (r *Registry) broadcastLocked() {
	close(r.wake)
	r.wake = make(chan struct{})
}

// acquire waits for a free slot (fewer than max() taken, not paused), takes
// it and returns the function that gives it back (once, however often
// called). The accept loop leaves the slots to woken hibernated jobs
// first (woken).
func (r *Registry) acquire(ctx context.Context, max func() int) (release func(), err error) {
	return r.acquireFor(ctx, max, false)
}

func (r *Registry) acquireFor(ctx context.Context, max func() int, woken bool) (release func(), err error) {
	if woken {
		r.mu.Lock()
		r.woken++
		r.tell(&scheduler.WokenWaiting{N: r.woken})
		r.mu.Unlock()
		defer func() {
			r.mu.Lock()
			r.woken--
			r.tell(&scheduler.WokenWaiting{N: r.woken})
			r.broadcastLocked()
			r.mu.Unlock()
		}()
	}
	for {
		r.mu.Lock()
		ahead := r.woken
		if woken {
			ahead = 0
		}
		if woken && !r.paused && r.taken >= max() && r.yieldAccept != nil {
			// The accept loop holds a slot while it waits for a job: it
			// gives it back (its wait ends, the job queue is untouched).
			r.yieldAccept()
			r.yieldAccept = nil
		}
		if !r.paused && r.taken+ahead < max() {
			r.taken++
			r.mu.Unlock()
			var once sync.Once
			return func() {
				once.Do(func() {
					r.mu.Lock()
					r.taken--
					r.broadcastLocked()
					r.mu.Unlock()
				})
			}, nil
		}
		wake := r.wake
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

// setAccepting records how to end the accept loop's wait in the queue
// (nil: it is not waiting). A woken job already waiting for a slot is
// owed the one the loop holds: the wait ends at once (yield is called).
// A woken job that came to acquireFor between the loop's acquire and this
// call found no wait to end and slept until a slot came free: with the
// loop's wait the only slot taken, forever.
func (r *Registry) setAccepting(yield func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if yield != nil && r.woken > 0 {
		r.yieldAccept = nil
		yield()
		return
	}
	r.yieldAccept = yield
}

// tryAcquire takes up to n more free slots without waiting and returns
// their release functions (see acquire): the accept loop's batch.
func (r *Registry) tryAcquire(max func() int, n int) []func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []func()
	for len(out) < n && !r.paused && r.taken+r.woken < max() {
		r.taken++
		var once sync.Once
		out = append(out, func() {
			once.Do(func() {
				r.mu.Lock()
				r.taken--
				r.broadcastLocked()
				r.mu.Unlock()
			})
		})
	}
	return out
}

// add registers the actor pid about to run job id (run: the queue's accept
// count), which holds the slot that release gives back, and returns the
// function its actor calls when it has exited (exited).
func (r *Registry) add(id string, run uint64, continuous bool, pid *actor.PID, release func()) (e *entry, exited func()) {
	e = &entry{id: id, run: run, continuous: continuous, pid: pid, done: make(chan struct{}), release: release,
		actorExit: make(chan struct{})}
	r.mu.Lock()
	r.jobs[id] = e
	r.tell(&scheduler.JobStarted{ID: id, Continuous: continuous})
	r.mu.Unlock()
	return e, r.exitedFunc(e)
}

// exitedFunc is the Released of e's current actor: the job leaves the
// registry and gives its slot back, and only then is its exit (stop's
// channel) seen, so that whoever waited for it (a drain) finds the slot
// free. An actor that handed its job over to hibernation (or an older
// incarnation's) only gives its slot back.
func (r *Registry) exitedFunc(e *entry) func() {
	r.mu.Lock()
	inc, exit := e.inc, e.actorExit
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			defer r.exitSeen(e, exit) // after the close
			defer close(exit)
			r.mu.Lock()
			if e.inc != inc {
				r.mu.Unlock()
				return
			}
			release := e.release
			e.release = nil
			e.mu.Lock()
			st := e.state
			e.mu.Unlock()
			gone := st == withActor
			if gone && r.jobs[e.id] == e {
				delete(r.jobs, e.id)
				r.tell(&scheduler.JobExited{ID: e.id})
			}
			r.mu.Unlock()
			if release != nil {
				release()
			}
			if gone {
				close(e.done)
			}
		})
	}
}

// exited is the actorExit of an entry whose actor exited: a hibernated
// job keeps no channel of its own for it.
var exited = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// exitSeen drops e's actorExit, exit, closed: the shared closed channel
// says the same.
func (r *Registry) exitSeen(e *entry, exit chan struct{}) {
	r.mu.Lock()
	if e.actorExit == exit {
		e.actorExit = exited
	}
	r.mu.Unlock()
}

// spawned records that e's actor runs: a stop asked for meanwhile is sent
// now.
func (r *Registry) spawned(system *actor.ActorSystem, e *entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.spawned = true
	if e.stopReason != "" {
		system.Root.Send(e.pid, &messages.StopReplicationJobRequest{JobId: e.id, Reason: e.stopReason})
	}
}

// lookup returns the entry of job id, if it runs here.
func (r *Registry) lookup(id string) *entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.jobs[id]
}

// stop asks the actor of e to stop its job cleanly (final checkpoint, back
// to the queue), or ends e's hibernated job itself, and returns a channel
// closed once it has exited.
func (r *Registry) stop(system *actor.ActorSystem, e *entry, reason string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.stopReason == "" {
		e.stopReason = reason
	}
	e.mu.Lock()
	st := e.state
	if st == asleep || st == waking {
		e.state = ending
		h := e.hib
		e.hib = nil
		cancel := e.cancelWake
		e.mu.Unlock()
		if cancel != nil {
			cancel()
		}
		r.disarm(e, h)
		r.hibernated--
		go r.end(system, e, h, e.stopReason)
		return e.done
	}
	e.mu.Unlock()
	if st == ending || !e.spawned {
		return e.done
	}
	system.Root.Send(e.pid, &messages.StopReplicationJobRequest{JobId: e.id, Reason: reason})
	return e.done
}

// end ends e's hibernated job (h) as a stop: back to the queue, its exit
// seen.
func (r *Registry) end(system *actor.ActorSystem, e *entry, h *jobrunner.Hibernated, reason string) {
	r.mu.Lock()
	node, log := r.hib.node, r.hib.log
	r.mu.Unlock()
	if err := h.End(context.Background(), system, node, reason); err != nil {
		log.Warn().Err(err).Str("job_id", e.id).Msg("job server: ending a hibernated job failed; the lease hands it back")
	} else {
		log.Debug().Str("job_id", e.id).Str("reason", reason).Msg("job server: hibernated job ended")
	}
	r.forget(e)
}

// forget removes e, whose job ended without an actor, and makes its exit
// seen.
func (r *Registry) forget(e *entry) {
	r.mu.Lock()
	if r.jobs[e.id] == e {
		delete(r.jobs, e.id)
	}
	r.mu.Unlock()
	close(e.done)
}

// stopAll stops every job of this node; it returns their exits by job id.
func (r *Registry) stopAll(system *actor.ActorSystem, reason string) map[string]<-chan struct{} {
	r.mu.Lock()
	all := make([]*entry, 0, len(r.jobs))
	for _, e := range r.jobs {
		all = append(all, e)
	}
	r.mu.Unlock()
	out := make(map[string]<-chan struct{}, len(all))
	for _, e := range all {
		out[e.id] = r.stop(system, e, reason)
	}
	return out
}

// Closing stops hibernating and waking jobs: the node is stopping (call it
// before the tree stops; a job that parks meanwhile sleeps in its actor,
// which the tree's shutdown stops).
func (r *Registry) Closing() {
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
}

// Shutdown hands every hibernated job back to the queue, still parked in
// its record (jobrunner.Hibernated.End with "shutdown": the node that takes
// it next, this one restarted or another, puts it straight to sleep). Call
// it after Closing and once the tree has stopped (no accept loop takes them
// again). It returns once they are ended, or ctx ended.
func (r *Registry) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closing = true
	var hib []*entry
	for _, e := range r.jobs {
		e.mu.Lock()
		if e.state == asleep || e.state == waking {
			hib = append(hib, e)
		}
		e.mu.Unlock()
	}
	system := r.system
	r.mu.Unlock()
	dones := make([]<-chan struct{}, 0, len(hib))
	for _, e := range hib {
		dones = append(dones, r.stop(system, e, "shutdown"))
	}
	for _, d := range dones {
		select {
		case <-d:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Startup is the node's start-up limiter ([replicator]
// startup_concurrency): its figures for the node's metrics.
func (r *Registry) Startup() startlimit.Stats { return r.startup.Stats() }
