// Package jobserver is the job_server: a supervisor whose acceptor takes
// replication jobs from the shared queue (up to max_jobs on this node) and
// starts one replication job actor per job under jobs_sup
// (simple_one_for_one, temporary children).
//
// The acceptor waits in the queue (repjob.Store.Accept with wait: woken by
// the queue's watches, not by polling) only while this node has a free slot;
// each accepted job runs in a replication job actor started with
// supervisor.StartChild. The slot count lives with the job server's spec, not
// in the acceptor, so a killed and restarted acceptor still knows how many
// jobs run here; a job actor gives its slot back when it stops, however it
// stops. On nodes without the replication node type the acceptor accepts
// nothing.
package jobserver

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/actors/replicationjob"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replication"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the job server's name under the node's root supervisor; JobsSup
// and Acceptor are its children.
const (
	Name     = "job_server"
	JobsSup  = "jobs_sup"
	Acceptor = "acceptor"
)

// Spec returns the job server's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{
		Name: Name,
		Supervisor: &supervisor.Spec{
			Strategy:    supervisor.RestForOne,
			MaxRestarts: 10,
			Period:      time.Second,
			Children: []supervisor.ChildSpec{
				{
					Name: JobsSup,
					Supervisor: &supervisor.Spec{
						Strategy:    supervisor.SimpleOneForOne,
						MaxRestarts: 100,
						Period:      time.Second,
						Children: []supervisor.ChildSpec{{Name: "replication_job", Restart: supervisor.Temporary,
							Shutdown: replicationjob.StopTimeout + 5*time.Second}},
					},
				},
				{Name: Acceptor, Props: AcceptorProps(deps, NewSlots())},
			},
		},
	}
}

// Slots counts the jobs running on this node against max_jobs. It is safe
// for concurrent use.
type Slots struct {
	mu      sync.Mutex
	running int
	paused  bool
	wake    chan struct{}
}

// NewSlots returns a slot count with nothing running.
func NewSlots() *Slots { return &Slots{wake: make(chan struct{})} }

// Running returns how many slots are taken.
func (s *Slots) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// SetPaused stops (or resumes) handing out slots: a drained node.
func (s *Slots) SetPaused(p bool) {
	s.mu.Lock()
	s.paused = p
	s.broadcastLocked()
	s.mu.Unlock()
}

// Wake makes waiting acquirers re-read max (after a policy change).
func (s *Slots) Wake() {
	s.mu.Lock()
	s.broadcastLocked()
	s.mu.Unlock()
}

func (s *Slots) broadcastLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// Acquire waits for a free slot (fewer than max() running) and takes it.
func (s *Slots) Acquire(ctx context.Context, max func() int) error {
	for {
		s.mu.Lock()
		if !s.paused && s.running < max() {
			s.running++
			s.mu.Unlock()
			return nil
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}

// Releaser returns the function that gives one taken slot back; calling it
// more than once releases once.
func (s *Slots) Releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.running--
			s.broadcastLocked()
			s.mu.Unlock()
		})
	}
}

// AcceptorOptions tune the acceptor (tests).
type AcceptorOptions struct {
	// JobOptions adjusts each job actor's options before it starts.
	JobOptions func(*replicationjob.Options)
	// NoJitter starts jobs without startup_jitter.
	NoJitter bool
}

// AcceptorProps returns the acceptor's props; slots must outlive the
// acceptor (one per job server).
func AcceptorProps(deps actors.Deps, slots *Slots, opts ...AcceptorOptions) *actor.Props {
	var o AcceptorOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	return actors.Props(func() actor.Actor {
		return &acceptor{deps: deps, slots: slots, o: o, log: deps.Logger.With().Str("actor", Acceptor).Logger()}
	}, actors.Handles(&messages.DrainRequest{}, &messages.UndrainRequest{}, &messages.SetConfigRequest{}))
}

type acceptor struct {
	deps  actors.Deps
	slots *Slots
	o     AcceptorOptions
	log   zerolog.Logger
	task  actors.Task
}

func (a *acceptor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		if !a.deps.Config.HasNodeType(config.NodeTypeReplication) || a.deps.RepJobs == nil {
			a.log.Info().Msg("acceptor: not a replication node, accepting no jobs")
			return
		}
		a.start(ctx.ActorSystem())
	case *messages.DrainRequest:
		// Stop taking slots, and leave the queue now: a waiting Accept
		// would otherwise take the very jobs the drain hands back. Once the
		// loop returned, every job it accepted runs under jobs_sup.
		a.slots.SetPaused(true)
		a.halt()
		if ctx.Sender() != nil {
			ctx.Respond(&messages.DrainResponse{})
		}
	case *messages.UndrainRequest:
		a.slots.SetPaused(false)
		if !a.task.Running() && a.deps.Config.HasNodeType(config.NodeTypeReplication) && a.deps.RepJobs != nil {
			a.start(ctx.ActorSystem())
		}
		if ctx.Sender() != nil {
			ctx.Respond(&messages.UndrainResponse{})
		}
	case *messages.SetConfigRequest:
		// The scheduler changed the policy: waiting acquirers re-read
		// max_jobs.
		a.slots.Wake()
		if ctx.Sender() != nil {
			p := a.deps.RepJobs.Policy()
			ctx.Respond(&messages.SetConfigResponse{MaxJobs: uint32(p.MaxJobs), MaxChurn: uint32(p.MaxChurn)})
		}
	case *actor.Stopping:
		// The loop returns soon after its context ends; the job actors it
		// started run on under jobs_sup.
		a.task.Cancel()
	}
}

func (a *acceptor) start(system *actor.ActorSystem) {
	a.task.Go(func(c context.Context) { a.loop(c, system) })
}

// halt stops the accept loop and waits for it to return.
func (a *acceptor) halt() { a.task.Stop(0) }

// loop accepts jobs while there are free slots, until ctx ends.
func (a *acceptor) loop(ctx context.Context, system *actor.ActorSystem) {
	store := a.deps.RepJobs
	jobsSup := a.deps.PID(Name + "/" + JobsSup)
	maxJobs := func() int { return store.Policy().MaxJobs }
	retry := 100 * time.Millisecond
	for ctx.Err() == nil {
		if err := a.slots.Acquire(ctx, maxJobs); err != nil {
			return
		}
		release := a.slots.Releaser()
		run, err := store.Accept(ctx, true)
		if err != nil {
			release()
			if ctx.Err() != nil {
				return
			}
			a.log.Warn().Err(err).Dur("retry_in", retry).Msg("acceptor: accept failed")
			if !sleep(ctx, retry) {
				return
			}
			retry = min(retry*2, 10*time.Second)
			continue
		}
		retry = 100 * time.Millisecond
		jo := replicationjob.Options{
			Store: store, Node: a.deps.NodeName(), ServerUUID: a.deps.Config.CouchDB.UUID,
			Logger: a.deps.Logger, Scheduler: a.deps.PID("scheduler"), Released: release,
			NodePool: true, Limiter: ratelimiter.For(system), Limits: limitsOf(a.deps.Config),
			Endpoints: replication.EndpointConfigFrom(a.deps.Config.Replicator),
		}
		if m := a.deps.Metrics; m != nil {
			jo.Transport, jo.OnEvent = m.Transport, m.ObserveEngine
			jo.OnStats = func(id string, s replication.Stats) {
				m.ObserveJob(id, "", true, httpapi.JobCounters{DocsRead: s.DocsRead, DocsWritten: s.DocsWritten,
					DocWriteFailures: s.DocWriteFailures, MissingRevisionsFound: s.MissingRevisionsFound, RevisionsChecked: s.RevisionsChecked})
			}
		}
		if !a.o.NoJitter {
			jo.StartupDelay = store.Policy().StartupDelay(nil)
		}
		if a.o.JobOptions != nil {
			a.o.JobOptions(&jo)
		}
		name := replicationjob.Name(run.ID())
		if _, err := supervisor.StartChild(ctx, system, jobsSup, name, replicationjob.Props(run, jo)); err != nil {
			release()
			a.log.Warn().Err(err).Str("job_id", run.ID()).Msg("acceptor: could not start the job actor; job back to the queue")
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if serr := run.Stop(c); serr != nil && !repjob.IsLost(serr) {
				a.log.Warn().Err(serr).Str("job_id", run.ID()).Msg("acceptor: resubmit failed; the activity monitor will")
			}
			cancel()
			if errors.Is(err, supervisor.ErrAlreadyStarted) && !sleep(ctx, retry) {
				return
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// limitsOf is what a job's endpoints may send, from [replicator].
func limitsOf(c config.Config) couch.Limits {
	return couch.Limits{
		MaxDocumentBytes: int64(c.Replicator.MaxDocumentBytes),
		MaxLineBytes:     int64(c.Replicator.MaxChangesRowBytes),
		MaxBodyBytes:     int64(c.Replicator.MaxResponseBytes),
	}
}
