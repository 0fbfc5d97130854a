// Package admin is a node's admin endpoint: a Connect service (gRPC, gRPC-Web
// and plain HTTP with protobuf or JSON bodies) whose every request is an
// actor message delivered to the node, answered with the actor's reply.
package admin

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

// Requester delivers an admin message to the actor that handles it. A
// couchrep.Node is one.
type Requester interface {
	Request(ctx context.Context, msg proto.Message) (proto.Message, error)
}

// Classify maps a requester error to a Connect error code. Errors that match
// none of the given sentinels are internal errors.
type Classify func(err error) connect.Code

// VersionHeader carries the admin protocol version a client speaks.
const VersionHeader = "Couchrep-Admin-Version"

// Version is the admin protocol version this build speaks.
var Version = strconv.Itoa(int(messages.AdminProtocolVersion_ADMIN_PROTOCOL_VERSION_CURRENT))

// Options configure Handler.
type Options struct {
	// Token, when set, is the secret every request must carry as
	// "Authorization: Bearer <token>".
	Token string
	// Classify maps requester errors to Connect codes.
	Classify Classify
	// Verify runs the Verify RPC: it sends each line of the answer, and
	// returns the error that ends it (a Connect error, or any error:
	// internal). Nil: Verify answers Unimplemented.
	Verify func(ctx context.Context, req *messages.VerifyRequest, send func(*messages.VerifyResponse) error) error
}

// Handler returns the mount path and HTTP handler of the admin service.
func Handler(r Requester, opts Options) (string, http.Handler) {
	return messagesconnect.NewAdminServiceHandler(&service{r: r, classify: opts.Classify, verify: opts.Verify, token: opts.Token},
		connect.WithInterceptors(guard(opts.Token)))
}

// PprofPath is where Pprof's handler is mounted.
const PprofPath = "/debug/pprof/"

// Pprof returns the handler of Go's profiles (net/http/pprof: heap,
// goroutine, profile, trace, ...) for the admin endpoint ([admin] pprof),
// mounted at PprofPath; with token set every request must carry it as the
// admin service's do, else it gets 401.
func Pprof(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PprofPath, pprof.Index)
	mux.HandleFunc(PprofPath+"cmdline", pprof.Cmdline)
	mux.HandleFunc(PprofPath+"profile", pprof.Profile)
	mux.HandleFunc(PprofPath+"symbol", pprof.Symbol)
	mux.HandleFunc(PprofPath+"trace", pprof.Trace)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if token != "" {
			got := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
			if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				http.Error(w, ErrUnauthenticated.Error(), http.StatusUnauthorized)
				return
			}
		}
		mux.ServeHTTP(w, req)
	})
}

// guard rejects requests without the token or speaking another protocol
// version, before they reach any actor.
func guard(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if err := admitted(token, req.Header()); err != nil {
				return nil, err
			}
			return next(ctx, req)
		}
	}
}

// admitted checks a request's token and protocol version (the guard's
// checks; a streaming RPC makes them itself: the interceptor is unary).
func admitted(token string, h http.Header) error {
	if token != "" {
		got := strings.TrimPrefix(h.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			return connect.NewError(connect.CodeUnauthenticated, ErrUnauthenticated)
		}
	}
	if v := h.Get(VersionHeader); v != "" && v != Version {
		return connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("%w: client speaks version %s, this node speaks %s", ErrVersion, v, Version))
	}
	return nil
}

type service struct {
	r        Requester
	classify Classify
	verify   func(ctx context.Context, req *messages.VerifyRequest, send func(*messages.VerifyResponse) error) error
	token    string
}

func (s *service) Verify(ctx context.Context, req *connect.Request[messages.VerifyRequest], stream *connect.ServerStream[messages.VerifyResponse]) error {
	if err := admitted(s.token, req.Header()); err != nil {
		return err
	}
	if s.verify == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this node does not verify"))
	}
	return s.verify(ctx, req.Msg, stream.Send)
}

func (s *service) Tree(ctx context.Context, req *connect.Request[messages.TreeRequest]) (*connect.Response[messages.TreeResponse], error) {
	return call[messages.TreeResponse](ctx, s, req.Msg)
}

func (s *service) Kill(ctx context.Context, req *connect.Request[messages.KillRequest]) (*connect.Response[messages.KillResponse], error) {
	return call[messages.KillResponse](ctx, s, req.Msg)
}

func (s *service) ListJobs(ctx context.Context, req *connect.Request[messages.ListJobsRequest]) (*connect.Response[messages.ListJobsResponse], error) {
	return call[messages.ListJobsResponse](ctx, s, req.Msg)
}

func (s *service) GetJob(ctx context.Context, req *connect.Request[messages.GetJobRequest]) (*connect.Response[messages.GetJobResponse], error) {
	return call[messages.GetJobResponse](ctx, s, req.Msg)
}

func (s *service) StopJob(ctx context.Context, req *connect.Request[messages.StopJobRequest]) (*connect.Response[messages.StopJobResponse], error) {
	return call[messages.StopJobResponse](ctx, s, req.Msg)
}

func (s *service) RestartJob(ctx context.Context, req *connect.Request[messages.RestartJobRequest]) (*connect.Response[messages.RestartJobResponse], error) {
	return call[messages.RestartJobResponse](ctx, s, req.Msg)
}

func (s *service) PauseJob(ctx context.Context, req *connect.Request[messages.PauseJobRequest]) (*connect.Response[messages.PauseJobResponse], error) {
	return call[messages.PauseJobResponse](ctx, s, req.Msg)
}

func (s *service) ResumeJob(ctx context.Context, req *connect.Request[messages.ResumeJobRequest]) (*connect.Response[messages.ResumeJobResponse], error) {
	return call[messages.ResumeJobResponse](ctx, s, req.Msg)
}

func (s *service) ResetJob(ctx context.Context, req *connect.Request[messages.ResetJobRequest]) (*connect.Response[messages.ResetJobResponse], error) {
	return call[messages.ResetJobResponse](ctx, s, req.Msg)
}

func (s *service) CancelJob(ctx context.Context, req *connect.Request[messages.CancelJobRequest]) (*connect.Response[messages.CancelJobResponse], error) {
	return call[messages.CancelJobResponse](ctx, s, req.Msg)
}

func (s *service) GetShares(ctx context.Context, req *connect.Request[messages.GetSharesRequest]) (*connect.Response[messages.GetSharesResponse], error) {
	return call[messages.GetSharesResponse](ctx, s, req.Msg)
}

func (s *service) SetShares(ctx context.Context, req *connect.Request[messages.SetSharesRequest]) (*connect.Response[messages.SetSharesResponse], error) {
	return call[messages.SetSharesResponse](ctx, s, req.Msg)
}

func (s *service) SetConfig(ctx context.Context, req *connect.Request[messages.SetConfigRequest]) (*connect.Response[messages.SetConfigResponse], error) {
	return call[messages.SetConfigResponse](ctx, s, req.Msg)
}

func (s *service) Drain(ctx context.Context, req *connect.Request[messages.DrainRequest]) (*connect.Response[messages.DrainResponse], error) {
	return call[messages.DrainResponse](ctx, s, req.Msg)
}

func (s *service) Undrain(ctx context.Context, req *connect.Request[messages.UndrainRequest]) (*connect.Response[messages.UndrainResponse], error) {
	return call[messages.UndrainResponse](ctx, s, req.Msg)
}

func (s *service) StopNode(ctx context.Context, req *connect.Request[messages.StopNodeRequest]) (*connect.Response[messages.StopNodeResponse], error) {
	return call[messages.StopNodeResponse](ctx, s, req.Msg)
}

func (s *service) Nodes(ctx context.Context, req *connect.Request[messages.NodesRequest]) (*connect.Response[messages.NodesResponse], error) {
	return call[messages.NodesResponse](ctx, s, req.Msg)
}

func (s *service) Send(ctx context.Context, req *connect.Request[messages.SendRequest]) (*connect.Response[messages.SendResponse], error) {
	return call[messages.SendResponse](ctx, s, req.Msg)
}

// call is the one code path of every RPC: deliver, type-check the reply.
func call[Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, s *service, msg proto.Message) (*connect.Response[Resp], error) {
	reply, err := s.r.Request(ctx, msg)
	if err != nil {
		code := connect.CodeInternal
		if s.classify != nil {
			code = s.classify(err)
		}
		return nil, connect.NewError(code, redact.Error(err))
	}
	typed, ok := reply.(PResp)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("admin: unexpected reply %T", reply))
	}
	return connect.NewResponse((*Resp)(typed)), nil
}

// Sentinel errors of the admin endpoint.
var (
	// ErrUnauthenticated is returned for requests without the admin token.
	ErrUnauthenticated = errors.New("admin: missing or wrong token")
	// ErrVersion is returned for requests in another protocol version.
	ErrVersion = errors.New("admin: unsupported protocol version")
)
