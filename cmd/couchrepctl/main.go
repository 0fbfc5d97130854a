// Command couchrepctl drives a running couchrep node through its admin
// endpoint: every subcommand sends one protobuf actor message and prints the
// actor's reply, as an aligned table (or text) by default and as JSON with
// --json.
//
//	couchrepctl [--node ADDR] [--token T] [--json] [--timeout D] COMMAND [ARGS]
//
// Commands: tree, jobs, job show|stop|restart|cancel|verify, replicate, verify, kill,
// shares get|set, config set, drain, undrain, stop, nodes, takeover, send. Every
// command takes --help. Exit codes: 0 ok, 1 error (the node said no or could
// not be reached), 2 usage, 3 verify found differences.
//
// Files: main.go holds the command table, argument parsing and usage;
// request.go the one request helper every command sends through (ask,
// request: --timeout, --json or the command's text printer); one file per
// command group: jobs.go (jobs, job, replicate), nodes.go (drain, undrain,
// stop, nodes), takeover.go (takeover), config.go (shares, config),
// actors.go (tree, kill, send), completion.go (shell completion generated
// from the command table).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/couchrep/couchrep/internal/admin"
	"github.com/couchrep/couchrep/internal/buildinfo"
	clog "github.com/couchrep/couchrep/internal/log"
	"github.com/couchrep/couchrep/messages/messagesconnect"
)

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	// exitDifferences: verify found differences.
	exitDifferences = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type globals struct {
	node    string
	token   string
	json    bool
	timeout time.Duration
	version bool
}

// register adds the global flags to fs; every subcommand accepts them too,
// so they may come before or after the command.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.node, "node", g.node, "admin `address` of the node (host:port or URL; env COUCHREP_NODE)")
	fs.StringVar(&g.token, "token", g.token, "admin `secret` the node requires when its admin endpoint is not on loopback (env COUCHREP_ADMIN_TOKEN)")
	fs.BoolVar(&g.json, "json", g.json, "print replies as JSON, for scripts")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "give up on a request after this long")
	fs.BoolVar(&g.version, "version", g.version, "print the version (module version, VCS revision, Go version) and exit")
}

// env is what a command runs with.
type env struct {
	g      *globals
	client messagesconnect.AdminServiceClient
	out    io.Writer
	// terminal is true when out is a terminal (jobs --watch redraws).
	terminal bool
}

type runFunc func(ctx context.Context, e *env, args []string) error

type command struct {
	name, args, help string
	// setup registers the command's own flags and returns its runner.
	setup func(fs *flag.FlagSet) runFunc
}

func simple(r runFunc) func(*flag.FlagSet) runFunc { return func(*flag.FlagSet) runFunc { return r } }

var commands = []command{
	{"tree", "", "print the node's live supervision tree", simple(runTree)},
	{"jobs", "", "list replication jobs (filters: --state, --db, --node-name, --limit; --watch for live progress)", setupJobs},
	{"job show", "ID", "show one job (its id as jobs shows it, replication id, actor name, or a unique prefix of either id) with its stats and history", simple(runJobShow)},
	{"job stop", "ID", "stop a job running on this node: it checkpoints and goes back to the queue", simple(runJobStop)},
	{"job restart", "ID", "run a job again now (a crashing job's backoff is skipped; a running one is stopped and requeued)", simple(runJobRestart)},
	{"job cancel", "ID", "cancel a transient job (it is removed); a _replicator document's job is refused, as in CouchDB: delete or change its document", simple(runJobCancel)},
	{"job pause", "ID", "pause a job on whichever node runs it (it checkpoints and stays pending, never started, across restarts and takeovers) until `job resume`", simple(runJobPause)},
	{"job resume", "ID", "run a paused job again (it is due now)", simple(runJobResume)},
	{"job reset", "ID", "start a job again from sequence 0 (its checkpoint documents are kept; asks for confirmation, --yes to skip)", setupJobReset},
	{"job verify", "ID", "verify a job's copy: the node checks that its target holds every leaf revision and attachment the job's replication (its filter) carries; JSON lines, the summary last; exit 3 on a difference", setupJobVerify},
	{"replicate", "SOURCE TARGET", "add a transient replication job, as POST /_replicate does", setupReplicate},
	{"verify", "SOURCE TARGET", "the node checks that TARGET holds every leaf revision (conflicts, deletions) and attachment a replication from SOURCE (same flags: --filter, --selector, --doc-ids, --since-seq, proxies) carries; JSON lines, the summary last; exit 3 on a difference", setupVerify},
	{"kill", "ACTOR [REASON]", "kill an actor by name, path or id; its supervisor heals the tree", simple(runKill)},
	{"shares get", "", "print [replicator.shares] in force", simple(runSharesGet)},
	{"shares set", "KEY=SHARES...", "change [replicator.shares] at run time (1..1000; 0 resets a key to the default)", simple(runSharesSet)},
	{"config set", "max_jobs=N|max_churn=N...", "change max_jobs / max_churn at run time", simple(runConfigSet)},
	{"drain", "", "stop accepting jobs and hand this node's running jobs back to the queue (checkpointed)", simple(runDrain)},
	{"undrain", "", "accept jobs again after a drain", simple(runUndrain)},
	{"stop", "", "stop the node cleanly, as SIGTERM does", simple(runStop)},
	{"nodes", "", "list the nodes of the cluster: types, heartbeat, running jobs", simple(runNodes)},
	{"takeover", "URL", "check every precondition of taking over the server's _replicator documents from its own replicator (uuid, [replicator] max_jobs, _active_tasks, _scheduler/docs, other couchrep stores) and print the next step of each one not met; exit 1 unless all are", simple(runTakeover)},
	{"send", "ACTOR TYPE [JSON]", "send any actor message (TYPE e.g. couchrep.v1.SchedulerStatusRequest, JSON its body) to ACTOR (\"\": whichever actor handles it) and print the reply", simple(runSend)},
}

// errUsage marks errors that are the caller's wrong usage (exit 2).
var errUsage = errors.New("usage")

func usagef(format string, a ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, a...))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{node: envOr("COUCHREP_NODE", "127.0.0.1:5987"), token: os.Getenv("COUCHREP_ADMIN_TOKEN"), timeout: 30 * time.Second}
	fs := flag.NewFlagSet("couchrepctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	g.register(fs)
	fs.Usage = func() {} // help goes to stdout, errors get a one-line hint
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stdout, fs, "")
			return exitOK
		}
		fmt.Fprintf(stderr, "see couchrepctl --help\n")
		return exitUsage
	}
	rest := fs.Args()
	if g.version {
		fmt.Fprintf(stdout, "couchrepctl %s\n", buildinfo.Read())
		return exitOK
	}
	if len(rest) == 0 {
		usage(stderr, fs, "")
		return exitUsage
	}
	if rest[0] == "completion" {
		if len(rest) != 2 || rest[1] == "--help" || rest[1] == "-h" {
			fmt.Fprintf(stderr, "Usage: couchrepctl completion bash|zsh|fish\n\n%s.\n", completionHelp)
			return exitUsage
		}
		if err := writeCompletion(stdout, rest[1]); err != nil {
			fmt.Fprintf(stderr, "couchrepctl completion: %v\n", err)
			return exitUsage
		}
		return exitOK
	}
	if rest[0] == "help" {
		usage(stdout, fs, strings.Join(rest[1:], " "))
		return exitOK
	}
	cmd, cargs := lookup(rest)
	if cmd == nil {
		if group := groupOf(rest[0]); group != "" {
			if len(rest) > 1 && (rest[1] == "--help" || rest[1] == "-h" || rest[1] == "-help") {
				usage(stdout, fs, group)
				return exitOK
			}
			what := "a subcommand"
			if len(rest) > 1 {
				what = fmt.Sprintf("a known subcommand, not %q", rest[1])
			}
			fmt.Fprintf(stderr, "couchrepctl %s: needs %s\n", group, what)
			usage(stderr, fs, group)
			return exitUsage
		}
		fmt.Fprintf(stderr, "couchrepctl: unknown command %q (see couchrepctl --help)\n", rest[0])
		return exitUsage
	}
	cfs := flag.NewFlagSet("couchrepctl "+cmd.name, flag.ContinueOnError)
	cfs.SetOutput(stderr)
	g.register(cfs)
	runner := cmd.setup(cfs)
	cfs.Usage = func() {}
	if err := cfs.Parse(interleave(cfs, cargs)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			commandUsage(stdout, cmd, cfs)
			return exitOK
		}
		fmt.Fprintf(stderr, "Usage: couchrepctl [flags] %s %s (see --help)\n", cmd.name, cmd.args)
		return exitUsage
	}
	if g.version {
		fmt.Fprintf(stdout, "couchrepctl %s\n", buildinfo.Read())
		return exitOK
	}
	e := &env{g: g, out: stdout, terminal: clog.IsTerminal(stdout),
		client: messagesconnect.NewAdminServiceClient(http.DefaultClient, baseURL(g.node), connect.WithInterceptors(headers(g.token)))}
	err := noArgs(cmd, cfs.Args())
	if err == nil {
		err = runner(ctx, e, cfs.Args())
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errDifferences):
		return exitDifferences
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "couchrepctl %s: %v\nUsage: couchrepctl [flags] %s %s\n", cmd.name, err, cmd.name, cmd.args)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "couchrepctl %s: %s\n", cmd.name, describe(err, g.node))
		return exitError
	}
}

// lookup finds the command named by the first one or two words of args.
func lookup(args []string) (*command, []string) {
	if len(args) >= 2 {
		for i := range commands {
			if commands[i].name == args[0]+" "+args[1] {
				return &commands[i], args[2:]
			}
		}
	}
	for i := range commands {
		if commands[i].name == args[0] {
			return &commands[i], args[1:]
		}
	}
	return nil, nil
}

// groupOf returns word if it is the first word of two-word commands.
func groupOf(word string) string {
	for _, c := range commands {
		if strings.HasPrefix(c.name, word+" ") {
			return word
		}
	}
	return ""
}

// interleave moves flags after positional arguments to the front, so that
// "job show ID --json" works like "job show --json ID". A lone "--" ends
// flags.
func interleave(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(flags, pos...)
}

func usage(w io.Writer, fs *flag.FlagSet, group string) {
	fmt.Fprintf(w, "Usage: couchrepctl [flags] COMMAND [ARGS]\n\ncouchrepctl drives a running couchrep node through its admin endpoint.\n\nCommands:\n")
	tw := newTable(w)
	for _, c := range commands {
		if group == "" || strings.HasPrefix(c.name, group+" ") || c.name == group {
			fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.help)
		}
	}
	if group == "" {
		fmt.Fprintf(tw, "  completion bash|zsh|fish\t%s\n", completionHelp)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nFlags (also accepted after the command):\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\nRun 'couchrepctl COMMAND --help' for a command's own flags.\nExit codes: 0 ok, 1 error, 2 usage.\n")
}

func commandUsage(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: couchrepctl [flags] %s %s\n\n%s.\n\nFlags:\n", c.name, c.args, c.help)
	fs.SetOutput(w)
	fs.PrintDefaults()
	fmt.Fprintf(w, "\nExit codes: 0 ok, 1 error, 2 usage.\n")
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
