// Command couchrepctl drives a running couchrep node through its admin
// endpoint: every subcommand sends one protobuf actor message and prints the
// actor's reply.
//
//	couchrepctl [--node ADDR] [--json] [--timeout D] tree
//	couchrepctl [--node ADDR] [--json] [--timeout D] kill ACTOR [REASON]
//
// Exit codes: 0 ok, 1 error, 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type globals struct {
	node    string
	token   string
	json    bool
	timeout time.Duration
}

type command struct {
	name, args, help string
	run              func(ctx context.Context, c messagesconnect.AdminServiceClient, g globals, args []string, out io.Writer) error
}

var commands = []command{
	{"tree", "", "print the node's live supervision tree", runTree},
	{"kill", "ACTOR [REASON]", "kill an actor by name or id; its supervisor heals the tree", runKill},
}

// errUsage marks errors that are the caller's wrong usage (exit 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var g globals
	fs := flag.NewFlagSet("couchrepctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&g.node, "node", envOr("COUCHREP_NODE", "127.0.0.1:5987"), "admin `address` of the node (host:port or URL; env COUCHREP_NODE)")
	fs.StringVar(&g.token, "token", os.Getenv("COUCHREP_ADMIN_TOKEN"), "admin `secret` the node requires when its admin endpoint is not on loopback (env COUCHREP_ADMIN_TOKEN)")
	fs.BoolVar(&g.json, "json", false, "print replies as JSON, for scripts")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "give up on a request after this long")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: couchrepctl [flags] COMMAND [ARGS]\n\nCommands:\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, c := range commands {
			fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.help)
		}
		tw.Flush()
		fmt.Fprintf(w, "\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(w, "\nExit codes: 0 ok, 1 error, 2 usage.\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "help" {
		fs.Usage()
		return exitOK
	}
	for _, c := range commands {
		if c.name != name {
			continue
		}
		if len(rest) == 1 && (rest[0] == "--help" || rest[0] == "-h") {
			fmt.Fprintf(stdout, "Usage: couchrepctl [flags] %s %s\n\n%s\n", c.name, c.args, c.help)
			return exitOK
		}
		ctx, cancel := context.WithTimeout(ctx, g.timeout)
		defer cancel()
		client := messagesconnect.NewAdminServiceClient(http.DefaultClient, baseURL(g.node),
			connect.WithInterceptors(headers(g.token)))
		err := c.run(ctx, client, g, rest, stdout)
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "couchrepctl %s: %v\nUsage: couchrepctl [flags] %s %s\n", name, err, c.name, c.args)
			return exitUsage
		default:
			fmt.Fprintf(stderr, "couchrepctl %s: %v\n", name, describe(err, g.node))
			return exitError
		}
	}
	fmt.Fprintf(stderr, "couchrepctl: unknown command %q (see couchrepctl --help)\n", name)
	return exitUsage
}

// headers adds the protocol version and, if set, the token to every request.
func headers(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set(admin.VersionHeader, admin.Version)
			if token != "" {
				req.Header().Set("Authorization", "Bearer "+token)
			}
			return next(ctx, req)
		}
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func baseURL(node string) string {
	if strings.HasPrefix(node, "http://") || strings.HasPrefix(node, "https://") {
		return strings.TrimSuffix(node, "/")
	}
	return "http://" + node
}

// describe turns a transport error into a sentence an operator can act on.
func describe(err error, node string) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		if ce.Code() == connect.CodeUnavailable {
			return fmt.Sprintf("node %s is not reachable: %s", node, ce.Message())
		}
		return fmt.Sprintf("%s: %s", ce.Code(), ce.Message())
	}
	return err.Error()
}

func printJSON(out io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

func runTree(ctx context.Context, c messagesconnect.AdminServiceClient, g globals, args []string, out io.Writer) error {
	if len(args) != 0 {
		return fmt.Errorf("%w: tree takes no arguments", errUsage)
	}
	resp, err := c.Tree(ctx, connect.NewRequest(&messages.TreeRequest{}))
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(out, resp.Msg)
	}
	fmt.Fprintf(out, "node %s\n", resp.Msg.GetNode())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ACTOR\tKIND\tSTATE\tRESTARTS\tINCARNATION\tUP\tPID")
	printTree(tw, resp.Msg.GetRoot(), "", "", time.Now())
	return tw.Flush()
}

func printTree(w io.Writer, n *messages.TreeNode, prefix, childPrefix string, now time.Time) {
	kind := "worker"
	if n.GetSupervisor() {
		kind = strings.ToLower(strings.TrimPrefix(n.GetStrategy().String(), "STRATEGY_"))
	}
	state := strings.ToLower(strings.TrimPrefix(n.GetState().String(), "CHILD_STATE_"))
	up := "-"
	if n.GetStartedAt() != nil {
		up = now.Sub(n.GetStartedAt().AsTime()).Round(time.Second).String()
	}
	fmt.Fprintf(w, "%s%s\t%s\t%s\t%d\t%d\t%s\t%s\n", prefix, n.GetName(), kind, state, n.GetRestartCount(), n.GetIncarnation(), up, n.GetPid())
	for i, c := range n.GetChildren() {
		if i == len(n.GetChildren())-1 {
			printTree(w, c, childPrefix+"└─ ", childPrefix+"   ", now)
		} else {
			printTree(w, c, childPrefix+"├─ ", childPrefix+"│  ", now)
		}
	}
}

func runKill(ctx context.Context, c messagesconnect.AdminServiceClient, g globals, args []string, out io.Writer) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("%w: kill takes an actor name and an optional reason", errUsage)
	}
	req := &messages.KillRequest{Actor: args[0]}
	if len(args) == 2 {
		req.Reason = args[1]
	}
	resp, err := c.Kill(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(out, resp.Msg)
	}
	fmt.Fprintf(out, "killed %s (incarnation %d)\n", resp.Msg.GetPid(), resp.Msg.GetIncarnation())
	return nil
}
