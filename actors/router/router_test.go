package router_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/router"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// waitLimit bounds every wait of these tests.
const waitLimit = 30 * time.Second

// clusterActor answers NodesRequest (as clustering does).
type clusterActor struct{}

func (clusterActor) Receive(ctx actor.Context) {
	if _, ok := ctx.Message().(*messages.NodesRequest); ok {
		ctx.Respond(&messages.NodesResponse{Nodes: []*messages.NodeInfo{{Name: "n1"}}})
	}
}

// jobsActor answers GetJobRequest (as the job server's acceptor does):
// "missing" is actors.ErrJobNotFound.
type jobsActor struct{}

func (jobsActor) Receive(ctx actor.Context) {
	if m, ok := ctx.Message().(*messages.GetJobRequest); ok {
		if m.GetId() == "missing" {
			ctx.Respond(fmt.Errorf("%w: %s", actors.ErrJobNotFound, m.GetId()))
			return
		}
		ctx.Respond(&messages.GetJobResponse{Job: &messages.JobSummary{Id: m.GetId()}})
	}
}

type tree struct {
	system *actor.ActorSystem
	sup    *supervisor.Supervisor
	r      *router.Router
	ctx    context.Context
}

// start builds couchrep_sup{clustering, job_server{acceptor}} and a router
// whose table sends NodesRequest to clustering, GetJobRequest to
// job_server/acceptor and StopNodeRequest to a function.
func start(t *testing.T) *tree {
	t.Helper()
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	sup, err := supervisor.Start(ctx, system, "couchrep_sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Minute,
		Children: []supervisor.ChildSpec{
			{Name: "clustering", Props: actors.Props(func() actor.Actor { return clusterActor{} }, actors.Handles(&messages.NodesRequest{}))},
			{Name: "job_server", Supervisor: &supervisor.Spec{Strategy: supervisor.OneForAll, MaxRestarts: 10, Period: time.Minute,
				Children: []supervisor.ChildSpec{
					{Name: "acceptor", Props: actors.Props(func() actor.Actor { return jobsActor{} }, actors.Handles(&messages.GetJobRequest{}))},
				}}},
		},
	})
	if err != nil {
		t.Fatalf("start tree: %v", err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	table := router.Table{
		{Msg: &messages.NodesRequest{}, Actor: "clustering"},
		{Msg: &messages.GetJobRequest{}, Actor: "job_server/acceptor"},
		{Msg: &messages.StopNodeRequest{}, Func: func(context.Context, proto.Message) (proto.Message, error) {
			return &messages.StopNodeResponse{Node: "n1"}, nil
		}},
	}
	r := router.New(system, sup, "n1", table, func(context.Context) string {
		return "unavailable: dial postgres://admin:hunter2@db:5432/jobs: refused"
	})
	return &tree{system: system, sup: sup, r: r, ctx: ctx}
}

func pack(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRouting: each request type reaches the actor (or function) the table
// names, through Request and through a SendRequest envelope; what no one
// answers, and envelopes that cannot be opened, are errors with the admin
// protocol's codes.
func TestRouting(t *testing.T) {
	tr := start(t)
	current := uint32(messages.AdminProtocolVersion_ADMIN_PROTOCOL_VERSION_CURRENT)
	cases := []struct {
		name  string
		msg   proto.Message
		check func(proto.Message) bool
		code  connect.Code // 0: no error
		is    error
	}{
		{name: "table: actor by name", msg: &messages.NodesRequest{},
			check: func(m proto.Message) bool {
				r, ok := m.(*messages.NodesResponse)
				return ok && r.GetNodes()[0].GetName() == "n1"
			}},
		{name: "table: actor by path", msg: &messages.GetJobRequest{Id: "j1"},
			check: func(m proto.Message) bool {
				r, ok := m.(*messages.GetJobResponse)
				return ok && r.GetJob().GetId() == "j1"
			}},
		{name: "table: function", msg: &messages.StopNodeRequest{},
			check: func(m proto.Message) bool { r, ok := m.(*messages.StopNodeResponse); return ok && r.GetNode() == "n1" }},
		{name: "the actor's own error", msg: &messages.GetJobRequest{Id: "missing"}, code: connect.CodeNotFound, is: actors.ErrJobNotFound},
		{name: "no route", msg: &messages.DrainRequest{}, code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "envelope routed by type", msg: &messages.SendRequest{Version: current, Message: pack(t, &messages.NodesRequest{})},
			check: func(m proto.Message) bool {
				r, ok := m.(*messages.SendResponse)
				if !ok {
					return false
				}
				inner, err := r.GetReply().UnmarshalNew()
				return err == nil && inner.(*messages.NodesResponse).GetNodes()[0].GetName() == "n1"
			}},
		{name: "envelope to a named actor", msg: &messages.SendRequest{Actor: "job_server/acceptor", Message: pack(t, &messages.GetJobRequest{Id: "j2"})},
			check: func(m proto.Message) bool {
				r, ok := m.(*messages.SendResponse)
				if !ok {
					return false
				}
				inner, err := r.GetReply().UnmarshalNew()
				return err == nil && inner.(*messages.GetJobResponse).GetJob().GetId() == "j2"
			}},
		{name: "envelope to an actor that does not handle it", msg: &messages.SendRequest{Actor: "clustering", Message: pack(t, &messages.GetJobRequest{Id: "j"})},
			code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "envelope to a supervisor", msg: &messages.SendRequest{Actor: "job_server", Message: pack(t, &messages.NodesRequest{})},
			code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "envelope to no such actor", msg: &messages.SendRequest{Actor: "nobody", Message: pack(t, &messages.NodesRequest{})},
			code: connect.CodeNotFound, is: actors.ErrUnknownActor},
		{name: "empty envelope", msg: &messages.SendRequest{}, code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "envelope of another version", msg: &messages.SendRequest{Version: current + 1, Message: pack(t, &messages.NodesRequest{})},
			code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "nested envelope", msg: &messages.SendRequest{Message: pack(t, &messages.SendRequest{Message: pack(t, &messages.NodesRequest{})})},
			code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
		{name: "nil", msg: nil, code: connect.CodeUnimplemented, is: actors.ErrUnknownRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reply, err := tr.r.Request(tr.ctx, c.msg)
			if c.code == 0 {
				if err != nil {
					t.Fatalf("Request: %v", err)
				}
				if !c.check(reply) {
					t.Fatalf("reply %T %v", reply, reply)
				}
				return
			}
			if err == nil {
				t.Fatalf("reply %v, want an error", reply)
			}
			if !errors.Is(err, c.is) || router.Code(err) != c.code {
				t.Fatalf("error %v (code %v), want %v (code %v)", err, router.Code(err), c.is, c.code)
			}
		})
	}
}

// TestTreeRequest: the tree answers with the node's name, every actor of
// the tree and the store's health, its credentials redacted.
func TestTreeRequest(t *testing.T) {
	tr := start(t)
	reply, err := tr.r.Request(tr.ctx, &messages.TreeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp := reply.(*messages.TreeResponse)
	if resp.GetNode() != "n1" || resp.GetRoot().GetName() != "couchrep_sup" || !resp.GetRoot().GetSupervisor() {
		t.Fatalf("tree %v", resp)
	}
	var names []string
	var walk func(n *messages.TreeNode)
	walk = func(n *messages.TreeNode) {
		names = append(names, n.GetName())
		for _, c := range n.GetChildren() {
			walk(c)
		}
	}
	walk(resp.GetRoot())
	if got := strings.Join(names, ","); got != "couchrep_sup,clustering,job_server,acceptor" {
		t.Errorf("tree names %s", got)
	}
	if strings.Contains(resp.GetStore(), "hunter2") || !strings.HasPrefix(resp.GetStore(), "unavailable") {
		t.Errorf("store health %q: want it unavailable, without the password", resp.GetStore())
	}
}

// TestKill: a killed worker is restarted by its supervisor (a new
// incarnation answers requests), the top supervisor is refused, and an
// unknown actor is not found.
func TestKill(t *testing.T) {
	tr := start(t)
	incarnation := func() uint64 { return router.Find(treeOf(t, tr), "clustering").Incarnation }
	before := incarnation()
	reply, err := tr.r.Request(tr.ctx, &messages.KillRequest{Actor: "clustering", Reason: "test"})
	if err != nil {
		t.Fatalf("kill: %v", err)
	}
	if k := reply.(*messages.KillResponse); k.GetPid() != "couchrep_sup/clustering" || k.GetIncarnation() != before {
		t.Fatalf("kill reply %v, want couchrep_sup/clustering incarnation %d", k, before)
	}
	// The router waits for the next incarnation within the deadline.
	if _, err := tr.r.Request(tr.ctx, &messages.NodesRequest{}); err != nil {
		t.Fatalf("request after the kill: %v", err)
	}
	if after := incarnation(); after == before {
		t.Errorf("incarnation %d after the kill, want a new one", after)
	}
	if _, err := tr.r.Request(tr.ctx, &messages.KillRequest{Actor: "couchrep_sup"}); err == nil || !strings.Contains(err.Error(), "refusing to kill the top supervisor") {
		t.Errorf("kill of the top supervisor: %v", err)
	}
	if _, err := tr.r.Request(tr.ctx, &messages.KillRequest{Actor: "nobody"}); !errors.Is(err, actors.ErrUnknownActor) || router.Code(err) != connect.CodeNotFound {
		t.Errorf("kill of no such actor: %v", err)
	}
}

func treeOf(t *testing.T, tr *tree) *supervisor.TreeNode {
	t.Helper()
	root, err := supervisor.Which(tr.ctx, tr.system, tr.sup.PID())
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestStopped: once the tree is stopped every request is ErrStopped
// (unavailable).
func TestStopped(t *testing.T) {
	tr := start(t)
	if err := tr.sup.Stop(tr.ctx); err != nil {
		t.Fatal(err)
	}
	_, err := tr.r.Request(tr.ctx, &messages.NodesRequest{})
	if !errors.Is(err, actors.ErrStopped) || router.Code(err) != connect.CodeUnavailable {
		t.Fatalf("request to a stopped tree: %v (code %v)", err, router.Code(err))
	}
}

// TestFind: by child name, full actor id and path from the root.
func TestFind(t *testing.T) {
	tr := start(t)
	root := treeOf(t, tr)
	for _, name := range []string{"acceptor", "couchrep_sup/job_server/acceptor", "job_server/acceptor"} {
		if n := router.Find(root, name); n == nil || n.PID.Id != "couchrep_sup/job_server/acceptor" {
			t.Errorf("Find(%q) = %v", name, n)
		}
	}
	if n := router.Find(root, "job_server/nobody"); n != nil {
		t.Errorf("Find of no such actor = %v", n.PID)
	}
}

// TestCode: every sentinel error maps to its admin protocol code, wrapped
// or not.
func TestCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		want connect.Code
	}{
		{actors.ErrUnknownActor, connect.CodeNotFound},
		{actors.ErrJobNotFound, connect.CodeNotFound},
		{actors.ErrUnknownRequest, connect.CodeUnimplemented},
		{actors.ErrInvalidRequest, connect.CodeInvalidArgument},
		{actors.ErrJobNotRunning, connect.CodeFailedPrecondition},
		{actors.ErrJobElsewhere, connect.CodeFailedPrecondition},
		{actors.ErrJobFollowsDocument, connect.CodeFailedPrecondition},
		{actors.ErrStopped, connect.CodeUnavailable},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{context.Canceled, connect.CodeCanceled},
		{errors.New("boom"), connect.CodeInternal},
	} {
		if got := router.Code(fmt.Errorf("wrapped: %w", c.err)); got != c.want {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
