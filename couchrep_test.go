package couchrep_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// protoactor's dead-letter throttle outlives its actor system by design.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

// startNode starts an in-process node in a temp dir, stopped at the end.
func startNode(t *testing.T, opts ...couchrep.Option) *couchrep.Node {
	t.Helper()
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.HTTPBind = "127.0.0.1:0"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := couchrep.Start(ctx, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := n.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return n
}

// unreachable is a replication whose endpoints refuse connections: its job
// exists (and crashes), which is all these tests need.
const unreachable = `{"source":"http://127.0.0.1:1/a","target":"http://127.0.0.1:1/b","continuous":true}`

func TestRequestErrors(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	one := uint32(0)
	for _, tc := range []struct {
		name string
		msg  proto.Message
		want error
	}{
		{"unknown type", &messages.JobEvent{}, couchrep.ErrUnknownRequest},
		{"nil", nil, couchrep.ErrUnknownRequest},
		{"unknown job", &messages.GetJobRequest{Id: "nope"}, couchrep.ErrJobNotFound},
		{"empty job id", &messages.StopJobRequest{}, couchrep.ErrJobNotFound},
		{"cancel unknown job", &messages.CancelJobRequest{Id: "nope"}, couchrep.ErrJobNotFound},
		{"invalid replication", &messages.ReplicateRequest{Body: `{"source":"x"}`}, couchrep.ErrInvalidRequest},
		{"max_jobs 0", &messages.SetConfigRequest{MaxJobs: &one}, couchrep.ErrInvalidRequest},
		{"kill unknown actor", &messages.KillRequest{Actor: "nobody"}, couchrep.ErrUnknownActor},
		{"send to unknown actor", send(t, "nobody", &messages.TreeRequest{}), couchrep.ErrUnknownActor},
		{"send unhandled type", send(t, "scheduler", &messages.DrainRequest{}), couchrep.ErrUnknownRequest},
		{"send to a supervisor", send(t, "job_server", &messages.DrainRequest{}), couchrep.ErrUnknownRequest},
		{"send unknown type", &messages.SendRequest{Message: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}}, couchrep.ErrUnknownRequest},
		{"send wrong version", &messages.SendRequest{Version: 99, Message: mustAny(t, &messages.TreeRequest{})}, couchrep.ErrUnknownRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Request(ctx, tc.msg)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func mustAny(t *testing.T, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func send(t *testing.T, actor string, m proto.Message) *messages.SendRequest {
	return &messages.SendRequest{Actor: actor, Message: mustAny(t, m)}
}

func request[T proto.Message](t *testing.T, n *couchrep.Node, msg proto.Message) T {
	t.Helper()
	reply, err := n.Request(context.Background(), msg)
	if err != nil {
		t.Fatalf("%T: %v", msg, err)
	}
	r, ok := reply.(T)
	if !ok {
		t.Fatalf("%T answered %T", msg, reply)
	}
	return r
}

func TestRequestSchedulerSettings(t *testing.T) {
	n := startNode(t)
	set := request[*messages.SetSharesResponse](t, n, &messages.SetSharesRequest{Shares: map[string]uint32{"a/_replicator": 300, "b": 5000}})
	if set.GetShares()["a/_replicator"] != 300 || set.GetShares()["b"] != 1000 || set.GetDefaultShares() != 100 {
		t.Fatalf("set shares (5000 clamps to 1000): %v", set)
	}
	get := request[*messages.GetSharesResponse](t, n, &messages.GetSharesRequest{})
	if !proto.Equal(get, &messages.GetSharesResponse{Shares: set.GetShares(), DefaultShares: 100}) {
		t.Fatalf("get shares: %v", get)
	}
	jobs, churn := uint32(3), uint32(2)
	cfg := request[*messages.SetConfigResponse](t, n, &messages.SetConfigRequest{MaxJobs: &jobs})
	if cfg.GetMaxJobs() != 3 || cfg.GetMaxChurn() != 20 {
		t.Fatalf("set max_jobs: %v", cfg)
	}
	cfg = request[*messages.SetConfigResponse](t, n, &messages.SetConfigRequest{MaxChurn: &churn})
	st := request[*messages.SchedulerStatusResponse](t, n, &messages.SchedulerStatusRequest{})
	if cfg.GetMaxJobs() != 3 || cfg.GetMaxChurn() != 2 || st.GetMaxJobs() != 3 || st.GetMaxChurn() != 2 {
		t.Fatalf("set max_churn: %v, status %v", cfg, st)
	}
	// The generic envelope reaches the same actor with the same answer.
	env := request[*messages.SendResponse](t, n, send(t, "scheduler", &messages.GetSharesRequest{}))
	var viaSend messages.GetSharesResponse
	if err := env.GetReply().UnmarshalTo(&viaSend); err != nil || !proto.Equal(&viaSend, get) {
		t.Fatalf("send GetShares: %v %v", &viaSend, err)
	}
}

func TestRequestJobLifecycle(t *testing.T) {
	n := startNode(t)
	rep := request[*messages.ReplicateResponse](t, n, &messages.ReplicateRequest{Body: unreachable, User: "bob"})
	if rep.GetId() == "" {
		t.Fatal("no job id")
	}
	list := request[*messages.ListJobsResponse](t, n, &messages.ListJobsRequest{})
	if list.GetTotal() != 1 || list.GetJobs()[0].GetId() != rep.GetId() || list.GetJobs()[0].GetKind() != "transient" ||
		!list.GetJobs()[0].GetContinuous() || list.GetJobs()[0].GetSource() != "http://127.0.0.1:1/a/" {
		t.Fatalf("list: %v", list)
	}
	none := request[*messages.ListJobsResponse](t, n, &messages.ListJobsRequest{Database: "other/_replicator"})
	if none.GetTotal() != 0 {
		t.Fatalf("list by database: %v", none)
	}
	got := request[*messages.GetJobResponse](t, n, &messages.GetJobRequest{Id: rep.GetId()})
	if got.GetJob().GetId() != rep.GetId() || len(got.GetJob().GetHistory()) == 0 {
		t.Fatalf("get: %v", got)
	}
	// A restart resubmits it due now, whatever state it reached.
	if r := request[*messages.RestartJobResponse](t, n, &messages.RestartJobRequest{Id: rep.GetId()}); r.GetJob().GetId() != rep.GetId() {
		t.Fatalf("restart: %v", r)
	}
	c := request[*messages.CancelJobResponse](t, n, &messages.CancelJobRequest{Id: rep.GetId()})
	if c.GetId() != rep.GetId() {
		t.Fatalf("cancel: %v", c)
	}
	if _, err := n.Request(context.Background(), &messages.GetJobRequest{Id: rep.GetId()}); !errors.Is(err, couchrep.ErrJobNotFound) {
		t.Fatalf("get after cancel: %v", err)
	}
}

func TestDrainUndrain(t *testing.T) {
	n := startNode(t)
	d := request[*messages.DrainResponse](t, n, &messages.DrainRequest{})
	if d.GetReleased() != 0 || !n.Draining() {
		t.Fatalf("drain of an idle node: %v, draining %v", d, n.Draining())
	}
	nodes := request[*messages.NodesResponse](t, n, &messages.NodesRequest{})
	if len(nodes.GetNodes()) != 1 || nodes.GetNodes()[0].GetName() != n.Name() || !nodes.GetNodes()[0].GetDraining() {
		t.Fatalf("nodes while drained: %v", nodes)
	}
	request[*messages.UndrainResponse](t, n, &messages.UndrainRequest{})
	if n.Draining() {
		t.Fatal("still draining after undrain")
	}
}

func TestStopNodeRequestStopsTheNode(t *testing.T) {
	n := startNode(t)
	r := request[*messages.StopNodeResponse](t, n, &messages.StopNodeRequest{})
	if r.GetNode() != n.Name() {
		t.Fatalf("stop node: %v", r)
	}
	<-n.Done()
	if n.Err() != nil {
		t.Fatalf("err after a requested stop: %v", n.Err())
	}
	if _, err := n.Request(context.Background(), &messages.TreeRequest{}); !errors.Is(err, couchrep.ErrStopped) {
		t.Fatalf("request after stop: %v", err)
	}
	// Stop after the requested stop waits for it and agrees.
	if err := n.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestAdminHandler: the admin endpoint is Node.Request behind a token, with
// the protocol's error codes.
func TestAdminHandler(t *testing.T) {
	n := startNode(t)
	path, h := n.AdminHandler("s3cret")
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	auth := func(token string) connect.ClientOption {
		return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", "Bearer "+token)
				req.Header().Set(admin.VersionHeader, admin.Version)
				return next(ctx, req)
			}
		}))
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		token string
		call  func(c messagesconnect.AdminServiceClient) error
		want  connect.Code // 0: success
	}{
		{"no token", "", func(c messagesconnect.AdminServiceClient) error {
			_, err := c.Kill(ctx, connect.NewRequest(&messages.KillRequest{Actor: "scheduler"}))
			return err
		}, connect.CodeUnauthenticated},
		{"tree", "s3cret", func(c messagesconnect.AdminServiceClient) error {
			_, err := c.Tree(ctx, connect.NewRequest(&messages.TreeRequest{}))
			return err
		}, 0},
		{"unknown job", "s3cret", func(c messagesconnect.AdminServiceClient) error {
			_, err := c.GetJob(ctx, connect.NewRequest(&messages.GetJobRequest{Id: "x"}))
			return err
		}, connect.CodeNotFound},
		{"stop a job that is not running", "s3cret", func(c messagesconnect.AdminServiceClient) error {
			r, err := c.Send(ctx, connect.NewRequest(send(t, "", &messages.ReplicateRequest{Body: unreachable})))
			if err != nil {
				return err
			}
			var rep messages.ReplicateResponse
			if err := r.Msg.GetReply().UnmarshalTo(&rep); err != nil {
				return err
			}
			if _, err := c.CancelJob(ctx, connect.NewRequest(&messages.CancelJobRequest{Id: rep.GetId()})); err != nil {
				return err
			}
			_, err = c.StopJob(ctx, connect.NewRequest(&messages.StopJobRequest{Id: rep.GetId()}))
			return err
		}, connect.CodeNotFound},
		{"invalid config", "s3cret", func(c messagesconnect.AdminServiceClient) error {
			zero := uint32(0)
			_, err := c.SetConfig(ctx, connect.NewRequest(&messages.SetConfigRequest{MaxChurn: &zero}))
			return err
		}, connect.CodeInvalidArgument},
		{"unhandled type", "s3cret", func(c messagesconnect.AdminServiceClient) error {
			_, err := c.Send(ctx, connect.NewRequest(send(t, "http_api", &messages.NodesRequest{})))
			return err
		}, connect.CodeUnimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := messagesconnect.NewAdminServiceClient(srv.Client(), srv.URL, auth(tc.token))
			err := tc.call(c)
			if tc.want == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if connect.CodeOf(err) != tc.want {
				t.Fatalf("err %v (code %v), want %v", err, connect.CodeOf(err), tc.want)
			}
		})
	}
}

func TestAdminCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want connect.Code
	}{
		{couchrep.ErrUnknownActor, connect.CodeNotFound},
		{couchrep.ErrJobNotFound, connect.CodeNotFound},
		{couchrep.ErrUnknownRequest, connect.CodeUnimplemented},
		{couchrep.ErrInvalidRequest, connect.CodeInvalidArgument},
		{couchrep.ErrJobNotRunning, connect.CodeFailedPrecondition},
		{couchrep.ErrJobElsewhere, connect.CodeFailedPrecondition},
		{couchrep.ErrStopped, connect.CodeUnavailable},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded},
		{errors.New("boom"), connect.CodeInternal},
	} {
		wrapped := errors.Join(errors.New("context"), tc.err)
		if got := couchrep.AdminCode(wrapped); got != tc.want {
			t.Errorf("AdminCode(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestSharedStore: two nodes in one process on one store see the same jobs,
// and either can cancel it.
func TestSharedStore(t *testing.T) {
	ctx := context.Background()
	store, err := couchrep.OpenStore(ctx, t.TempDir()+"/shared.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() }) // after the nodes' stops (cleanups run last-in first-out)
	a := startNode(t, couchrep.WithStore(store))
	b := startNode(t, couchrep.WithStore(store))
	rep := request[*messages.ReplicateResponse](t, a, &messages.ReplicateRequest{Body: unreachable})
	list := request[*messages.ListJobsResponse](t, b, &messages.ListJobsRequest{})
	if list.GetTotal() != 1 || list.GetJobs()[0].GetId() != rep.GetId() {
		t.Fatalf("node b sees %v", list)
	}
	// Both nodes compute replication ids with one server UUID (the first
	// node's, recorded in the store), or a job moving between them would not
	// find its checkpoints.
	if a.ServerUUID() == "" || a.ServerUUID() != b.ServerUUID() {
		t.Fatalf("server uuids %q and %q, want one shared uuid", a.ServerUUID(), b.ServerUUID())
	}
	request[*messages.CancelJobResponse](t, b, &messages.CancelJobRequest{Id: rep.GetId()})
	if list := request[*messages.ListJobsResponse](t, a, &messages.ListJobsRequest{}); list.GetTotal() != 0 {
		t.Fatalf("node a sees %v after b canceled", list)
	}
}

// TestFDBStoreNeedsTheBuildTag: a FoundationDB store location in a build
// without -tags fdb is a clear error, not a SQLite file named "fdb:...".
func TestFDBStoreNeedsTheBuildTag(t *testing.T) {
	if couchrep.FDBSupported() {
		t.Skip("built with -tags fdb")
	}
	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = t.TempDir()
	cfg.Couchrep.Store = "fdb:/etc/foundationdb/fdb.cluster"
	_, err := couchrep.Start(context.Background(), cfg)
	if !errors.Is(err, couchrep.ErrNoFDB) {
		t.Fatalf("Start with an fdb: store = %v, want ErrNoFDB", err)
	}
	if _, err := couchrep.OpenStore(context.Background(), "fdb:"); !errors.Is(err, couchrep.ErrNoFDB) {
		t.Fatalf("OpenStore(fdb:) = %v, want ErrNoFDB", err)
	}
}
