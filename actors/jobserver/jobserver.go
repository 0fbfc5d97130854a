// Package jobserver is the job_server: the one owner of the replication
// jobs running on this node. It is a supervisor with two children:
//
//	job_server (rest_for_one)
//	├── jobs_sup (simple_one_for_one, temporary): one replication job actor per running job
//	└── acceptor: the job server's actor
//
// The acceptor keeps the Registry of the job actors running here (it
// outlives the acceptor's incarnations, so a restarted acceptor still knows
// them), and everything that starts or stops them goes through it:
//
//   - accepting: while this node has a free slot (max_jobs) and is not
//     drained, it waits in the queue (repjob.Store.Accept with wait: woken
//     by the queue's watches, not by polling) and starts one job actor per
//     accepted job under jobs_sup;
//   - the scheduler's decisions: the scheduler, started before the job
//     server, is told which jobs run here (JobStarted, JobExited) and
//     publishes its rotation decisions on the node's event stream
//     (scheduler.TickDone), which the acceptor carries out;
//   - job control from any node: the admin requests for jobs (list, show,
//     stop, restart, cancel, replicate) are answered here; a stop, restart
//     or cancel of a running job is written to the store addressed to the
//     node running it (repjob.RequestControl), and that node's acceptor,
//     which follows the requests addressed to it, stops the job actor and
//     clears the request;
//   - drain and undrain: the node's drain flag is persisted in its
//     membership record (internal/cluster), so a drained node that restarts
//     stays drained.
//
// On nodes without the replication node type the acceptor accepts nothing
// but still answers job requests.
package jobserver

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/sharedfeed"
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

// Wiring is what the job server uses of the actors started before it,
// given at spawn time: it finds none of them by name.
type Wiring struct {
	// Scheduler is told which jobs run here; nil tells nobody.
	Scheduler *actor.PID
	// Pool is the node's connection_pool: job actors take their HTTP
	// clients from leases of it. Nil: each job uses the engine's own pool.
	Pool *actor.PID
	// Limiter is the node's rate_limiter; nil: no shared rate limiting.
	Limiter *actor.PID
	// Feeds is the node's hub of shared changes feeds ([replicator]
	// share_changes_feeds); nil: every job reads a feed of its own.
	Feeds *sharedfeed.Hub
	// DBUpdates is the node's hub of _db_updates feeds ([replicator]
	// use_db_updates), which wakes parked jobs; nil: no job parks.
	DBUpdates *dbupdates.Hub
	// Rechecks paces the safety net of the node's parked jobs
	// (park_recheck); nil: each job paces its own.
	Rechecks *park.Rechecks
}

// Options tune the acceptor (tests).
type Options struct {
	// JobOptions adjusts each job actor's options before it starts.
	JobOptions func(*jobrunner.Options)
	// NoJitter starts jobs without startup_jitter.
	NoJitter bool
}

// Spec returns the job server's child spec in the node's supervision tree.
// reg is its registry (NewRegistry), which outlives the job server's
// incarnations.
func Spec(deps actors.Deps, w Wiring, reg *Registry, opts ...Options) supervisor.ChildSpec {
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
							Shutdown: jobrunner.StopTimeout + 5*time.Second}},
					},
				},
				{Name: Acceptor, Props: AcceptorProps(deps, w, reg, opts...)},
			},
		},
	}
}

// AcceptorProps returns the acceptor's props; reg must outlive the acceptor
// (one per job server).
func AcceptorProps(deps actors.Deps, w Wiring, reg *Registry, opts ...Options) *actor.Props {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	return actors.Props(func() actor.Actor {
		return newAcceptor(deps, w, reg, o)
	}, actors.Handles(&messages.DrainRequest{}, &messages.UndrainRequest{},
		&messages.ListJobsRequest{}, &messages.GetJobRequest{}, &messages.StopJobRequest{},
		&messages.RestartJobRequest{}, &messages.CancelJobRequest{}, &messages.ReplicateRequest{},
		&messages.PauseJobRequest{}, &messages.ResumeJobRequest{}, &messages.ResetJobRequest{}))
}
