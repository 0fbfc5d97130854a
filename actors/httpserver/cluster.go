package httpserver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/messages"
)

// cluster answers the status page's questions with the node's admin
// requests (the replies couchrepctl nodes and tree print).
type cluster struct {
	deps  actors.Deps
	store *repjob.Store
}

func (c cluster) Nodes(ctx context.Context) (*messages.NodesResponse, error) {
	return ask[*messages.NodesResponse](ctx, c.deps, &messages.NodesRequest{})
}

func (c cluster) Tree(ctx context.Context) (*messages.TreeResponse, error) {
	return ask[*messages.TreeResponse](ctx, c.deps, &messages.TreeRequest{})
}

func (c cluster) Shares() map[string]int { return c.store.Shares() }

func (c cluster) Self() string { return c.deps.NodeName() }

var errNoNode = errors.New("http api: not running in a node")

func ask[T proto.Message](ctx context.Context, deps actors.Deps, req proto.Message) (T, error) {
	var zero T
	if deps.Request == nil {
		return zero, errNoNode
	}
	reply, err := deps.Request(ctx, req)
	if err != nil {
		return zero, err
	}
	got, ok := reply.(T)
	if !ok {
		return zero, fmt.Errorf("http api: %s answered %T", req.ProtoReflect().Descriptor().FullName(), reply)
	}
	return got, nil
}
