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
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	"github.com/couchrep/couchrep/actors/httpapi"
	"github.com/couchrep/couchrep/actors/jobserver"
	"github.com/couchrep/couchrep/actors/ratelimiter"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobs"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
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

// WithStore runs the node on an already open job store instead of opening
// the embedded store at the configured path. The node never closes it.
func WithStore(db kv.Database) Option { return func(o *options) { o.store = db } }

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
	n := &Node{cfg: cfg, log: o.logger.With().Str("node", cfg.Couchrep.NodeName).Logger(), system: o.system}
	store := o.store
	if store == nil {
		path := cfg.StorePath()
		db, err := sqlite.Open(ctx, path, sqlite.Options{Durability: durability(cfg), Logger: n.log})
		if err != nil {
			return nil, fmt.Errorf("couchrep: open job store %s: %w", path, err)
		}
		store, n.ownStore = db, true
	}
	if n.system == nil {
		n.system = actor.NewActorSystem()
		n.ownSystem = true
	}
	n.deps = actors.Deps{
		Config: cfg,
		Logger: n.log,
		System: n.system,
		Store:  store,
		Jobs:   jobs.New(store, jobs.Options{Logger: n.log, NodeName: cfg.Couchrep.NodeName, RunLog: cfg.Couchrep.RunLog}),
	}
	n.deps.RepJobs = repjob.NewFromConfig(n.deps.Jobs, store, cfg, n.log)
	n.events = n.system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok {
			n.logEvent(e)
		}
	})
	sup, err := supervisor.Start(ctx, n.system, RootName, n.spec())
	if err != nil {
		n.system.EventStream.Unsubscribe(n.events)
		n.release()
		return nil, fmt.Errorf("couchrep: start supervision tree: %w", err)
	}
	n.sup = sup
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
			eventbus.Spec(d),
			clustering.Spec(d),
			connpool.Spec(d),
			ratelimiter.Spec(d),
			scheduler.Spec(d),
			jobserver.Spec(d),
			activitymonitor.Spec(d),
			docprocessor.Spec(d),
			httpapi.Spec(d),
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

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Couchrep.NodeName }

// Done is closed when the node has stopped, by Stop or because its top
// supervisor gave up.
func (n *Node) Done() <-chan struct{} { return n.sup.Done() }

// Err says why the node stopped: nil after Stop, an error wrapping
// supervisor.ErrEscalated if the tree gave up.
func (n *Node) Err() error { return n.sup.Err() }

// Stop stops the node's actors in reverse start order and waits for them.
func (n *Node) Stop(ctx context.Context) error {
	err := n.sup.Stop(ctx)
	n.system.EventStream.Unsubscribe(n.events)
	n.release()
	n.log.Info().Err(err).Msg("node stopped")
	return err
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
	switch m := msg.(type) {
	case *messages.TreeRequest:
		return n.tree(ctx)
	case *messages.KillRequest:
		return n.kill(ctx, m)
	case *messages.SendRequest:
		return n.send(ctx, m)
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnknownRequest, msg.ProtoReflect().Descriptor().FullName())
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
	return &messages.TreeResponse{Node: n.Name(), Root: treeToProto(root)}, nil
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
