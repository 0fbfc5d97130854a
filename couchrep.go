// Package couchrep runs a couchrep node: the replicator's supervision tree of
// actors, started inside the calling program.
//
// A node is what the couchrepd daemon runs; Start gives the same node to a Go
// program that wants to embed one. Admin requests (the protobuf messages of
// package messages) are sent to a node with Node.Request, which is also the
// code path of the node's admin endpoint that couchrepctl talks to.
package couchrep

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/activitymonitor"
	"github.com/couchrep/couchrep/actors/clustering"
	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/actors/docprocessor"
	"github.com/couchrep/couchrep/actors/eventbus"
	"github.com/couchrep/couchrep/actors/httpserver"
	"github.com/couchrep/couchrep/actors/jobserver"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/actors/router"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/docproc"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	clog "github.com/couchrep/couchrep/internal/log"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/internal/sharedfeed"
	"github.com/couchrep/couchrep/internal/timerwheel"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// RootName is the name of a node's top supervisor.
const RootName = actors.RootName

// Sentinel errors callers branch on (the actors answering requests return
// these very values).
var (
	// ErrUnknownActor is returned for a request naming an actor the node
	// does not have.
	ErrUnknownActor = actors.ErrUnknownActor
	// ErrUnknownRequest is returned for a message type no actor handles.
	ErrUnknownRequest = actors.ErrUnknownRequest
	// ErrStopped is returned by requests to a node that has stopped.
	ErrStopped = actors.ErrStopped
	// ErrInvalidRequest is returned for a request whose fields are wrong
	// (an invalid replication, max_jobs 0, ...).
	ErrInvalidRequest = actors.ErrInvalidRequest
	// ErrJobNotFound is returned for a job id or replication id no job has.
	ErrJobNotFound = actors.ErrJobNotFound
	// ErrJobNotRunning is returned for stopping a job that is not running.
	ErrJobNotRunning = actors.ErrJobNotRunning
	// ErrJobElsewhere is returned for stopping or restarting a job that
	// runs on another node which is not alive or did not carry out the
	// request in time; the error names that node.
	ErrJobElsewhere = actors.ErrJobElsewhere
	// ErrJobFollowsDocument is returned for canceling the job of a
	// _replicator document: only its document ends it (deleted or
	// changed), as in CouchDB.
	ErrJobFollowsDocument = actors.ErrJobFollowsDocument
	// ErrNodeNameInUse is returned by Start when a live node of the store
	// has the node's name; the error (a *cluster.NameInUseError) names
	// the process holding it and when its membership lease expires.
	ErrNodeNameInUse = cluster.ErrNameInUse
	// ErrUUIDMismatch is returned by Start when [couchdb] uuid differs
	// from the server uuid recorded in the job store (or the data
	// directory); the error says both and how to proceed.
	ErrUUIDMismatch = cluster.ErrUUIDMismatch
)

// Config is a node's configuration: the same settings couchrepd reads from
// its ini file, flags and environment.
type Config = config.Config

// DefaultConfig returns the configuration with CouchDB's defaults.
func DefaultConfig() Config { return config.Default() }

// Option customises Start.
type Option func(*options)

type options struct {
	logger zerolog.Logger
	system *actor.ActorSystem
	store  kv.Database
}

// WithLogger sets the logger the node and all its actors log to.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithActorSystem runs the node's actors in an existing protoactor actor
// system instead of a new one. The node never shuts that system down.
func WithActorSystem(s *actor.ActorSystem) Option { return func(o *options) { o.system = s } }

// WithStore runs the node on an already open job store (see OpenStore)
// instead of opening the embedded store at the configured path. The node
// never closes it; several nodes may share one store, as node processes
// share one store file.
func WithStore(s *Store) Option {
	return func(o *options) {
		if s != nil {
			o.store = s.db
		}
	}
}

// Node is a running couchrep node.
type Node struct {
	cfg       Config
	log       zerolog.Logger
	system    *actor.ActorSystem
	ownSystem bool
	sup       *supervisor.Supervisor
	events    *eventstream.Subscription
	deps      actors.Deps
	ownStore  bool
	jobs      *jobserver.Registry
	// feeds are the node's shared changes feeds (nil when
	// share_changes_feeds is off).
	feeds *sharedfeed.Hub
	// dbUpdates are the node's _db_updates feeds that wake parked jobs
	// (nil when use_db_updates is off).
	dbUpdates *dbupdates.Hub
	// rechecks paces the safety net of the node's parked jobs.
	rechecks *park.Rechecks
	router   *router.Router

	stopOnce sync.Once
	stopped  chan struct{}
	stopErr  error
	// stopLease ends the node's lease on its jobs (repjob.Store.KeepLease)
	// and waits for it to close.
	stopLease func()
	// uuidChange is set when this start replaced the recorded server uuid.
	uuidChange *UUIDChange
}

// Start starts a node and returns once its whole supervision tree is running.
func Start(ctx context.Context, cfg Config, opts ...Option) (*Node, error) {
	o := options{logger: zerolog.Nop()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("couchrep: invalid config: %w", err)
	}
	if cfg.Couchrep.NodeName == "" || cfg.CouchDB.UUID == "" || cfg.Couchrep.Store == "" {
		if err := cfg.Complete(); err != nil {
			return nil, fmt.Errorf("couchrep: %w", err)
		}
	}
	n := &Node{cfg: cfg, log: o.logger.With().Str("node", cfg.Couchrep.NodeName).Logger(), system: o.system,
		stopped: make(chan struct{}), jobs: jobserver.NewRegistry()}
	store := o.store
	if store == nil {
		db, err := openStore(ctx, cfg.StorePath(), durability(cfg), n.log)
		if err != nil {
			return nil, err
		}
		store, n.ownStore = db, true
	}
	closeStore := func() {
		if n.ownStore {
			if err := store.Close(); err != nil {
				n.log.Warn().Err(err).Msg("close job store")
			}
		}
	}
	// The name is this node's before it writes anything else: a second
	// node under a live node's name stops here.
	reg := cluster.New(store, cluster.Options{})
	claim, err := reg.Claim(ctx, cfg.Couchrep.NodeName, owner(cfg), heartbeatInterval(cfg))
	if err != nil {
		closeStore()
		return nil, err
	}
	unclaim := func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := reg.Leave(c, cfg.Couchrep.NodeName, claim); err != nil {
			n.log.Warn().Err(err).Msg("give the node name back")
		}
	}
	shared, err := cluster.SharedUUID(ctx, store, uuidRequest(cfg))
	if err != nil {
		unclaim()
		closeStore()
		return nil, err
	}
	if shared.UUID != cfg.CouchDB.UUID {
		n.log.Info().Str("uuid", shared.UUID).Msg("using the server uuid recorded in the shared job store")
		cfg.CouchDB.UUID = shared.UUID
		n.cfg = cfg
	}
	if n.system == nil {
		// protoactor's own lines (warn and above) go to the node's logger,
		// in its format: its default handler writes coloured text to
		// stderr, terminal or not.
		n.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
			return slog.New(clog.SlogHandler(n.log))
		}))
		n.ownSystem = true
	}
	metrics := httpapi.NewMetrics(nil)
	if cfg.Replicator.ShareChangesFeeds {
		n.feeds = sharedfeed.New(sharedfeed.Options{Logger: n.log})
		metrics.ObserveSharedFeeds(n.feeds.Stats)
	}
	if cfg.Replicator.UseDBUpdates {
		n.dbUpdates = dbupdates.New(dbupdates.Options{Logger: n.log})
		metrics.ObserveDBUpdates(n.dbUpdates.Stats)
	}
	n.rechecks = park.NewRechecks(park.DefaultRate)
	store = timedStore{Database: store, m: metrics}
	n.deps = actors.Deps{
		Config:  cfg,
		Logger:  n.log,
		System:  n.system,
		Store:   store,
		Jobs:    jobqueue.New(store, jobqueue.Options{Logger: n.log, NodeName: cfg.Couchrep.NodeName, RunLog: cfg.Couchrep.RunLog}),
		Metrics: metrics,

		Competition: docproc.NewCompetition(),
		Timers:      timerwheel.New(),
		Slots:       &schedpolicy.FreeSlots{},
		Held:        n.jobs.Held,
	}
	n.deps.RepJobs = repjob.NewFromConfig(n.deps.Jobs, store, cfg, n.log)
	if shared.Replaced != "" {
		n.uuidChange = n.reportUUIDChange(ctx, shared.Replaced)
	}
	n.stopLease = func() {}
	if w := config.FDWarning(cfg); w != "" {
		n.log.Warn().Int("fds_needed", cfg.FileDescriptors()).Msg(w)
	}
	if cfg.HasNodeType(config.NodeTypeReplication) {
		// One lease proves every job of this node alive: an idle job
		// writes nothing to the store.
		// Accepts wait for it (repjob.Store.GoKeepLease): no job is
		// accepted outside it.
		lctx, cancel := context.WithCancel(context.Background())
		done := n.deps.RepJobs.GoKeepLease(lctx)
		n.stopLease = func() { cancel(); <-done }
	}
	metrics.WatchStore(httpapi.NewRepjobStore(n.deps.RepJobs, cfg.CouchDB.UUID))
	// Actors may send admin requests (the status page shows the tree and
	// the nodes) once the tree is up: n.sup is set then.
	treeUp := make(chan struct{})
	n.deps.Request = func(ctx context.Context, msg proto.Message) (proto.Message, error) {
		select {
		case <-treeUp:
			return n.Request(ctx, msg)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	n.events = n.system.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *supervisor.Event:
			eventbus.Log(n.log, e)
			metrics.ObserveSupervisor(e)
		case *messages.ReplicationJobEvent:
			metrics.ObserveJob(e.GetJobId(), repjob.State(e.GetState()), e.GetProgress(), httpapi.CountersOf(e.GetStats()))
		}
	})
	sup, err := supervisor.Start(ctx, n.system, RootName, n.spec())
	if err != nil {
		n.system.EventStream.Unsubscribe(n.events)
		n.stopLease()
		unclaim()
		n.release()
		return nil, fmt.Errorf("couchrep: start supervision tree: %w", err)
	}
	n.sup = sup
	n.router = router.New(n.system, sup, n.Name(), n.routes(), func(ctx context.Context) string {
		return cluster.StoreHealth(ctx, n.deps.Store)
	})
	close(treeUp)
	n.log.Info().Msg("node started")
	return n, nil
}

// spec is the node's supervision tree (DESIGN.md §3): a rest_for_one root
// whose later children may call the earlier ones, which they are given at
// spawn time (no actor looks another up by name).
func (n *Node) spec() supervisor.Spec {
	d := n.deps
	pid := func(c supervisor.ChildSpec) *actor.PID { return actor.NewPID(n.system.Address(), RootName+"/"+c.Name) }
	bus := eventbus.Spec(d, func(evt any) proto.Message {
		if e, ok := evt.(*supervisor.Event); ok {
			return SupervisorEventProto(e)
		}
		return nil
	})
	pool, limiter, sched := connpool.Spec(d), ratelimiter.Spec(d), scheduler.Spec(d)
	return supervisor.Spec{
		Strategy:    supervisor.RestForOne,
		MaxRestarts: 10,
		Period:      time.Second,
		Children: []supervisor.ChildSpec{
			bus,                // event_bus: pub/sub of the node's events; first, others use it
			clustering.Spec(d), // clustering: membership, heartbeats, drain flags; answers nodes
			pool,               // connection_pool: per-endpoint HTTP connection leases
			limiter,            // rate_limiter: per-endpoint AIMD intervals on 429s
			sched,              // scheduler: what should run (rotation, shares, max_jobs)
			jobserver.Spec(d, jobserver.Wiring{Scheduler: pid(sched), Pool: pid(pool), Limiter: pid(limiter), Feeds: n.feeds,
				DBUpdates: n.dbUpdates, Rechecks: n.rechecks}, n.jobs),
			activitymonitor.Spec(d), // activity_monitor: requeues jobs of silent workers
			docprocessor.Spec(d),    // doc_processor: _replicator documents -> jobs
			httpserver.Spec(d),      // http_api: CouchDB's replicator HTTP API
		},
	}
}

// routes is the admin protocol: which actor answers each request type (the
// tree itself answers tree, kill and send; see package router).
func (n *Node) routes() router.Table {
	js := jobserver.Name + "/" + jobserver.Acceptor
	return router.Table{
		{Msg: &messages.ListJobsRequest{}, Actor: js},
		{Msg: &messages.GetJobRequest{}, Actor: js},
		{Msg: &messages.StopJobRequest{}, Actor: js},
		{Msg: &messages.RestartJobRequest{}, Actor: js},
		{Msg: &messages.PauseJobRequest{}, Actor: js},
		{Msg: &messages.ResumeJobRequest{}, Actor: js},
		{Msg: &messages.ResetJobRequest{}, Actor: js},
		{Msg: &messages.CancelJobRequest{}, Actor: js},
		{Msg: &messages.ReplicateRequest{}, Actor: js},
		{Msg: &messages.DrainRequest{}, Actor: js},
		{Msg: &messages.UndrainRequest{}, Actor: js},
		{Msg: &messages.GetSharesRequest{}, Actor: scheduler.Name},
		{Msg: &messages.SetSharesRequest{}, Actor: scheduler.Name},
		{Msg: &messages.SetConfigRequest{}, Actor: scheduler.Name},
		{Msg: &messages.SchedulerStatusRequest{}, Actor: scheduler.Name},
		{Msg: &messages.NodesRequest{}, Actor: clustering.Name},
		{Msg: &messages.StopNodeRequest{}, Func: n.stopRequested},
		{Msg: &messages.TakeoverRequest{}, Func: n.takeoverRequested},
	}
}

// stopRequested answers a StopNodeRequest: the node stops in the background.
func (n *Node) stopRequested(context.Context, proto.Message) (proto.Message, error) {
	n.log.Info().Msg("stop requested by an admin request")
	go func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = n.Stop(c)
	}()
	return &messages.StopNodeResponse{Node: n.Name()}, nil
}

// Subscribe streams the node's events until ctx ends: supervisor steps as
// *messages.SupervisorEvent, and every protobuf event the node's actors
// publish (job state changes, ...). Events are dropped rather than block the
// node when the subscriber falls more than buffer events behind; dropped
// reports how many were.
func (n *Node) Subscribe(ctx context.Context, buffer int) (events <-chan proto.Message, dropped func() uint64) {
	ch := make(chan proto.Message, buffer)
	var lost atomic.Uint64
	var mu sync.Mutex
	closed := false
	sub := n.system.EventStream.Subscribe(func(evt any) {
		var msg proto.Message
		switch e := evt.(type) {
		case *supervisor.Event:
			msg = SupervisorEventProto(e)
		case proto.Message:
			msg = e
		default:
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return
		}
		select {
		case ch <- msg:
		default:
			lost.Add(1)
		}
	})
	go func() {
		select {
		case <-ctx.Done():
		case <-n.sup.Done():
		}
		n.system.EventStream.Unsubscribe(sub)
		mu.Lock()
		closed = true
		close(ch)
		mu.Unlock()
	}()
	return ch, lost.Load
}

// SupervisorEventProto converts a supervisor event to its protobuf form.
func SupervisorEventProto(e *supervisor.Event) *messages.SupervisorEvent {
	return router.SupervisorEventProto(e)
}

// ServerUUID is the server UUID the node uses in replication ids: the
// configured [couchdb] uuid, or the one shared by the nodes of its store.
func (n *Node) ServerUUID() string { return n.cfg.CouchDB.UUID }

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Couchrep.NodeName }

// Done is closed when the node has stopped, by Stop or because its top
// supervisor gave up.
func (n *Node) Done() <-chan struct{} { return n.sup.Done() }

// Err says why the node stopped: nil after Stop, an error wrapping
// supervisor.ErrEscalated if the tree gave up.
func (n *Node) Err() error { return n.sup.Err() }

// Stop stops the node's actors in reverse start order (running jobs
// checkpoint and go back to the queue), waits for them and closes what Start
// opened. Calling it again, or concurrently, waits for the first call and
// returns its result.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		defer close(n.stopped)
		// Hibernated parked jobs have no actor for the tree's shutdown to
		// stop: none hibernates or wakes from now on, and once the tree
		// (its accept loop) has stopped the registry hands them back,
		// still parked.
		n.jobs.Closing()
		n.stopErr = n.sup.Stop(ctx)
		if err := n.jobs.Shutdown(ctx); err != nil {
			n.log.Warn().Err(err).Msg("stop: handing the hibernated jobs back")
		}
		n.system.EventStream.Unsubscribe(n.events)
		n.stopLease() // after the jobs stopped: an empty lease is removed
		n.release()
		n.log.Info().Err(n.stopErr).Msg("node stopped")
	})
	select {
	case <-n.stopped:
		return n.stopErr
	case <-ctx.Done():
		return fmt.Errorf("couchrep: stop: %w", ctx.Err())
	}
}

// release closes what Start opened.
func (n *Node) release() {
	if n.ownSystem {
		n.system.Shutdown()
	}
	if n.ownStore {
		if err := n.deps.Store.Close(); err != nil {
			n.log.Warn().Err(err).Msg("close job store")
		}
	}
}

// Request delivers an admin message to the actor that answers it (see
// routes) and returns that actor's reply. It is the code path of the admin
// endpoint.
func (n *Node) Request(ctx context.Context, msg proto.Message) (proto.Message, error) {
	return n.router.Request(ctx, msg)
}

// Draining reports whether the node was drained (and not undrained since).
func (n *Node) Draining() bool { return n.jobs.Draining() }

// AdminHandler returns the mount path and HTTP handler of the node's admin
// endpoint (the Connect service couchrepctl talks to), for a program that
// serves it on its own listener. A non-empty token is required, as
// "Authorization: Bearer <token>", on every request; serve the handler
// beyond loopback only with one.
func (n *Node) AdminHandler(token string) (string, http.Handler) {
	return admin.Handler(n, admin.Options{Token: token, Classify: AdminCode, Verify: n.verifyRPC})
}

// AdminCode maps an error of Request to the admin protocol's error code.
func AdminCode(err error) connect.Code { return router.Code(err) }
