// Package router delivers a node's admin requests (the protobuf messages of
// package messages that couchrepctl and Node.Request send) to the actors that
// answer them. A Table says which actor answers each request type; the
// supervision tree itself answers three: TreeRequest (the live tree),
// KillRequest (kill any actor; its supervisor heals the tree) and
// SendRequest (any message to a named actor, or to whichever actor answers
// its type).
//
// A request to an actor is an actors.Ask with a reply future. If the actor
// is between incarnations (a restart under rest_for_one), the request waits
// for the next one, within the caller's deadline.
package router

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/pause"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Route says who answers one request type: the actor at Actor (a path
// relative to the root supervisor, "job_server/acceptor"), or Func.
type Route struct {
	// Msg is the request type (any value of it).
	Msg proto.Message
	// Actor answers it, unless Func is set.
	Actor string
	// Func answers requests the node itself handles (stop the node).
	Func func(ctx context.Context, msg proto.Message) (proto.Message, error)
}

// Table is the routes of every admin request type but the three the tree
// answers itself.
type Table []Route

// Router delivers admin requests in one node's supervision tree.
type Router struct {
	system *actor.ActorSystem
	root   *supervisor.Supervisor
	node   string
	health func(context.Context) string
	routes map[protoreflect.FullName]Route
}

// New returns the router of the tree under root, for node (its name in
// tree answers); health tells the job store's health for tree answers.
func New(system *actor.ActorSystem, root *supervisor.Supervisor, node string, t Table, health func(context.Context) string) *Router {
	r := &Router{system: system, root: root, node: node, health: health, routes: map[protoreflect.FullName]Route{}}
	for _, rt := range t {
		r.routes[rt.Msg.ProtoReflect().Descriptor().FullName()] = rt
	}
	return r
}

// Request delivers msg to the actor that answers it and returns the reply.
func (r *Router) Request(ctx context.Context, msg proto.Message) (proto.Message, error) {
	select {
	case <-r.root.Done():
		return nil, actors.ErrStopped
	default:
	}
	switch m := msg.(type) {
	case nil:
		return nil, fmt.Errorf("%w: nil message", actors.ErrUnknownRequest)
	case *messages.TreeRequest:
		root, err := r.which(ctx)
		if err != nil {
			return nil, err
		}
		resp := &messages.TreeResponse{Node: r.node, Root: TreeProto(root)}
		if r.health != nil {
			resp.Store = redact.Text(r.health(ctx))
		}
		return resp, nil
	case *messages.KillRequest:
		return r.kill(ctx, m)
	case *messages.SendRequest:
		return r.send(ctx, m)
	}
	rt, ok := r.routes[msg.ProtoReflect().Descriptor().FullName()]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: %s", actors.ErrUnknownRequest, msg.ProtoReflect().Descriptor().FullName())
	case rt.Func != nil:
		return rt.Func(ctx, msg)
	default:
		return r.Ask(ctx, rt.Actor, msg)
	}
}

func (r *Router) which(ctx context.Context) (*supervisor.TreeNode, error) {
	root, err := supervisor.Which(ctx, r.system, r.root.PID())
	if err != nil {
		return nil, fmt.Errorf("couchrep: list tree: %w", err)
	}
	return root, nil
}

// retryEvery is how often a request to an actor between incarnations is
// tried again.
const retryEvery = 50 * time.Millisecond

// Ask delivers msg to the actor named name (child name, path from the root
// or actor id) and waits for its protobuf reply.
func (r *Router) Ask(ctx context.Context, name string, msg proto.Message) (proto.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout(ctx))
	defer cancel()
	for {
		root, err := r.which(ctx)
		if err != nil {
			return nil, err
		}
		target := Find(root, name)
		if target == nil {
			return nil, fmt.Errorf("%w: %q", actors.ErrUnknownActor, name)
		}
		if target.IsSupervisor {
			return nil, fmt.Errorf("%w: %s is a supervisor: it answers only tree and kill requests", actors.ErrUnknownRequest, target.PID.Id)
		}
		var res any
		if target.PID != nil && target.State == supervisor.Running {
			res, err = r.system.Root.RequestFuture(target.PID, &actors.Ask{Msg: msg}, requestTimeout(ctx)).Result()
		} else {
			err = actor.ErrDeadLetter
		}
		if errors.Is(err, actor.ErrDeadLetter) {
			// Between incarnations: wait for the next one.
			if pause.For(ctx, retryEvery) != nil {
				return nil, fmt.Errorf("couchrep: %s is not running: %w", name, ctx.Err())
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("couchrep: %s: %w", target.PID.Id, err)
		}
		switch rep := res.(type) {
		case error:
			if errors.Is(rep, actors.ErrUnhandled) {
				return nil, fmt.Errorf("%w: %w", actors.ErrUnknownRequest, rep)
			}
			return nil, rep
		case proto.Message:
			return rep, nil
		default:
			return nil, fmt.Errorf("%w: %s answered %T", actors.ErrUnknownRequest, target.PID.Id, res)
		}
	}
}

// send delivers a generic envelope: to the named actor if it names one,
// else to whichever actor handles the message's type.
func (r *Router) send(ctx context.Context, m *messages.SendRequest) (*messages.SendResponse, error) {
	current := uint32(messages.AdminProtocolVersion_ADMIN_PROTOCOL_VERSION_CURRENT)
	if v := m.GetVersion(); v != 0 && v != current {
		return nil, fmt.Errorf("%w: envelope version %d, this node speaks %d", actors.ErrUnknownRequest, v, current)
	}
	if m.GetMessage() == nil {
		return nil, fmt.Errorf("%w: empty envelope", actors.ErrUnknownRequest)
	}
	inner, err := m.GetMessage().UnmarshalNew()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", actors.ErrUnknownRequest, m.GetMessage().GetTypeUrl(), err)
	}
	var reply proto.Message
	if m.GetActor() == "" {
		if _, nested := inner.(*messages.SendRequest); nested {
			return nil, fmt.Errorf("%w: nested envelope", actors.ErrUnknownRequest)
		}
		reply, err = r.Request(ctx, inner)
	} else {
		reply, err = r.Ask(ctx, m.GetActor(), inner)
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

func (r *Router) kill(ctx context.Context, req *messages.KillRequest) (*messages.KillResponse, error) {
	root, err := r.which(ctx)
	if err != nil {
		return nil, err
	}
	target := Find(root, req.GetActor())
	if target == nil {
		return nil, fmt.Errorf("%w: %q", actors.ErrUnknownActor, req.GetActor())
	}
	if target == root {
		return nil, fmt.Errorf("couchrep: refusing to kill the top supervisor %q: stop the node instead", root.Name)
	}
	if target.IsSupervisor {
		// A supervisor is killed through its own supervisor: it has no
		// couchrep middleware of its own.
		reason := req.GetReason()
		if reason == "" {
			reason = "requested"
		}
		if err := supervisor.Kill(ctx, r.system, target.PID, reason); err != nil {
			return nil, fmt.Errorf("couchrep: kill %s: %w", target.PID.Id, err)
		}
		return &messages.KillResponse{Pid: target.PID.Id, Incarnation: target.Incarnation}, nil
	}
	res, err := r.system.Root.RequestFuture(target.PID, req, requestTimeout(ctx)).Result()
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

// Code maps an error of Request to the admin protocol's error code.
func Code(err error) connect.Code {
	switch {
	case errors.Is(err, actors.ErrUnknownActor), errors.Is(err, actors.ErrJobNotFound):
		return connect.CodeNotFound
	case errors.Is(err, actors.ErrUnknownRequest):
		return connect.CodeUnimplemented
	case errors.Is(err, actors.ErrInvalidRequest):
		return connect.CodeInvalidArgument
	case errors.Is(err, actors.ErrJobNotRunning), errors.Is(err, actors.ErrJobElsewhere), errors.Is(err, actors.ErrJobFollowsDocument):
		return connect.CodeFailedPrecondition
	case errors.Is(err, actors.ErrStopped):
		return connect.CodeUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	default:
		return connect.CodeInternal
	}
}

// requestTimeout is how long a request to an actor may take: the context's
// deadline if it has one, else 2 min (a drain waits for every job's final
// checkpoint).
func requestTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		if left := time.Until(d); left > 0 {
			return left
		}
		return time.Millisecond
	}
	return 2 * time.Minute
}

// Find finds an actor by child name, by full actor id, or by a path
// relative to the root ("job_server/jobs_sup").
func Find(root *supervisor.TreeNode, name string) *supervisor.TreeNode {
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

// TreeProto converts a supervision tree to its protobuf form.
func TreeProto(t *supervisor.TreeNode) *messages.TreeNode {
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
		p.Children = append(p.Children, TreeProto(c))
	}
	return p
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
