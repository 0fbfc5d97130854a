// Package admin is a node's admin endpoint: a Connect service (gRPC, gRPC-Web
// and plain HTTP with protobuf or JSON bodies) whose every request is an
// actor message delivered to the node, answered with the actor's reply.
package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

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

// Handler returns the mount path and HTTP handler of the admin service.
func Handler(r Requester, classify Classify) (string, http.Handler) {
	return messagesconnect.NewAdminServiceHandler(&service{r: r, classify: classify})
}

type service struct {
	r        Requester
	classify Classify
}

func (s *service) Tree(ctx context.Context, req *connect.Request[messages.TreeRequest]) (*connect.Response[messages.TreeResponse], error) {
	return call[messages.TreeResponse](ctx, s, req.Msg)
}

func (s *service) Kill(ctx context.Context, req *connect.Request[messages.KillRequest]) (*connect.Response[messages.KillResponse], error) {
	return call[messages.KillResponse](ctx, s, req.Msg)
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
		return nil, connect.NewError(code, err)
	}
	typed, ok := reply.(PResp)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("admin: unexpected reply %T", reply))
	}
	return connect.NewResponse((*Resp)(typed)), nil
}

// ErrUnauthenticated is returned for requests without the admin token.
var ErrUnauthenticated = errors.New("admin: missing or wrong token")
