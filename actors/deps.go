package actors

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/docproc"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/timerwheel"
)

// RootName is the actor id of a node's top supervisor; the node's actors are
// its children, so "connection_pool" is "couchrep_sup/connection_pool".
const RootName = "couchrep_sup"

// Deps are the node-wide services the node hands to every actor it spawns.
// They outlive every actor: the node opens them before its supervision tree
// starts and closes them after it stopped.
type Deps struct {
	// Config is the node's configuration.
	Config config.Config
	// Logger is the node's logger; actors add their own fields.
	Logger zerolog.Logger
	// System is the actor system the node runs in.
	System *actor.ActorSystem
	// Store is the shared job store.
	Store kv.Database
	// Jobs is the job queue over Store.
	Jobs *jobqueue.Queue
	// RepJobs is the replication job store over Jobs, shared by every actor
	// of the node (run-time share and policy changes reach all of them).
	RepJobs *repjob.Store
	// Request delivers an admin message as the node's admin endpoint does
	// (couchrep.Node.Request); nil outside a node. Call it from a goroutine
	// of one's own, never from Receive: it may ask other actors.
	Request func(ctx context.Context, msg proto.Message) (proto.Message, error)
	// Metrics are the node's Prometheus metrics (served by the HTTP API);
	// nil outside a node.
	Metrics *httpapi.Metrics
	// Competition is what the doc processor found about competing
	// replicators on the watched servers (GET /_up, couchrepctl nodes);
	// nil outside a node.
	Competition *docproc.Competition
	// Timers is the node's timer wheel: the periodic work of its running
	// jobs (checkpoints, progress) shares one runtime timer; nil outside a
	// node (timerwheel.Default()).
	Timers *timerwheel.Wheel
	// Slots is the node's free job slots: the scheduler keeps it, the
	// clustering actor's heartbeat publishes it for the other nodes'
	// schedulers (schedpolicy.RotateIn); nil outside a node.
	Slots *schedpolicy.FreeSlots
	// Held tells how many jobs the node holds (its job registry: running
	// and hibernated parked jobs); the clustering actor's heartbeat
	// publishes it for the other nodes' accept loops
	// (schedpolicy.AcceptShare); nil outside a node.
	Held func() int
}

// NodeName is the node's name, as recorded in the jobs it runs.
func (d Deps) NodeName() string { return d.Config.Couchrep.NodeName }
