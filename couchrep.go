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
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/activitymonitor"
	"github.com/couchrep/couchrep/actors/clustering"
	"github.com/couchrep/couchrep/actors/connpool"
	"github.com/couchrep/couchrep/actors/docprocessor"
	"github.com/couchrep/couchrep/actors/eventbus"
	httpapiactor "github.com/couchrep/couchrep/actors/httpapi"
	"github.com/couchrep/couchrep/actors/jobserver"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/actors/replicationjob"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/docproc"
	"github.com/couchrep/couchrep/internal/httpapi"
	"github.com/couchrep/couchrep/internal/jobs"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/kv/tuple"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// RootName is the name of a node's top supervisor.
const RootName = actors.RootName

// Sentinel errors callers branch on.
var (
	// ErrUnknownActor is returned for a request naming an actor the node
	// does not have.
	ErrUnknownActor = errors.New("couchrep: unknown actor")
	// ErrUnknownRequest is returned for a message type no actor handles.
	ErrUnknownRequest = errors.New("couchrep: unknown request type")
	// ErrStopped is returned by requests to a node that has stopped.
	ErrStopped = errors.New("couchrep: node stopped")
	// ErrInvalidRequest is returned for a request whose fields are wrong
	// (an invalid replication, max_jobs 0, ...).
	ErrInvalidRequest = errors.New("couchrep: invalid request")
	// ErrJobNotFound is returned for a job id or replication id no job has.
	ErrJobNotFound = errors.New("couchrep: job not found")
	// ErrJobNotRunning is returned for stopping a job that is not running.
	ErrJobNotRunning = errors.New("couchrep: job not running")
	// ErrJobElsewhere is returned for stopping or restarting a job that
	// runs on another node: only the node running a job can stop it
	// cleanly; the error names that node.
	ErrJobElsewhere = errors.New("couchrep: job runs on another node")
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

// Store is an open job store: the shared state of every node that uses it
// (jobs, fair-share accounts, checkpoints of the queue). Open one with
// OpenStore and hand it to Start with WithStore; close it after the nodes
// using it stopped.
type Store struct {
	db kv.Database
}

// OpenStore opens (creating if needed) the job store at location: the path
// of the embedded SQLite file that node processes on one machine may share,
// a "postgres://user:password@host:5432/db?..." URL for a PostgreSQL
// database that nodes on several machines share (the schema is created on
// first use), or "fdb:<cluster file>" ("fdb:" alone for FoundationDB's
// default cluster file) for a FoundationDB cluster, in a build with -tags
// fdb. Durability is "normal": commits survive a process crash.
func OpenStore(ctx context.Context, location string) (*Store, error) {
	db, err := openStore(ctx, location, sqlite.DurabilityNormal, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// ErrNoFDB is returned for an "fdb:" store by a build without FoundationDB
// support.
var ErrNoFDB = errors.New("couchrep: this build has no FoundationDB support (build with -tags fdb and the FoundationDB client installed)")

// openFDB opens a FoundationDB store; builds with -tags fdb set it
// (store_fdb.go).
var openFDB func(ctx context.Context, clusterFile string, log zerolog.Logger) (kv.Database, error)

// FDBSupported reports whether this build can open FoundationDB stores.
func FDBSupported() bool { return openFDB != nil }

// FDBPrefix marks a store location as a FoundationDB cluster file.
const FDBPrefix = "fdb:"

func openStore(ctx context.Context, location string, d sqlite.Durability, log zerolog.Logger) (kv.Database, error) {
	if clusterFile, ok := strings.CutPrefix(location, FDBPrefix); ok {
		if openFDB == nil {
			return nil, ErrNoFDB
		}
		db, err := openFDB(ctx, clusterFile, log)
		if err != nil {
			return nil, fmt.Errorf("couchrep: open FoundationDB job store %q: %w", clusterFile, err)
		}
		return db, nil
	}
	if postgres.IsDSN(location) {
		pd := postgres.DurabilityNormal
		if d == sqlite.DurabilityFull {
			pd = postgres.DurabilityFull
		}
		db, err := postgres.Open(ctx, location, postgres.Options{Durability: pd, Logger: log})
		if err != nil {
			// The error names the server and database, never the password.
			return nil, fmt.Errorf("couchrep: open PostgreSQL job store: %w", err)
		}
		return db, nil
	}
	db, err := sqlite.Open(ctx, location, sqlite.Options{Durability: d, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("couchrep: open job store %s: %w", location, err)
	}
	return db, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

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

	stopOnce sync.Once
	stopped  chan struct{}
	stopErr  error
	draining atomic.Bool
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
		stopped: make(chan struct{})}
	store := o.store
	if store == nil {
		db, err := openStore(ctx, cfg.StorePath(), durability(cfg), n.log)
		if err != nil {
			return nil, err
		}
		store, n.ownStore = db, true
	}
	uuid, err := sharedUUID(ctx, store, cfg.CouchDB)
	if err != nil {
		n.release()
		return nil, err
	}
	if uuid != cfg.CouchDB.UUID {
		n.log.Info().Str("uuid", uuid).Msg("using the server uuid recorded in the shared job store")
		cfg.CouchDB.UUID = uuid
		n.cfg = cfg
	}
	if n.system == nil {
		n.system = actor.NewActorSystem()
		n.ownSystem = true
	}
	metrics := httpapi.NewMetrics(nil)
	store = timedStore{Database: store, m: metrics}
	n.deps = actors.Deps{
		Config:  cfg,
		Logger:  n.log,
		System:  n.system,
		Store:   store,
		Jobs:    jobs.New(store, jobs.Options{Logger: n.log, NodeName: cfg.Couchrep.NodeName, RunLog: cfg.Couchrep.RunLog}),
		Metrics: metrics,

		Competition: docproc.NewCompetition(),
	}
	n.deps.RepJobs = repjob.NewFromConfig(n.deps.Jobs, store, cfg, n.log)
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
			n.logEvent(e)
			metrics.ObserveSupervisor(e)
		case *messages.ReplicationJobEvent:
			metrics.ObserveJob(e.GetJobId(), repjob.StateName(e.GetState()), e.GetProgress(), httpapi.CountersOf(e.GetStats()))
		}
	})
	sup, err := supervisor.Start(ctx, n.system, RootName, n.spec())
	if err != nil {
		n.system.EventStream.Unsubscribe(n.events)
		n.release()
		return nil, fmt.Errorf("couchrep: start supervision tree: %w", err)
	}
	n.sup = sup
	close(treeUp)
	n.log.Info().Msg("node started")
	return n, nil
}

// spec is the node's supervision tree (DESIGN.md §3): a rest_for_one root
// whose later children may call the earlier ones.
func (n *Node) spec() supervisor.Spec {
	d := n.deps
	return supervisor.Spec{
		Strategy:    supervisor.RestForOne,
		MaxRestarts: 10,
		Period:      time.Second,
		Children: []supervisor.ChildSpec{
			eventbus.Spec(d, func(evt any) proto.Message {
				if e, ok := evt.(*supervisor.Event); ok {
					return SupervisorEventProto(e)
				}
				return nil
			}),
			clustering.Spec(d),
			connpool.Spec(d),
			ratelimiter.Spec(d),
			scheduler.Spec(d),
			jobserver.Spec(d),
			activitymonitor.Spec(d),
			docprocessor.Spec(d),
			httpapiactor.Spec(d),
		},
	}
}

func (n *Node) logEvent(e *supervisor.Event) {
	lvl := zerolog.InfoLevel
	switch e.Kind {
	case supervisor.ChildStarted:
		lvl = zerolog.DebugLevel
	case supervisor.GaveUp, supervisor.Escalated, supervisor.ShutdownTimeout, supervisor.StartFailed:
		lvl = zerolog.ErrorLevel
	case supervisor.ChildExited:
		if e.Reason != "normal" && e.Reason != "shutdown" {
			lvl = zerolog.WarnLevel
		}
	}
	ev := n.log.WithLevel(lvl).Str("event", e.Kind.String()).Str("supervisor", e.Supervisor).
		Str("child", e.Child).Int("restart_count", e.RestartCount)
	if e.Reason != "" {
		ev = ev.Str("reason", e.Reason)
	}
	if e.PID != nil {
		ev = ev.Str("pid", e.PID.Id)
	}
	ev.Msg("supervisor")
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
	p := &messages.SupervisorEvent{
		Kind:         messages.SupervisorEvent_Kind(enumValue(messages.SupervisorEvent_Kind_value, "KIND_", e.Kind.String())),
		Supervisor:   e.Supervisor,
		Child:        e.Child,
		Reason:       e.Reason,
		RestartCount: uint32(e.RestartCount),
		Time:         timestamppb.New(e.Time),
	}
	if e.PID != nil {
		p.Pid = e.PID.Id
	}
	return p
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
		n.stopErr = n.sup.Stop(ctx)
		n.system.EventStream.Unsubscribe(n.events)
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

// uuidKey is where the store records the server UUID of the nodes sharing it.
var uuidKey = tuple.Tuple{"couchrep", "server_uuid"}.Pack()

// sharedUUID returns the server UUID the node uses in replication ids. Every
// node sharing a store must use the same one, or a job moving between nodes
// would not find its checkpoints: the first node records its UUID in the
// store and later nodes whose UUID was generated (not configured) adopt it.
// A configured UUID is always used as is; an adopted one (couchrepd
// --adopt-uuid) also replaces the one recorded.
func sharedUUID(ctx context.Context, store kv.Database, c config.CouchDB) (string, error) {
	uuid := c.UUID
	err := store.Transact(ctx, func(tx kv.Tx) error {
		got, err := tx.Get(uuidKey)
		if err != nil {
			return err
		}
		switch {
		case c.Adopted && c.UUID != "" && string(got) != c.UUID:
			tx.Set(uuidKey, []byte(c.UUID))
			uuid = c.UUID
		case got == nil && c.UUID != "":
			tx.Set(uuidKey, []byte(c.UUID))
			uuid = c.UUID
		case got != nil && c.Generated:
			uuid = string(got)
		default:
			uuid = c.UUID
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("couchrep: server uuid in the job store: %w", err)
	}
	return uuid, nil
}

func durability(cfg Config) sqlite.Durability {
	if cfg.Couchrep.Durability == config.DurabilityFull {
		return sqlite.DurabilityFull
	}
	return sqlite.DurabilityNormal
}

// Request delivers an admin message to the actor that handles it and returns
// that actor's reply. It is the code path of the admin endpoint.
func (n *Node) Request(ctx context.Context, msg proto.Message) (proto.Message, error) {
	select {
	case <-n.sup.Done():
		return nil, ErrStopped
	default:
	}
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrUnknownRequest)
	}
	switch m := msg.(type) {
	case *messages.TreeRequest:
		return n.tree(ctx)
	case *messages.KillRequest:
		return n.kill(ctx, m)
	case *messages.SendRequest:
		return n.send(ctx, m)
	case *messages.ListJobsRequest:
		return n.listJobs(ctx, m)
	case *messages.GetJobRequest:
		rec, err := n.findJob(ctx, m.GetId())
		if err != nil {
			return nil, err
		}
		return &messages.GetJobResponse{Job: admin.JobSummary(rec, true)}, nil
	case *messages.StopJobRequest:
		return n.stopJob(ctx, m)
	case *messages.RestartJobRequest:
		return n.restartJob(ctx, m)
	case *messages.CancelJobRequest:
		return n.cancelJob(ctx, m)
	case *messages.ReplicateRequest:
		return n.replicate(ctx, m)
	case *messages.GetSharesRequest, *messages.SetSharesRequest, *messages.SchedulerStatusRequest:
		return n.ask(ctx, scheduler.Name, msg)
	case *messages.SetConfigRequest:
		return n.setConfig(ctx, m)
	case *messages.DrainRequest:
		return n.drain(ctx)
	case *messages.UndrainRequest:
		reply, err := n.ask(ctx, acceptorPath, m)
		if err == nil {
			n.draining.Store(false)
			n.log.Info().Msg("node undrained: accepting jobs")
		}
		return reply, err
	case *messages.StopNodeRequest:
		n.log.Info().Msg("stop requested by an admin request")
		go func() {
			c, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = n.Stop(c)
		}()
		return &messages.StopNodeResponse{Node: n.Name()}, nil
	case *messages.NodesRequest:
		return n.nodes(ctx, m)
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnknownRequest, msg.ProtoReflect().Descriptor().FullName())
	}
}

// acceptorPath and jobsSupPath locate the job server's children.
const (
	acceptorPath = jobserver.Name + "/" + jobserver.Acceptor
	jobsSupPath  = jobserver.Name + "/" + jobserver.JobsSup
)

// jobStore is the node's replication job store, or an error on a node
// without one.
func (n *Node) jobStore() (*repjob.Store, error) {
	if n.deps.RepJobs == nil {
		return nil, fmt.Errorf("%w: this node has no job store", ErrUnknownRequest)
	}
	return n.deps.RepJobs, nil
}

func (n *Node) listJobs(ctx context.Context, req *messages.ListJobsRequest) (*messages.ListJobsResponse, error) {
	store, err := n.jobStore()
	if err != nil {
		return nil, err
	}
	resp := &messages.ListJobsResponse{}
	err = store.Each(ctx, admin.JobFilter(req), func(r *repjob.Record) error {
		resp.Total++
		if req.GetLimit() == 0 || uint32(len(resp.Jobs)) < req.GetLimit() {
			resp.Jobs = append(resp.Jobs, admin.JobSummary(r, false))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("couchrep: list jobs: %w", err)
	}
	return resp, nil
}

// findJob finds a job by job id, else by replication id.
func (n *Node) findJob(ctx context.Context, id string) (*repjob.Record, error) {
	store, err := n.jobStore()
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, fmt.Errorf("%w: no job id given", ErrJobNotFound)
	}
	rec, err := store.Get(ctx, id)
	if errors.Is(err, repjob.ErrNotFound) {
		rec, err = store.FindByRepID(ctx, id)
	}
	switch {
	case errors.Is(err, repjob.ErrNotFound):
		return nil, fmt.Errorf("%w: %q", ErrJobNotFound, id)
	case err != nil:
		return nil, fmt.Errorf("couchrep: find job %q: %w", id, err)
	}
	return rec, nil
}

// stopJob stops a job running on this node cleanly (final checkpoint, back
// to the queue as pending, due now).
func (n *Node) stopJob(ctx context.Context, req *messages.StopJobRequest) (*messages.StopJobResponse, error) {
	rec, err := n.findJob(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if rec.State() != messages.ReplicationState_REPLICATION_STATE_RUNNING {
		return nil, fmt.Errorf("%w: job %s is %s", ErrJobNotRunning, rec.GetJobId(), rec.StateName())
	}
	if err := n.runsHere(rec); err != nil {
		return nil, err
	}
	if _, err := n.stopLocalJobs(ctx, "operator", rec.GetJobId()); err != nil {
		return nil, err
	}
	rec, err = n.findJob(ctx, rec.GetJobId())
	if err != nil {
		return nil, err
	}
	return &messages.StopJobResponse{Job: admin.JobSummary(rec, true)}, nil
}

// restartJob makes a job run again now: a running job (on this node) is
// stopped cleanly and is due at once; a pending, crashing, completed or
// failed one is resubmitted due now (a crashing job's backoff is skipped).
func (n *Node) restartJob(ctx context.Context, req *messages.RestartJobRequest) (*messages.RestartJobResponse, error) {
	rec, err := n.findJob(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	if rec.State() == messages.ReplicationState_REPLICATION_STATE_RUNNING {
		if err := n.runsHere(rec); err != nil {
			return nil, err
		}
		if _, err := n.stopLocalJobs(ctx, "restart", rec.GetJobId()); err != nil {
			return nil, err
		}
	} else {
		store, _ := n.jobStore()
		if err := store.Queue().Resubmit(ctx, repjob.JobType, rec.GetJobId(), jobs.ResubmitOptions{}); err != nil {
			return nil, fmt.Errorf("couchrep: restart job %s: %w", rec.GetJobId(), err)
		}
	}
	n.log.Info().Str("job_id", rec.GetJobId()).Msg("job restarted by an admin request")
	rec, err = n.findJob(ctx, rec.GetJobId())
	if err != nil {
		return nil, err
	}
	return &messages.RestartJobResponse{Job: admin.JobSummary(rec, true)}, nil
}

// cancelJob removes a transient job; a persistent job is canceled in the
// queue and stays so until its document changes (the doc processor then
// replaces the job). A job running on this node is stopped at once; one
// running elsewhere stops at its worker's next write.
func (n *Node) cancelJob(ctx context.Context, req *messages.CancelJobRequest) (*messages.CancelJobResponse, error) {
	rec, err := n.findJob(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	store, _ := n.jobStore()
	id := rec.GetJobId()
	if rec.GetKind() == messages.ReplicationKind_REPLICATION_KIND_PERSISTENT {
		err = store.Queue().Cancel(ctx, repjob.JobType, id)
	} else {
		err = store.Remove(ctx, id)
	}
	if err != nil && !errors.Is(err, repjob.ErrNotFound) && !errors.Is(err, jobs.ErrNotFound) {
		return nil, fmt.Errorf("couchrep: cancel job %s: %w", id, err)
	}
	if rec.State() == messages.ReplicationState_REPLICATION_STATE_RUNNING && n.runsHere(rec) == nil {
		// Its next store write fails (the job is gone or canceled): the
		// actor stops without writing anything more.
		if _, err := n.stopLocalJobs(ctx, "canceled", id); err != nil {
			return nil, err
		}
	}
	n.log.Info().Str("job_id", id).Msg("job canceled by an admin request")
	return &messages.CancelJobResponse{Id: id}, nil
}

// replicate adds a transient job, as POST /_replicate does.
func (n *Node) replicate(ctx context.Context, req *messages.ReplicateRequest) (*messages.ReplicateResponse, error) {
	store, err := n.jobStore()
	if err != nil {
		return nil, err
	}
	user := req.GetUser()
	if user == "" {
		user = "admin"
	}
	res, err := store.AddTransient(ctx, []byte(req.GetBody()), user)
	if err != nil {
		if errors.Is(err, repjob.ErrInvalid) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
		return nil, fmt.Errorf("couchrep: add replication: %w", err)
	}
	return &messages.ReplicateResponse{Id: res.JobID, ReplicationId: res.RepID}, nil
}

// runsHere returns nil if the running job rec runs on this node, else an
// error naming the node that runs it.
func (n *Node) runsHere(rec *repjob.Record) error {
	node := rec.WorkerNode
	if node == "" {
		node = rec.GetNode()
	}
	if node != n.Name() {
		return fmt.Errorf("%w: job %s runs on node %q: send the request to that node", ErrJobElsewhere, rec.GetJobId(), node)
	}
	return nil
}

// stopLocalJobs asks the actors of the given jobs (all of this node's jobs
// if none are given) to stop cleanly, and waits until they have exited:
// each checkpointed and handed its job back to the queue (or finished it).
// It returns the ids of the jobs it stopped.
func (n *Node) stopLocalJobs(ctx context.Context, reason string, ids ...string) ([]string, error) {
	exited := make(chan string, 64)
	jobsSup := RootName + "/" + jobsSupPath
	sub := n.system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok && e.Kind == supervisor.ChildExited && e.Supervisor == jobsSup {
			select {
			case exited <- e.Child:
			default:
				go func() { exited <- e.Child }()
			}
		}
	})
	defer n.system.EventStream.Unsubscribe(sub)
	root, err := supervisor.Which(ctx, n.system, n.sup.PID())
	if err != nil {
		return nil, fmt.Errorf("couchrep: list tree: %w", err)
	}
	sup := findActor(root, jobsSupPath)
	if sup == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownActor, jobsSupPath)
	}
	jobOf := map[string]string{} // actor name -> job id
	if len(ids) == 0 && n.deps.RepJobs != nil {
		// Every job of this node: name their actors by job id.
		err := n.deps.RepJobs.Each(ctx, repjob.Filter{Node: n.Name()}, func(r *repjob.Record) error {
			jobOf[replicationjob.Name(r.GetJobId())] = r.GetJobId()
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("couchrep: list this node's jobs: %w", err)
		}
	}
	for _, id := range ids {
		jobOf[replicationjob.Name(id)] = id
	}
	waiting := map[string]string{} // actor name -> job id
	for _, c := range sup.Children {
		if c.PID == nil || c.State == supervisor.Stopped || (len(ids) > 0 && jobOf[c.Name] == "") {
			continue
		}
		id := jobOf[c.Name]
		if id == "" {
			id = c.Name // started after the listing above
		}
		waiting[c.Name] = id
		n.system.Root.Send(c.PID, &messages.StopReplicationJobRequest{JobId: id, Reason: reason})
	}
	var stopped []string
	for len(waiting) > 0 {
		select {
		case name := <-exited:
			if id, ok := waiting[name]; ok {
				delete(waiting, name)
				stopped = append(stopped, id)
			}
		case <-ctx.Done():
			return stopped, fmt.Errorf("couchrep: %d job(s) still stopping: %w", len(waiting), ctx.Err())
		}
	}
	return stopped, nil
}

// setConfig changes max_jobs/max_churn (the scheduler owns the policy) and
// wakes the acceptor so that a raised max_jobs takes effect at once.
func (n *Node) setConfig(ctx context.Context, req *messages.SetConfigRequest) (proto.Message, error) {
	if (req.MaxJobs != nil && req.GetMaxJobs() == 0) || (req.MaxChurn != nil && req.GetMaxChurn() == 0) {
		return nil, fmt.Errorf("%w: max_jobs and max_churn must be at least 1", ErrInvalidRequest)
	}
	reply, err := n.ask(ctx, scheduler.Name, req)
	if err != nil {
		return nil, err
	}
	if _, err := n.ask(ctx, acceptorPath, req); err != nil && !errors.Is(err, ErrUnknownRequest) {
		n.log.Warn().Err(err).Msg("config change: acceptor not woken")
	}
	got := reply.(*messages.SetConfigResponse)
	if (req.MaxJobs != nil && got.GetMaxJobs() != req.GetMaxJobs()) || (req.MaxChurn != nil && got.GetMaxChurn() != req.GetMaxChurn()) {
		return nil, fmt.Errorf("%w: the scheduler refused the change (in force: max_jobs %d, max_churn %d)",
			ErrInvalidRequest, got.GetMaxJobs(), got.GetMaxChurn())
	}
	n.log.Info().Uint32("max_jobs", got.GetMaxJobs()).Uint32("max_churn", got.GetMaxChurn()).Msg("config changed by an admin request")
	return got, nil
}

// drain stops accepting jobs, then stops this node's running jobs cleanly so
// that other nodes take them from the queue.
func (n *Node) drain(ctx context.Context) (*messages.DrainResponse, error) {
	if _, err := n.ask(ctx, acceptorPath, &messages.DrainRequest{}); err != nil {
		return nil, err
	}
	n.draining.Store(true)
	ids, err := n.stopLocalJobs(ctx, "drain")
	n.log.Info().Int("released", len(ids)).Strs("job_ids", ids).Err(err).Msg("node drained")
	if err != nil {
		return nil, err
	}
	return &messages.DrainResponse{Released: uint32(len(ids)), JobIds: ids}, nil
}

// Draining reports whether the node was drained (and not undrained since).
func (n *Node) Draining() bool { return n.draining.Load() }

// nodes asks the clustering actor for the cluster view (every registered
// node, its heartbeat and running jobs) and adds what only this node knows:
// whether it is drained.
func (n *Node) nodes(ctx context.Context, req *messages.NodesRequest) (proto.Message, error) {
	reply, err := n.ask(ctx, clustering.Name, req)
	if err != nil {
		return nil, err
	}
	if resp, ok := reply.(*messages.NodesResponse); ok {
		for _, info := range resp.GetNodes() {
			if info.GetName() == n.Name() {
				info.Draining = info.GetDraining() || n.Draining()
			}
		}
	}
	return reply, nil
}

// AdminHandler returns the mount path and HTTP handler of the node's admin
// endpoint (the Connect service couchrepctl talks to), for a program that
// serves it on its own listener. A non-empty token is required, as
// "Authorization: Bearer <token>", on every request; serve the handler
// beyond loopback only with one.
func (n *Node) AdminHandler(token string) (string, http.Handler) {
	return admin.Handler(n, admin.Options{Token: token, Classify: AdminCode})
}

// AdminCode maps an error of Request to the admin protocol's error code.
func AdminCode(err error) connect.Code {
	switch {
	case errors.Is(err, ErrUnknownActor), errors.Is(err, ErrJobNotFound):
		return connect.CodeNotFound
	case errors.Is(err, ErrUnknownRequest):
		return connect.CodeUnimplemented
	case errors.Is(err, ErrInvalidRequest):
		return connect.CodeInvalidArgument
	case errors.Is(err, ErrJobNotRunning), errors.Is(err, ErrJobElsewhere):
		return connect.CodeFailedPrecondition
	case errors.Is(err, ErrStopped):
		return connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	default:
		return connect.CodeInternal
	}
}

// send delivers a generic envelope: to the named actor if it names one,
// else to whichever actor handles the message's type.
func (n *Node) send(ctx context.Context, m *messages.SendRequest) (*messages.SendResponse, error) {
	current := uint32(messages.AdminProtocolVersion_ADMIN_PROTOCOL_VERSION_CURRENT)
	if v := m.GetVersion(); v != 0 && v != current {
		return nil, fmt.Errorf("%w: envelope version %d, this node speaks %d", ErrUnknownRequest, v, current)
	}
	if m.GetMessage() == nil {
		return nil, fmt.Errorf("%w: empty envelope", ErrUnknownRequest)
	}
	inner, err := m.GetMessage().UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnknownRequest, m.GetMessage().GetTypeUrl(), err)
	}
	var reply proto.Message
	if m.GetActor() == "" {
		if _, nested := inner.(*messages.SendRequest); nested {
			return nil, fmt.Errorf("%w: nested envelope", ErrUnknownRequest)
		}
		reply, err = n.Request(ctx, inner)
	} else {
		reply, err = n.ask(ctx, m.GetActor(), inner)
	}
	if err != nil {
		return nil, err
	}
	packed, err := anypb.New(reply)
	if err != nil {
		return nil, fmt.Errorf("couchrep: pack reply: %w", err)
	}
	return &messages.SendResponse{Version: current, Reply: packed}, nil
}

// ask delivers msg to the named actor and waits for its protobuf reply.
func (n *Node) ask(ctx context.Context, name string, msg proto.Message) (proto.Message, error) {
	root, err := supervisor.Which(ctx, n.system, n.sup.PID())
	if err != nil {
		return nil, fmt.Errorf("couchrep: list tree: %w", err)
	}
	target := findActor(root, name)
	if target == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownActor, name)
	}
	if target.IsSupervisor {
		return nil, fmt.Errorf("%w: %s is a supervisor: it answers only tree and kill requests", ErrUnknownRequest, target.PID.Id)
	}
	res, err := n.system.Root.RequestFuture(target.PID, &actors.Ask{Msg: msg}, requestTimeout(ctx)).Result()
	if err != nil {
		return nil, fmt.Errorf("couchrep: %s: %w", target.PID.Id, err)
	}
	switch r := res.(type) {
	case error:
		if errors.Is(r, actors.ErrUnhandled) {
			return nil, fmt.Errorf("%w: %w", ErrUnknownRequest, r)
		}
		return nil, r
	case proto.Message:
		return r, nil
	default:
		return nil, fmt.Errorf("%w: %s answered %T", ErrUnknownRequest, target.PID.Id, res)
	}
}

func (n *Node) tree(ctx context.Context) (*messages.TreeResponse, error) {
	root, err := supervisor.Which(ctx, n.system, n.sup.PID())
	if err != nil {
		return nil, fmt.Errorf("couchrep: list tree: %w", err)
	}
	return &messages.TreeResponse{Node: n.Name(), Root: treeToProto(root), Store: n.storeHealth(ctx)}, nil
}

// storeHealth is the job store's health for the admin tree: "ok" or
// "unavailable: <reason>", from the store's own check (kv.Checker; a
// PostgreSQL store pings its server) and a read.
func (n *Node) storeHealth(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var err error
	if c, ok := n.deps.Store.(kv.Checker); ok {
		err = c.Check(ctx)
	}
	if err == nil {
		err = n.deps.Store.ReadTransact(ctx, func(tx kv.ReadTx) error { _, err := tx.Get(uuidKey); return err })
	}
	if err != nil {
		return "unavailable: " + err.Error()
	}
	return "ok"
}

func (n *Node) kill(ctx context.Context, req *messages.KillRequest) (*messages.KillResponse, error) {
	root, err := supervisor.Which(ctx, n.system, n.sup.PID())
	if err != nil {
		return nil, fmt.Errorf("couchrep: list tree: %w", err)
	}
	target := findActor(root, req.GetActor())
	if target == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownActor, req.GetActor())
	}
	if target == root {
		return nil, fmt.Errorf("couchrep: refusing to kill the top supervisor %q: stop the node instead", root.Name)
	}
	if target.IsSupervisor {
		// A supervisor is killed through its own supervisor: it has no
		// couchrep middleware of its own.
		if err := supervisor.Kill(ctx, n.system, target.PID, killReason(req)); err != nil {
			return nil, fmt.Errorf("couchrep: kill %s: %w", target.PID.Id, err)
		}
		return &messages.KillResponse{Pid: target.PID.Id, Incarnation: target.Incarnation}, nil
	}
	res, err := n.system.Root.RequestFuture(target.PID, req, requestTimeout(ctx)).Result()
	if err != nil {
		return nil, fmt.Errorf("couchrep: kill %s: %w", target.PID.Id, err)
	}
	reply, ok := res.(*messages.KillResponse)
	if !ok {
		return nil, fmt.Errorf("couchrep: kill %s: unexpected reply %T", target.PID.Id, res)
	}
	reply.Incarnation = target.Incarnation
	return reply, nil
}

func killReason(req *messages.KillRequest) string {
	if r := req.GetReason(); r != "" {
		return r
	}
	return "requested"
}

// requestTimeout is how long a request to an actor may take: the context's
// deadline if it has one, else 10 s.
func requestTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left > 0 {
			return left
		}
		return time.Millisecond
	}
	return 10 * time.Second
}

// findActor finds an actor by child name, by full actor id, or by a path
// relative to the root ("job_server/jobs_sup").
func findActor(root *supervisor.TreeNode, name string) *supervisor.TreeNode {
	if f := walkFind(root, name); f != nil {
		return f
	}
	if root.PID != nil && !strings.HasPrefix(name, root.PID.Id+"/") {
		return walkFind(root, root.PID.Id+"/"+name)
	}
	return nil
}

func walkFind(t *supervisor.TreeNode, name string) *supervisor.TreeNode {
	if t.Name == name || (t.PID != nil && t.PID.Id == name) {
		return t
	}
	for _, c := range t.Children {
		if f := walkFind(c, name); f != nil {
			return f
		}
	}
	return nil
}

// enumValue maps a supervisor enum's name ("rest_for_one") to the value of
// the protobuf enum that mirrors it ("STRATEGY_REST_FOR_ONE").
func enumValue(values map[string]int32, prefix, name string) int32 {
	return values[prefix+strings.ToUpper(name)]
}

func treeToProto(t *supervisor.TreeNode) *messages.TreeNode {
	p := &messages.TreeNode{
		Name:         t.Name,
		Supervisor:   t.IsSupervisor,
		Restart:      messages.RestartType(enumValue(messages.RestartType_value, "RESTART_TYPE_", t.Restart.String())),
		State:        messages.ChildState(enumValue(messages.ChildState_value, "CHILD_STATE_", t.State.String())),
		RestartCount: uint32(t.RestartCount),
		Incarnation:  t.Incarnation,
	}
	if t.PID != nil {
		p.Pid = t.PID.Id
	}
	if t.IsSupervisor {
		p.Strategy = messages.Strategy(enumValue(messages.Strategy_value, "STRATEGY_", t.Strategy.String()))
	}
	if !t.StartedAt.IsZero() {
		p.StartedAt = timestamppb.New(t.StartedAt)
	}
	for _, c := range t.Children {
		p.Children = append(p.Children, treeToProto(c))
	}
	return p
}
