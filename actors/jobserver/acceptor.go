package jobserver

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// requestTimeout bounds an admin request's work in the acceptor (a drain
// waits for every job's final checkpoint).
const requestTimeout = 2 * time.Minute

// controlRequest is a job control request addressed to this node.
type controlRequest struct{ c *messages.JobControl }

// controlDone: the request was carried out (or found stale) and cleared.
type controlDone struct{ id string }

type acceptor struct {
	deps actors.Deps
	w    Wiring
	reg  *Registry
	o    Options
	srv  *server
	log  zerolog.Logger

	accept  actors.Task // the accept loop
	control actors.Task // follows the control requests addressed to this node
	sub     *eventstream.Subscription
	// base is the context of admin requests in flight; Stopping cancels it.
	base   context.Context
	cancel context.CancelFunc
	// handling are the control requests being carried out, by id.
	handling map[string]bool
}

func newAcceptor(deps actors.Deps, w Wiring, reg *Registry, o Options) *acceptor {
	log := deps.Logger.With().Str("actor", Acceptor).Logger()
	var clu *cluster.Registry
	if deps.Store != nil {
		clu = cluster.New(deps.Store, cluster.Options{})
	}
	return &acceptor{deps: deps, w: w, reg: reg, o: o, log: log, handling: map[string]bool{},
		srv: &server{store: deps.RepJobs, cluster: clu, reg: reg, node: deps.NodeName(), log: log}}
}

// replicates reports whether this node runs jobs.
func (a *acceptor) replicates() bool {
	return a.deps.Config.HasNodeType(config.NodeTypeReplication) && a.deps.RepJobs != nil
}

func (a *acceptor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.started(ctx)
	case *actor.Stopping:
		// The loops return soon after their contexts end; the job actors
		// run on under jobs_sup.
		a.accept.Cancel()
		a.control.Cancel()
		if a.sub != nil {
			ctx.ActorSystem().EventStream.Unsubscribe(a.sub)
		}
		if a.cancel != nil {
			a.cancel()
		}
	case *scheduler.TickDone:
		for _, id := range m.Stopped {
			// A job that hibernated since the decision holds no slot: it
			// is not rotated.
			if e := a.reg.lookup(id); e != nil && !e.hibernated() {
				a.reg.stop(ctx.ActorSystem(), e, "rotation")
			}
		}
	case *scheduler.PolicyChanged:
		a.reg.wakeUp()
	case *controlRequest:
		a.carryOut(ctx, m.c)
	case *controlDone:
		delete(a.handling, m.id)
	case *messages.DrainRequest:
		// Stop taking slots, and leave the queue now: a waiting Accept
		// would otherwise take the very jobs the drain hands back. Once the
		// loop returned, every job it accepted is in the registry.
		a.reg.setPaused(true)
		a.accept.Stop(0)
		a.serve(ctx, func(c context.Context, system *actor.ActorSystem) (proto.Message, error) {
			return a.srv.drain(c, system)
		})
	case *messages.UndrainRequest:
		a.reg.setPaused(false)
		if !a.accept.Running() && a.replicates() {
			a.startLoop(ctx.ActorSystem(), ctx.Parent(), false)
		}
		a.serve(ctx, func(c context.Context, _ *actor.ActorSystem) (proto.Message, error) {
			return a.srv.undrain(c)
		})
	case *messages.ListJobsRequest, *messages.GetJobRequest, *messages.StopJobRequest, *messages.RestartJobRequest,
		*messages.PauseJobRequest, *messages.ResumeJobRequest, *messages.ResetJobRequest,
		*messages.CancelJobRequest, *messages.ReplicateRequest:
		a.serve(ctx, func(c context.Context, _ *actor.ActorSystem) (proto.Message, error) {
			return a.srv.handle(c, m.(proto.Message))
		})
	}
}

func (a *acceptor) started(ctx actor.Context) {
	system, self := ctx.ActorSystem(), ctx.Self()
	a.base, a.cancel = context.WithCancel(context.Background())
	a.reg.attach(system, a.w.Scheduler)
	a.sub = system.EventStream.Subscribe(func(evt any) {
		switch evt.(type) {
		case *scheduler.TickDone, *scheduler.PolicyChanged:
			system.Root.Send(self, evt)
		}
	})
	if !a.replicates() {
		a.log.Info().Msg("acceptor: not a replication node, accepting no jobs")
		return
	}
	a.reg.startup.SetLimit(a.deps.Config.Replicator.StartupConcurrency)
	a.reg.setHibernation(a.hibernation(system, ctx.Parent()))
	a.startLoop(system, ctx.Parent(), true)
	a.control.Go(func(c context.Context) { a.followControls(c, system, self) })
}

// serve answers an admin request from a goroutine (store I/O never runs in
// Receive): the reply, or an error.
func (a *acceptor) serve(ctx actor.Context, fn func(context.Context, *actor.ActorSystem) (proto.Message, error)) {
	sender, system, base := ctx.Sender(), ctx.ActorSystem(), a.base
	go func() {
		c, cancel := context.WithTimeout(base, requestTimeout)
		defer cancel()
		reply, err := fn(c, system)
		if sender == nil {
			return
		}
		if err != nil {
			system.Root.Send(sender, err)
			return
		}
		system.Root.Send(sender, reply)
	}()
}

// startLoop starts the accept loop; jobServer is the acceptor's parent,
// whose child jobs_sup runs the job actors.
func (a *acceptor) startLoop(system *actor.ActorSystem, jobServer *actor.PID, first bool) {
	jobsSup := actor.NewPID(jobServer.Address, jobServer.Id+"/"+JobsSup)
	a.accept.Go(func(c context.Context) { a.loop(c, system, jobsSup, first) })
}

// loop accepts jobs while there are free slots, until ctx ends. When the
// acceptor starts (first), it reads whether the node was left drained.
func (a *acceptor) loop(ctx context.Context, system *actor.ActorSystem, jobsSup *actor.PID, first bool) {
	store := a.deps.RepJobs
	if first && a.srv.cluster != nil {
		if drained, err := a.srv.cluster.Draining(ctx, a.deps.NodeName()); err != nil {
			a.log.Warn().Err(err).Msg("acceptor: could not read whether this node is drained; accepting jobs")
		} else if drained {
			a.reg.setPaused(true)
			a.log.Info().Msg("acceptor: this node is drained (couchrepctl undrain to accept jobs again)")
		}
	}
	maxJobs := func() int { return store.Policy().MaxJobs }
	retry := pause.Backoff{Min: minRetry, Max: maxRetry}
	fair := &fairShare{reg: a.srv.cluster, self: a.deps.NodeName(), now: time.Now}
	for ctx.Err() == nil {
		release, err := a.reg.acquire(ctx, maxJobs)
		if err != nil {
			return
		}
		// The free slots, up to acceptBatch, are filled from one store
		// transaction (repjob.Store.AcceptMany): a dead node's thousands
		// of jobs, or a start with thousands queued, were one accept
		// transaction each, one after the other. Nothing pending: the
		// loop waits for a job with one slot, as it did.
		releases := append([]func(){release}, a.reg.tryAcquire(maxJobs, acceptBatch-1)...)
		var runs []*repjob.Run
		if len(releases) > 1 {
			// At most this node's share of the pending jobs: the nodes
			// of a cluster take a burst in about equal parts.
			share := fair.next(ctx, a.reg.Held(), len(releases)+max(0, maxJobs()-a.reg.Running()))
			runs, err = store.AcceptMany(ctx, false, len(releases), share)
			switch {
			case errors.Is(err, jobqueue.ErrOverShare):
				for _, r := range releases {
					r()
				}
				fair.deferred()
				if pause.For(ctx, shareRetry) != nil {
					return
				}
				continue
			case share != nil && (err == nil || errors.Is(err, jobqueue.ErrNotFound)):
				fair.taken()
			}
		}
		if len(releases) == 1 || errors.Is(err, jobqueue.ErrNotFound) {
			for _, r := range releases[1:] {
				r()
			}
			releases = releases[:1]
			// A woken hibernated job may need the slot this wait holds (the
			// registry cancels the wait: yield); the job stays in the queue.
			actx, yield := context.WithCancel(ctx)
			a.reg.setAccepting(yield)
			var run *repjob.Run
			run, err = store.Accept(actx, true)
			a.reg.setAccepting(nil)
			yielded := actx.Err() != nil && ctx.Err() == nil
			yield()
			if err != nil && yielded {
				release()
				continue
			}
			if err == nil {
				runs = []*repjob.Run{run}
			}
		}
		if err != nil {
			for _, r := range releases {
				r()
			}
			if !retryAfter(ctx, &retry, a.log, err, "acceptor: accept failed") {
				return
			}
			continue
		}
		retry.Reset()
		for _, r := range releases[len(runs):] {
			r()
		}
		if !a.startAll(ctx, system, jobsSup, runs, releases) {
			return
		}
	}
}

// startAll starts the actors of a batch of accepted runs (releases[i] is
// runs[i]'s slot) and returns false when the loop must end. One run starts
// as start does; a batch's actors are started at once: jobs_sup queues the
// starts and runs them back to back, where one StartChild after the other
// cost the loop a round trip to jobs_sup per job (on a busy machine a few
// milliseconds each: the accept loop's own limit at thousands of jobs).
// Every run is started or handed back before startAll returns, so that
// once the loop returned every job it accepted is in the registry.
func (a *acceptor) startAll(ctx context.Context, system *actor.ActorSystem, jobsSup *actor.PID, runs []*repjob.Run, releases []func()) bool {
	if len(runs) == 1 {
		return a.start(ctx, system, jobsSup, runs[0], releases[0])
	}
	var (
		wg   sync.WaitGroup
		stop atomic.Bool
	)
	for i, run := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !a.start(ctx, system, jobsSup, run, releases[i]) {
				stop.Store(true)
			}
		}()
	}
	wg.Wait()
	return !stop.Load()
}

// handBack puts an accepted run whose actor never started back in the
// queue.
func (a *acceptor) handBack(run *repjob.Run) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := run.Stop(c); err != nil && !repjob.IsLost(err) {
		a.log.Warn().Err(err).Str("job_id", run.ID()).Msg("acceptor: resubmit failed; the activity monitor will")
	}
}

// acceptBatch bounds the jobs the accept loop takes in one store
// transaction.
const acceptBatch = 64

// start starts the actor of accepted run (see startJob); if it cannot, the
// job goes back to the queue. It returns false when the loop must end.
func (a *acceptor) start(ctx context.Context, system *actor.ActorSystem, jobsSup *actor.PID, run *repjob.Run, release func()) bool {
	if err := a.startJob(ctx, system, jobsSup, run, release); err != nil {
		a.log.Warn().Err(err).Str("job_id", run.ID()).Msg("acceptor: could not start the job actor; job back to the queue")
		a.handBack(run)
		if errors.Is(err, supervisor.ErrAlreadyStarted) && pause.For(ctx, minRetry) != nil {
			return false
		}
	}
	return true
}

// startJob starts the actor of an accepted job under jobs_sup and registers
// it; the actor leaves the registry and gives its slot back when it stops.
func (a *acceptor) startJob(ctx context.Context, system *actor.ActorSystem, jobsSup *actor.PID, run *repjob.Run, release func()) error {
	name := jobrunner.Name(run.ID())
	if old := a.reg.lookup(run.ID()); old != nil {
		// The job was taken again before its previous actor exited (a stop
		// or restart in quick succession: the actor hands the job back
		// before it stops; or a lost lease re-acquired). The store gave this
		// node a new run, so the old one is over: stop its actor and start
		// the new one once it has exited (jobs_sup, in turn, waits for the
		// exit it has not handled yet), rather than fail the start.
		a.log.Info().Str("job_id", run.ID()).Uint64("old_run", old.run).Uint64("run", run.Generation()).
			Msg("acceptor: job taken again before its previous actor exited; waiting for it")
		select {
		case <-a.reg.stop(system, old, "superseded"):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	e, exited := a.reg.add(run.ID(), run.Generation(), run.Record().GetContinuous(),
		actor.NewPID(jobsSup.Address, jobsSup.Id+"/"+name), release)
	if err := a.spawn(ctx, system, jobsSup, e, run, nil, exited); err != nil {
		return err
	}
	a.reg.spawned(system, e)
	return nil
}

// spawn starts the actor of e's run under jobs_sup (rs: the wake-up of a
// hibernated job, nil for an accepted one); exited is its Released.
func (a *acceptor) spawn(ctx context.Context, system *actor.ActorSystem, jobsSup *actor.PID, e *entry, run *repjob.Run,
	rs *jobrunner.Resume, exited func()) error {
	// The run belongs to whoever claims it first: the actor when it starts,
	// or this function when StartChild fails. StartChild can fail after the
	// actor started (it timed out), and then the actor hands the run back
	// itself.
	var claimed atomic.Bool
	claim := func() bool { return claimed.CompareAndSwap(false, true) }
	jo := jobrunner.Options{
		Store: a.deps.RepJobs, Node: a.deps.NodeName(), ServerUUID: a.deps.Config.CouchDB.UUID,
		Logger: a.deps.Logger, Released: exited, Claim: claim, Pool: a.w.Pool, Limits: limitsOf(a.deps.Config),
		Endpoints: replicate.EndpointConfigFrom(a.deps.Config.Replicator), Timers: a.deps.Timers,
		JobDefaults:         replicate.JobDefaults(a.deps.Config.Replicator),
		MaxDocumentIDLength: a.deps.Config.Replicator.MaxDocumentIDLength,
		MissingDocRetry:     a.deps.Config.Replicator.MissingDocRetry,
		Feeds:               a.w.Feeds,
		Startup:             a.reg.startup.Acquire,
		StartupRequests:     a.reg.startup.Request,
		Infos:               a.reg.infos,
		DBUpdates:           a.w.DBUpdates,
		Rechecks:            a.w.Rechecks,
		Hibernate:           a.reg.hibernateFunc(e),
		Resume:              rs,
	}
	if m := a.deps.Metrics; m != nil {
		jo.Transport, jo.OnEvent = m.Transport, m.ObserveEngine
		jo.OnCounted = func(id string, s replicate.Stats) {
			m.ObserveCounted(id, httpapi.JobCounters{DocsRead: s.DocsRead, DocsWritten: s.DocsWritten,
				DocWriteFailures: s.DocWriteFailures, MissingRevisionsFound: s.MissingRevisionsFound, RevisionsChecked: s.RevisionsChecked})
		}
	}
	if a.w.Limiter != nil {
		jo.Limiter = ratelimiter.At(system, a.w.Limiter)
	}
	if !a.o.NoJitter && rs == nil {
		jo.StartupDelay = a.deps.RepJobs.Policy().StartupDelay(nil)
	}
	if a.o.JobOptions != nil {
		a.o.JobOptions(&jo)
	}
	// A start under way is finished even when the loop is stopped (a drain,
	// the acceptor stopping): the job is in the registry, so a drain stops
	// it once it runs and counts it among the jobs it released, rather than
	// lose it half-started. StartChild ends if jobs_sup stops.
	sc, cancel := context.WithTimeout(context.WithoutCancel(ctx), startTimeout)
	defer cancel()
	if _, err := supervisor.StartChild(sc, system, jobsSup, jobrunner.Name(run.ID()), jobrunner.Props(run, jo)); err != nil && claim() {
		exited()
		return err
	}
	return nil
}

// hibernation is how the registry wakes this node's hibernated jobs: an
// actor under jobs_sup (found by name: it may have been restarted since
// the job went to sleep).
func (a *acceptor) hibernation(system *actor.ActorSystem, jobServer *actor.PID) hibernation {
	jobsSup := actor.NewPID(jobServer.Address, jobServer.Id+"/"+JobsSup)
	return hibernation{
		spawn: func(ctx context.Context, e *entry, run *repjob.Run, rs *jobrunner.Resume) error {
			return a.spawn(ctx, system, jobsSup, e, run, rs, a.reg.exitedFunc(e))
		},
		pid: func(id string) *actor.PID {
			return actor.NewPID(jobsSup.Address, jobsSup.Id+"/"+jobrunner.Name(id))
		},
		maxJobs:  func() int { return a.deps.RepJobs.Policy().MaxJobs },
		rechecks: a.w.Rechecks,
		timers:   a.deps.Timers,
		node:     a.deps.NodeName(),
		log:      a.log,
	}
}

// startTimeout bounds the start of a job actor (jobs_sup may first wait for
// the exit of the job's previous actor, at most its shutdown timeout).
const startTimeout = jobrunner.StopTimeout + time.Minute

// followControls hands the control requests addressed to this node to the
// actor, now and whenever a new one arrives, until ctx ends.
func (a *acceptor) followControls(ctx context.Context, system *actor.ActorSystem, self *actor.PID) {
	retry := pause.Backoff{Min: minRetry, Max: maxRetry}
	for ctx.Err() == nil {
		cs, w, err := a.deps.RepJobs.Controls(ctx, a.deps.NodeName())
		if err != nil {
			if !retryAfter(ctx, &retry, a.log, err, "acceptor: reading control requests failed") {
				return
			}
			continue
		}
		retry.Reset()
		for _, c := range cs {
			system.Root.Send(self, &controlRequest{c: c})
		}
		_ = w.Wait(ctx)
		w.Cancel()
	}
}

// controlRetry is how soon a request for a job that the store says runs
// here, but whose actor is not (yet) registered, is looked at again.
const controlRetry = 200 * time.Millisecond

// carryOut stops the job actor a control request names and clears the
// request once the actor has exited. A stop or restart for a job that does
// not run here is cleared if its run ended, else looked at again shortly:
// the acceptor may be registering the job's actor right now.
func (a *acceptor) carryOut(ctx actor.Context, c *messages.JobControl) {
	if a.handling[c.GetId()] {
		return
	}
	a.handling[c.GetId()] = true
	system, self, base, store := ctx.ActorSystem(), ctx.Self(), a.base, a.deps.RepJobs
	clear := func() {
		cc, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := store.ClearControl(cc, c); err != nil {
			a.log.Warn().Err(err).Str("job_id", c.GetJobId()).Msg("acceptor: clear control request")
		}
		system.Root.Send(self, &controlDone{id: c.GetId()})
	}
	e := a.reg.lookup(c.GetJobId())
	if (e == nil || e.run != c.GetRun()) && c.GetAction() == messages.JobControl_ACTION_CANCEL {
		// The job is already canceled or removed in the store: an actor
		// about to start for it fails its first write and exits.
		go clear()
		return
	}
	if e == nil || e.run != c.GetRun() {
		go func() {
			cc, cancel := context.WithTimeout(base, 10*time.Second)
			stale, err := store.Stale(cc, c)
			cancel()
			if err == nil && stale {
				clear()
				return
			}
			if pause.For(base, controlRetry) == nil {
				system.Root.Send(self, &controlDone{id: c.GetId()})
				system.Root.Send(self, &controlRequest{c: c})
			}
		}()
		return
	}
	reason := map[messages.JobControl_Action]string{messages.JobControl_ACTION_STOP: "operator",
		messages.JobControl_ACTION_RESTART: "restart", messages.JobControl_ACTION_CANCEL: "canceled",
		messages.JobControl_ACTION_PAUSE: jobrunner.StopPaused, messages.JobControl_ACTION_RESET: jobrunner.StopReset}[c.GetAction()]
	a.log.Info().Str("job_id", c.GetJobId()).Str("reason", reason).Str("requested_by", c.GetRequestedBy()).
		Msg("acceptor: stopping a job on request")
	done := a.reg.stop(system, e, reason)
	go func() {
		select {
		case <-done:
			clear()
		case <-base.Done():
		}
	}()
}

// minRetry and maxRetry bound the delay before a failed store call is
// tried again.
const (
	minRetry = 100 * time.Millisecond
	maxRetry = 10 * time.Second
)

// retryAfter logs err and waits the next delay of retry (the doubling
// wait between retries of a failing store call, from minRetry up to
// maxRetry); false, without a word, if ctx ended (the error is then the
// shutdown's).
func retryAfter(ctx context.Context, retry *pause.Backoff, log zerolog.Logger, err error, msg string) bool {
	if ctx.Err() != nil {
		return false
	}
	d := retry.Next()
	log.Warn().Err(err).Dur("retry_in", d).Msg(msg)
	return pause.For(ctx, d) == nil
}

// limitsOf is what a job's endpoints may send, from [replicator].
func limitsOf(c config.Config) couch.Limits {
	return couch.Limits{
		MaxDocumentBytes: int64(c.Replicator.MaxDocumentBytes),
		MaxLineBytes:     int64(c.Replicator.MaxChangesRowBytes),
		MaxBodyBytes:     int64(c.Replicator.MaxResponseBytes),
	}
}
