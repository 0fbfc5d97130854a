// Command embed runs a couchrep node inside a Go program: the same
// supervision tree couchrepd runs, started with couchrep.Start. It
// replicates SOURCE to TARGET once, waits for the job's completion event on
// the node's event stream, prints it, and stops the node.
//
//	go run ./examples/embed http://127.0.0.1:5984/src http://127.0.0.1:5984/tgt
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/messages"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: embed SOURCE_URL TARGET_URL")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1], os.Args[2], os.Stdout, zerolog.New(os.Stderr).Level(zerolog.WarnLevel))
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// run starts a node in a temporary data directory, replicates source to
// target once, and stops the node.
func run(ctx context.Context, source, target string, out io.Writer, log zerolog.Logger) (err error) {
	dir, err := os.MkdirTemp("", "couchrep-embed-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	cfg := couchrep.DefaultConfig()
	cfg.Couchrep.DataDir = dir            // job store, server uuid
	cfg.Couchrep.HTTPBind = "127.0.0.1:0" // CouchDB's replicator API on a free port
	cfg.Replicator.StartupJitter = 0      // start jobs at once
	node, err := couchrep.Start(ctx, cfg, couchrep.WithLogger(log))
	if err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = errors.Join(err, node.Stop(stopCtx))
	}()

	// Subscribe before adding the job, so that no event is missed.
	subCtx, unsubscribe := context.WithCancel(ctx)
	defer unsubscribe()
	events, _ := node.Subscribe(subCtx, 1024)

	body, err := json.Marshal(map[string]any{"source": source, "target": target})
	if err != nil {
		return err
	}
	reply, err := node.Request(ctx, &messages.ReplicateRequest{Body: string(body)})
	if err != nil {
		return err
	}
	id := reply.(*messages.ReplicateResponse).GetId()
	fmt.Fprintf(out, "job %s added\n", id)

	for ev := range events {
		e, ok := ev.(*messages.ReplicationJobEvent)
		if !ok || e.GetJobId() != id || e.GetProgress() {
			continue
		}
		switch e.GetState() {
		case messages.ReplicationState_REPLICATION_STATE_RUNNING:
			fmt.Fprintf(out, "job running on node %s\n", e.GetNode())
		case messages.ReplicationState_REPLICATION_STATE_COMPLETED:
			fmt.Fprintf(out, "job completed: docs_read %d, docs_written %d, doc_write_failures %d\n",
				e.GetStats().GetDocsRead(), e.GetStats().GetDocsWritten(), e.GetStats().GetDocWriteFailures())
			return nil
		case messages.ReplicationState_REPLICATION_STATE_FAILED:
			return fmt.Errorf("job failed: %s", e.GetReason())
		case messages.ReplicationState_REPLICATION_STATE_CRASHING:
			fmt.Fprintf(out, "job crashed, will retry: %s\n", e.GetReason())
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return fmt.Errorf("node stopped before the job completed: %v", node.Err())
}
