// Package activitymonitor is the activity_monitor actor: it re-enqueues jobs
// whose worker went silent past their type's activity timeout (a node that
// died, a job actor that hangs). It wraps jobs.Monitor, whose checks are
// transactions that re-check each job, so it is safe on every node at once.
package activitymonitor

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "activity_monitor"

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: Props(deps.Jobs, deps.RepJobs, deps.Logger, jobqueue.MonitorOptions{})}
}

// Props returns the actor's props: it runs queue's activity monitor with
// opts, after registering the replication job type (if store is set) so that
// its timeout is known from the start.
//
// The monitor (its activity samples) outlives the actor, as the job
// server's slot count outlives the acceptor: a job is stale once its
// activity is older than a sample taken a whole timeout ago, so a monitor
// that forgot its samples at every restart (of itself, or of any actor
// before it under the rest_for_one root) would leave a dead node's jobs
// alone for a whole extra timeout after each restart — forever, if restarts
// come more often than the timeout.
func Props(queue *jobqueue.Queue, store *repjob.Store, log zerolog.Logger, opts jobqueue.MonitorOptions) *actor.Props {
	var mon *jobqueue.Monitor
	if queue != nil {
		mon = queue.NewMonitor(opts)
	}
	return actors.Props(func() actor.Actor {
		return &monitor{q: queue, mon: mon, store: store, log: log.With().Str("actor", Name).Logger()}
	})
}

type monitor struct {
	q     *jobqueue.Queue
	mon   *jobqueue.Monitor
	store *repjob.Store
	log   zerolog.Logger
	task  actors.Task
}

func (m *monitor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		if m.q == nil {
			return
		}
		m.task.Go(func(c context.Context) {
			if m.store != nil {
				if err := m.store.Init(c); err != nil && c.Err() == nil {
					m.log.Warn().Err(err).Msg("activity monitor: register replication job type")
				}
			}
			if err := m.mon.Run(c); err != nil {
				m.log.Warn().Err(err).Msg("activity monitor stopped")
			}
		})
		m.log.Debug().Msg("activity monitor started")
	case *actor.Stopping:
		// The next incarnation runs the same monitor: one at a time.
		m.task.Stop(0)
	}
}
