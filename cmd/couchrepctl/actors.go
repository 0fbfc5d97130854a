package main

// The commands about the node's actors: tree, kill, send.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/couchrep/couchrep/messages"
)

func runTree(ctx context.Context, e *env, _ []string) error {
	return request(ctx, e, e.client.Tree, &messages.TreeRequest{}, func(w io.Writer, r *messages.TreeResponse) error {
		fmt.Fprintf(w, "node %s\n", r.GetNode())
		if st := r.GetStore(); st != "" {
			fmt.Fprintf(w, "store %s\n", st)
		}
		tw := newTable(w)
		fmt.Fprintln(tw, "ACTOR\tKIND\tSTATE\tRESTARTS\tINCARNATION\tUP\tPID")
		printTree(tw, r.GetRoot(), "", "", time.Now())
		return tw.Flush()
	})
}

func printTree(w io.Writer, n *messages.TreeNode, prefix, childPrefix string, now time.Time) {
	kind := "worker"
	if n.GetSupervisor() {
		kind = lower("STRATEGY_", n.GetStrategy())
	}
	fmt.Fprintf(w, "%s%s\t%s\t%s\t%d\t%d\t%s\t%s\n", prefix, n.GetName(), kind, lower("CHILD_STATE_", n.GetState()),
		n.GetRestartCount(), n.GetIncarnation(), age(now, n.GetStartedAt(), n.GetStartedAt() != nil), n.GetPid())
	for i, c := range n.GetChildren() {
		if i == len(n.GetChildren())-1 {
			printTree(w, c, childPrefix+"└─ ", childPrefix+"   ", now)
		} else {
			printTree(w, c, childPrefix+"├─ ", childPrefix+"│  ", now)
		}
	}
}

func runKill(ctx context.Context, e *env, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return usagef("kill takes an actor name and an optional reason")
	}
	req := &messages.KillRequest{Actor: args[0]}
	if len(args) == 2 {
		req.Reason = args[1]
	}
	return request(ctx, e, e.client.Kill, req, func(w io.Writer, r *messages.KillResponse) error {
		fmt.Fprintf(w, "killed %s (incarnation %d)\n", r.GetPid(), r.GetIncarnation())
		return nil
	})
}

func runSend(ctx context.Context, e *env, args []string) error {
	if len(args) < 2 || len(args) > 3 {
		return usagef("send takes an actor, a message type and an optional JSON body")
	}
	actor, typ := args[0], strings.TrimPrefix(args[1], "type.googleapis.com/")
	body := "{}"
	if len(args) == 3 {
		body = args[2]
	}
	var packed *anypb.Any
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	switch {
	case err == nil:
		msg := mt.New().Interface()
		if err := protojson.Unmarshal([]byte(body), msg); err != nil {
			return usagef("JSON body of %s: %v", typ, err)
		}
		if packed, err = anypb.New(msg); err != nil {
			return err
		}
	case strings.TrimSpace(body) == "{}":
		// A type this build does not know: let the node judge it.
		packed = &anypb.Any{TypeUrl: "type.googleapis.com/" + typ}
	default:
		return usagef("unknown message type %q: only an empty body can be sent for it", typ)
	}
	r, err := sendAny(ctx, e, actor, packed)
	if err != nil {
		return err
	}
	reply, err := r.UnmarshalNew()
	if err != nil {
		return fmt.Errorf("reply of type %s: %w", r.GetTypeUrl(), err)
	}
	if !e.g.json {
		fmt.Fprintf(e.out, "%s\n", reply.ProtoReflect().Descriptor().FullName())
	}
	return printJSON(e.out, reply)
}
