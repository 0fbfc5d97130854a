package jobserver

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/startlimit"
	"github.com/couchrep/couchrep/messages"
)

// Registry is the one registry of the job actors running on this node and
// of the slots they take against max_jobs. It belongs to the job server and
// outlives its acceptor's incarnations (a killed and restarted acceptor still
// knows what runs here); a job actor leaves it when it stops, however it
// stops. Every change is told to the scheduler (JobStarted, JobExited). It is
// safe for concurrent use.
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
}

// entry is one job actor.
type entry struct {
	id         string
	run        uint64
	continuous bool
	pid        *actor.PID
	spawned    bool
	// stopReason is a stop asked for before the actor was spawned.
	stopReason string
	done       chan struct{}
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

// Jobs returns the ids of the jobs whose actors run here, sorted.
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
// called).
func (r *Registry) acquire(ctx context.Context, max func() int) (release func(), err error) {
	for {
		r.mu.Lock()
		if !r.paused && r.taken < max() {
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

// add registers the actor pid about to run job id (run: the queue's accept
// count), which holds the slot that release gives back, and returns the
// function that removes it again: it leaves the registry, gives its slot
// back, and only then is its exit (stop's channel) seen, so that whoever
// waited for it (a drain) finds the slot free.
func (r *Registry) add(id string, run uint64, continuous bool, pid *actor.PID, release func()) (e *entry, remove func()) {
	e = &entry{id: id, run: run, continuous: continuous, pid: pid, done: make(chan struct{})}
	r.mu.Lock()
	r.jobs[id] = e
	r.tell(&scheduler.JobStarted{ID: id, Continuous: continuous})
	r.mu.Unlock()
	var once sync.Once
	return e, func() {
		once.Do(func() {
			r.mu.Lock()
			if r.jobs[id] == e {
				delete(r.jobs, id)
				r.tell(&scheduler.JobExited{ID: id})
			}
			r.mu.Unlock()
			release()
			close(e.done)
		})
	}
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

// lookup returns the entry of job id, if its actor runs here.
func (r *Registry) lookup(id string) *entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.jobs[id]
}

// stop asks the actor of e to stop its job cleanly (final checkpoint, back
// to the queue) and returns a channel closed once it has exited.
func (r *Registry) stop(system *actor.ActorSystem, e *entry, reason string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !e.spawned {
		if e.stopReason == "" {
			e.stopReason = reason
		}
		return e.done
	}
	system.Root.Send(e.pid, &messages.StopReplicationJobRequest{JobId: e.id, Reason: reason})
	return e.done
}

// stopAll stops every job actor of this node; it returns their exits by
// job id.
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

// Startup is the node's start-up limiter ([replicator]
// startup_concurrency): its figures for the node's metrics.
func (r *Registry) Startup() startlimit.Stats { return r.startup.Stats() }
