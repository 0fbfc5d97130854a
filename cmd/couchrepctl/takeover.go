package main

// The takeover command: check every precondition of taking over a CouchDB
// server's _replicator documents (internal/takeover, run by the node).

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/messages"
)

// errTakeoverRefused: a precondition is not met (exit 1).
var errTakeoverRefused = errors.New("refused")

func runTakeover(ctx context.Context, e *env, args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usagef("takeover takes the server's URL (as in [couchrep] watch; its credentials are used when the URL has none)")
	}
	var r messages.TakeoverResponse
	if err := send(ctx, e, "", &messages.TakeoverRequest{Server: args[0]}, &r); err != nil {
		return err
	}
	if e.g.json {
		if err := printJSON(e.out, &r); err != nil {
			return err
		}
	} else {
		printTakeover(e.out, &r)
	}
	if !r.GetReady() {
		return fmt.Errorf("%w: %s is not ready to be taken over: do the next steps above, then run couchrepctl takeover again", errTakeoverRefused, redact.URL(args[0]))
	}
	return nil
}

// printTakeover prints each check (result, name, what was found) and the
// next step of each one not met, then the verdict.
func printTakeover(w io.Writer, r *messages.TakeoverResponse) {
	fmt.Fprintf(w, "takeover of %s, checked by node %s (job store %s):\n", r.GetServer(), r.GetNode(), r.GetStoreId())
	notMet := 0
	for _, c := range r.GetChecks() {
		fmt.Fprintf(w, "  %-7s %-12s %s\n", c.GetResult(), c.GetName(), c.GetFound())
		if c.GetResult() != "ok" {
			notMet++
			fmt.Fprintf(w, "  %-7s %-12s next: %s\n", "", "", c.GetNext())
		}
	}
	if r.GetReady() {
		fmt.Fprintf(w, "ready: every precondition is met; node %s runs the jobs of the _replicator documents of %s alone (couchrepctl jobs: STARTED_FROM couchdb_checkpoint@<seq> is a job resumed from the server's checkpoint)\n", r.GetNode(), r.GetServer())
		return
	}
	fmt.Fprintf(w, "refused: %d of %d preconditions not met\n", notMet, len(r.GetChecks()))
}
