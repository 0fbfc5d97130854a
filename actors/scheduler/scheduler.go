// Package scheduler is the scheduler actor: fair-share priorities, backoff
// and the periodic rotation decisions (max_jobs, max_churn, interval) for
// this node's jobs. It decides what should run; the job server, started
// after it, carries the decisions out.
//
// The job server tells it which jobs run here (JobStarted, JobExited: the
// scheduler never talks to a job actor). Every interval it counts the due
// pending jobs in the queue (bounded by max_jobs + max_churn, so the work
// does not grow with the queue), removes expired finished transient jobs and
// stale job control requests, and asks schedpolicy.RotateIn which of this
// node's longest-running continuous jobs to stop: in a cluster, only a node
// whose slots are all taken rotates, and only for the pending jobs beyond
// the other live nodes' free slots (their membership records carry them;
// this node's are kept in Options.Slots for its heartbeat). It publishes the decision
// (TickDone) on the node's event stream; the job server stops those jobs,
// which checkpoint and go back to the queue with a fresh fair-share
// deadline, and its acceptor fills the freed slots. One-shot jobs are never
// rotated out. It also changes shares and max_jobs/max_churn at run time
// (SetSharesRequest, SetConfigRequest; a policy change is published as
// PolicyChanged).
package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/share"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "scheduler"

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	o := Options{
		Disabled: !deps.Config.HasNodeType(config.NodeTypeReplication) || deps.RepJobs == nil,
		Slots:    deps.Slots,
	}
	if deps.Store != nil {
		o.Peers = PeersFrom(cluster.New(deps.Store, cluster.Options{}), deps.NodeName())
	}
	return supervisor.ChildSpec{Name: Name, Props: Props(deps.RepJobs, deps.Logger, o)}
}

// PeersFrom returns a Peers function reading the other live replication
// nodes' free slots from their membership records (cluster.Registry.Members:
// one read of the node records, so a tick's cost grows with the nodes, not
// with the jobs). A drained node has no free slots and takes no part in
// rotation; one whose record carries no free slots (no scheduler published
// them yet) counts as full.
func PeersFrom(reg *cluster.Registry, self string) func(context.Context) (schedpolicy.Peers, error) {
	return func(ctx context.Context) (schedpolicy.Peers, error) {
		members, err := reg.Members(ctx)
		if err != nil {
			return schedpolicy.Peers{}, err
		}
		var p schedpolicy.Peers
		for _, m := range members {
			if !m.Alive || m.GetName() == self || !slices.Contains(m.GetTypes(), config.NodeTypeReplication) {
				continue
			}
			p.N++
			switch {
			case m.GetDraining():
			case m.GetFreeSlots() > 0:
				p.Free += int(m.GetFreeSlots())
			default:
				p.Full++
				if m.GetName() < self {
					p.FullBefore++
				}
			}
		}
		return p, nil
	}
}

// Options tune the scheduler actor.
type Options struct {
	// Clock tells the time; nil is the system clock.
	Clock schedpolicy.Clock
	// Manual disables the interval timer: ticks come only from Tick
	// messages (tests).
	Manual bool
	// Disabled makes the actor do nothing but answer (non-replication nodes).
	Disabled bool
	// Slots, if set, is kept at this node's free slots (max_jobs minus the
	// jobs running here), for the heartbeat to publish.
	Slots *schedpolicy.FreeSlots
	// Peers, if set, tells the other live replication nodes' free slots;
	// a tick with pending jobs asks it, and rotates as
	// schedpolicy.RotateIn. Nil: the node is alone (schedpolicy.Rotate).
	Peers func(context.Context) (schedpolicy.Peers, error)
}

// Tick makes the scheduler reschedule now (the timer sends it every
// interval).
type Tick struct{}

// TickDone is the scheduler's decision, published on the node's event
// stream after each reschedule: the job server stops the jobs in Stopped.
type TickDone struct {
	// Pending is the (bounded) count of due pending jobs seen.
	Pending int
	// Running is how many jobs ran here when the decision was taken.
	Running int
	// Stopped are the jobs to stop (rotation).
	Stopped []string
	// Peers is what the decision knew of the other live nodes.
	Peers schedpolicy.Peers
}

// PolicyChanged is published on the node's event stream when max_jobs or
// max_churn changed: the job server's acceptor re-reads max_jobs.
type PolicyChanged struct{}

// JobStarted tells the scheduler that a job actor started on this node; the
// job server sends it.
type JobStarted struct {
	ID         string
	Continuous bool
}

// JobExited tells the scheduler that a job's actor on this node exited; the
// job server sends it. A parked job that hibernated (its actor gone, the job
// still running) exits too: it takes no slot and is never rotated.
type JobExited struct{ ID string }

// WokenWaiting tells the scheduler how many hibernated parked jobs of this
// node were woken up (their source changed) and wait for a slot: it counts
// them with the due pending jobs, so that a node whose slots are all taken
// rotates active jobs out for them (max_churn per interval) as it does for
// pending ones. The job server sends it.
type WokenWaiting struct{ N int }

type pendingCount struct {
	n     int
	peers schedpolicy.Peers
	err   error
}

type entry struct {
	continuous bool
	started    time.Time
	// stopping: the decision to stop it was published at stopAt; if the
	// job still runs two intervals later (the job server missed the
	// decision while restarting), it is a candidate again.
	stopping bool
	stopAt   time.Time
}

// Props returns the scheduler actor's props.
func Props(store *repjob.Store, log zerolog.Logger, o Options) *actor.Props {
	return actors.Props(func() actor.Actor {
		if o.Clock == nil {
			o.Clock = schedpolicy.SystemClock{}
		}
		return &schedActor{store: store, o: o, log: log.With().Str("actor", Name).Logger(),
			running: map[string]*entry{}}
	}, actors.Handles(&messages.GetSharesRequest{}, &messages.SetSharesRequest{}, &messages.SetConfigRequest{},
		&messages.SchedulerStatusRequest{}))
}

type schedActor struct {
	store   *repjob.Store
	o       Options
	log     zerolog.Logger
	running map[string]*entry
	// woken: hibernated jobs woken up, waiting for a slot (WokenWaiting).
	woken   int
	cancel  context.CancelFunc
	busy    bool
	ticks   int64
	rotated int64
}

func (a *schedActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.setSlots()
		c, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		if !a.o.Manual && !a.o.Disabled {
			go a.timer(c, ctx.ActorSystem(), ctx.Self())
		}
	case *actor.Stopping:
		if a.cancel != nil {
			a.cancel()
		}
	case *JobStarted:
		a.running[m.ID] = &entry{continuous: m.Continuous, started: a.o.Clock.Now()}
		a.setSlots()
	case *JobExited:
		delete(a.running, m.ID)
		a.setSlots()
	case *WokenWaiting:
		a.woken = m.N
	case Tick, *Tick:
		a.tick(ctx)
	case pendingCount:
		a.decide(ctx, m)
	case *messages.SchedulerStatusRequest:
		p := a.store.Policy()
		resp := &messages.SchedulerStatusResponse{MaxJobs: int32(p.MaxJobs), MaxChurn: int32(p.MaxChurn),
			Ticks: a.ticks, Rotated: a.rotated}
		for id, e := range a.running {
			if !e.stopping {
				resp.Running = append(resp.Running, id)
			}
		}
		sort.Strings(resp.Running)
		ctx.Respond(resp)
	case *messages.GetSharesRequest:
		ctx.Respond(&messages.GetSharesResponse{Shares: toU32(a.store.Shares()), DefaultShares: share.DefaultShares})
	case *messages.SetSharesRequest:
		in := map[string]int{}
		for k, v := range m.GetShares() {
			in[k] = int(v)
		}
		kept := a.store.SetShares(in)
		a.log.Info().Interface("shares", kept).Msg("scheduler: shares changed")
		ctx.Respond(&messages.SetSharesResponse{Shares: toU32(kept), DefaultShares: share.DefaultShares})
	case *messages.SetConfigRequest:
		ctx.Respond(a.setConfig(ctx.ActorSystem(), m))
	}
}

// setConfig changes max_jobs/max_churn and publishes PolicyChanged; it
// answers the policy in force, or an error wrapping actors.ErrInvalidRequest.
func (a *schedActor) setConfig(system *actor.ActorSystem, m *messages.SetConfigRequest) any {
	if (m.MaxJobs != nil && m.GetMaxJobs() == 0) || (m.MaxChurn != nil && m.GetMaxChurn() == 0) {
		return fmt.Errorf("%w: max_jobs and max_churn must be at least 1", actors.ErrInvalidRequest)
	}
	p := a.store.Policy()
	if m.MaxJobs != nil {
		p.MaxJobs = int(m.GetMaxJobs())
	}
	if m.MaxChurn != nil {
		p.MaxChurn = int(m.GetMaxChurn())
	}
	if err := a.store.SetPolicy(p); err != nil {
		got := a.store.Policy()
		return fmt.Errorf("%w: the scheduler refused the change (in force: max_jobs %d, max_churn %d): %w",
			actors.ErrInvalidRequest, got.MaxJobs, got.MaxChurn, err)
	}
	p = a.store.Policy()
	a.setSlots()
	a.log.Info().Int("max_jobs", p.MaxJobs).Int("max_churn", p.MaxChurn).Msg("scheduler: config changed")
	system.EventStream.Publish(&PolicyChanged{})
	return &messages.SetConfigResponse{MaxJobs: uint32(p.MaxJobs), MaxChurn: uint32(p.MaxChurn)}
}

// setSlots publishes this node's free slots (Options.Slots).
func (a *schedActor) setSlots() {
	if a.o.Slots != nil && !a.o.Disabled {
		a.o.Slots.Set(a.store.Policy().MaxJobs - len(a.running))
	}
}

func toU32(m map[string]int) map[string]uint32 {
	out := make(map[string]uint32, len(m))
	for k, v := range m {
		out[k] = uint32(v)
	}
	return out
}

// timer sends Tick every interval (re-read each time: it can change).
func (a *schedActor) timer(ctx context.Context, system *actor.ActorSystem, self *actor.PID) {
	for pause.For(ctx, a.store.Policy().Interval) == nil {
		system.Root.Send(self, Tick{})
	}
}

// tick counts the pending jobs in a goroutine (store I/O never runs in
// Receive); decide acts on the count.
func (a *schedActor) tick(ctx actor.Context) {
	if a.busy || a.o.Disabled {
		return
	}
	a.busy = true
	p := a.store.Policy()
	limit := p.MaxJobs + p.MaxChurn
	store, self, system := a.store, ctx.Self(), ctx.ActorSystem()
	go func() {
		c, cancel := context.WithTimeout(context.Background(), p.Interval+10*time.Second)
		defer cancel()
		if n, err := store.CleanupTransient(c); err != nil {
			a.log.Warn().Err(err).Msg("scheduler: transient job cleanup failed")
		} else if n > 0 {
			a.log.Info().Int("removed", n).Msg("scheduler: removed expired transient jobs")
		}
		if n, err := store.CleanupControls(c); err != nil {
			a.log.Warn().Err(err).Msg("scheduler: control request cleanup failed")
		} else if n > 0 {
			a.log.Info().Int("removed", n).Msg("scheduler: removed stale job control requests")
		}
		pc := pendingCount{}
		pc.n, pc.err = store.PendingCount(c, limit)
		if pc.err == nil && pc.n > 0 && a.o.Peers != nil {
			// Without the peers' slots, no rotation: pending jobs the
			// other nodes would take are no reason to stop jobs here.
			if pc.peers, pc.err = a.o.Peers(c); pc.err != nil {
				pc.err = fmt.Errorf("scheduler: read the other nodes' free slots: %w", pc.err)
			}
		}
		system.Root.Send(self, pc)
	}()
}

func (a *schedActor) decide(ctx actor.Context, pc pendingCount) {
	a.busy = false
	a.ticks++
	if pc.err != nil {
		a.log.Warn().Err(pc.err).Msg("scheduler: pending count failed")
		return
	}
	now := a.o.Clock.Now()
	p := a.store.Policy()
	running := make([]schedpolicy.RunningJob, 0, len(a.running))
	for id, e := range a.running {
		if e.stopping && now.Sub(e.stopAt) > 2*p.Interval {
			e.stopping = false
		}
		if e.stopping {
			continue
		}
		running = append(running, schedpolicy.RunningJob{ID: id, Continuous: e.continuous, Started: e.started})
	}
	d := schedpolicy.RotateIn(running, pc.n, a.woken, pc.peers, p, now)
	for _, id := range d.Stop {
		e := a.running[id]
		e.stopping, e.stopAt = true, now
	}
	a.rotated += int64(len(d.Stop))
	if len(d.Stop) > 0 {
		a.log.Debug().Int("pending", pc.n).Int("peers", pc.peers.N).Int("peers_free", pc.peers.Free).Int("running", len(running)).Strs("stopped", d.Stop).Msg("scheduler: rotated")
	}
	ctx.ActorSystem().EventStream.Publish(&TickDone{Pending: pc.n, Running: len(running), Stopped: d.Stop, Peers: pc.peers})
}
