package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/couchrep/couchrep/messages"
)

// The one request helper every command goes through: ask sends one admin
// request bounded by --timeout; request also prints the reply, as JSON with
// --json and with the command's text printer otherwise.

// rpcMethod is one method of the admin service client.
type rpcMethod[Req, Resp any] func(context.Context, *connect.Request[Req]) (*connect.Response[Resp], error)

// ask sends req through method under --timeout and returns the reply.
func ask[Req, Resp any](ctx context.Context, e *env, method rpcMethod[Req, Resp], req *Req) (*Resp, error) {
	c, cancel := context.WithTimeout(ctx, e.g.timeout)
	defer cancel()
	resp, err := method(c, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// request sends req through method and prints the reply: as JSON with
// --json, else with text.
func request[Req, Resp any](ctx context.Context, e *env, method rpcMethod[Req, Resp], req *Req, text func(w io.Writer, reply *Resp) error) error {
	reply, err := ask(ctx, e, method, req)
	if err != nil {
		return err
	}
	if e.g.json {
		return printJSON(e.out, any(reply).(proto.Message))
	}
	return text(e.out, reply)
}

// sendAny delivers a packed message in the generic envelope to actor (""
// for whichever actor handles it) and returns the packed reply.
func sendAny(ctx context.Context, e *env, actor string, packed *anypb.Any) (*anypb.Any, error) {
	resp, err := ask(ctx, e, e.client.Send, &messages.SendRequest{
		Version: uint32(messages.AdminProtocolVersion_ADMIN_PROTOCOL_VERSION_CURRENT), Actor: actor, Message: packed})
	if err != nil {
		return nil, err
	}
	return resp.GetReply(), nil
}

// send delivers msg in the generic envelope and unpacks the reply into
// reply.
func send(ctx context.Context, e *env, actor string, msg, reply proto.Message) error {
	packed, err := anypb.New(msg)
	if err != nil {
		return err
	}
	r, err := sendAny(ctx, e, actor, packed)
	if err != nil {
		return err
	}
	return r.UnmarshalTo(reply)
}

// newTable returns the writer of a command's aligned text table: columns
// two spaces apart; Flush writes it.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true, EmitUnpopulated: true}

func printJSON(out io.Writer, m proto.Message) error {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

// noArgs refuses arguments to a command whose table entry lists none.
func noArgs(c *command, args []string) error {
	if c.args == "" && len(args) != 0 {
		return usagef("%s takes no arguments", c.name)
	}
	return nil
}

func oneID(name string, args []string) (string, error) {
	if len(args) != 1 || args[0] == "" {
		return "", usagef("%s takes one job id (or replication id)", name)
	}
	return args[0], nil
}

// lower turns an enum value name into its short form: ("CHILD_STATE_", X) -> "x".
func lower(prefix string, v fmt.Stringer) string {
	return strings.ToLower(strings.TrimPrefix(v.String(), prefix))
}

func age(now time.Time, t interface{ AsTime() time.Time }, set bool) string {
	if !set {
		return "-"
	}
	d := now.Sub(t.AsTime())
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String()
}
