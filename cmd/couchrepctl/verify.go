package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"connectrpc.com/connect"

	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// errDifferences: the verify found differences (exit 3; its lines said
// which).
var errDifferences = errors.New("the target differs from the source")

// setupVerify is `couchrepctl verify SOURCE TARGET`: the node checks that
// the target holds what the replication (with the same document flags as
// `couchrepd replicate`) would carry.
func setupVerify(fs *flag.FlagSet) runFunc {
	df := replicate.RegisterDocFlags(fs, false)
	extra, repair := verifyFlags(fs)
	return func(ctx context.Context, e *env, args []string) error {
		body, code := df.Document(fs, os.Stderr, "couchrepctl verify", nil)
		if code != 0 {
			return usagef("verify takes a source URL and a target URL, or --doc FILE")
		}
		return runVerifyRPC(ctx, e, &messages.VerifyRequest{Document: string(body), Extra: *extra, Repair: *repair})
	}
}

// setupJobVerify is `couchrepctl job verify ID`: the job's endpoints with
// its filter.
func setupJobVerify(fs *flag.FlagSet) runFunc {
	extra, repair := verifyFlags(fs)
	return func(ctx context.Context, e *env, args []string) error {
		if len(args) != 1 {
			return usagef("job verify takes one job id")
		}
		return runVerifyRPC(ctx, e, &messages.VerifyRequest{Job: args[0], Extra: *extra, Repair: *repair})
	}
}

func verifyFlags(fs *flag.FlagSet) (extra, repair *bool) {
	return fs.Bool("extra", false, "also report documents and revisions only the target has (reads the target's changes too)"),
		fs.Bool("repair", false, "replicate the missing revisions found, then verify again")
}

// runVerifyRPC streams the node's verify: each line as it comes (JSON
// lines; the summary last). It is not bounded by --timeout.
func runVerifyRPC(ctx context.Context, e *env, req *messages.VerifyRequest) error {
	stream, err := e.client.Verify(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer stream.Close()
	ok := false
	for stream.Receive() {
		m := stream.Msg()
		fmt.Fprintln(e.out, m.GetLine())
		if m.GetSummary() {
			var s struct {
				Summary struct {
					OK bool `json:"ok"`
				} `json:"summary"`
			}
			_ = json.Unmarshal([]byte(m.GetLine()), &s)
			ok = s.Summary.OK
			if !ok {
				return errDifferences
			}
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if !ok {
		return io.ErrUnexpectedEOF
	}
	return nil
}
