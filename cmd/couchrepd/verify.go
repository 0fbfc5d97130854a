package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/verify"
)

// Exit codes of verify.
const (
	verifyClean       = 0
	verifyFailed      = 1
	verifyUsage       = 2
	verifyDifferences = 3
)

// runVerify implements `couchrepd verify [flags] SOURCE_URL TARGET_URL`:
// checks that the target holds everything the replication (with the same
// document flags: filter, selector, doc ids, since_seq, proxies) would
// carry, without a node. Each difference is a JSON line on stdout, then
// {"summary": ...}. Exit codes (couchrepctl verify's): 0 no difference, 1
// the verify could not be done (the reason on stderr and as a
// CouchDB-style JSON error line on stdout), 2 usage error, 3 differences.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer, logger zerolog.Logger) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: couchrepd verify [flags] SOURCE_URL TARGET_URL\n       couchrepd verify [flags] --doc FILE")
		fs.PrintDefaults()
	}
	var (
		extra      = fs.Bool("extra", false, "also report documents and revisions only the target has (reads the target's changes too)")
		repair     = fs.Bool("repair", false, "replicate the missing revisions found, then verify again")
		configPath = fs.String("config", "", "ini `FILE` whose [replicator] TLS, session, socket and retry settings apply (COUCHREP_REPLICATOR_* variables too)")
	)
	df := replicate.RegisterDocFlags(fs, false)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return verifyUsage
	}
	body, code := df.Document(fs, stderr, "couchrepd verify", nil)
	if code != 0 {
		return code
	}
	cfg, err := loadReplicatorConfig(*configPath)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd verify: %v\n", err)
		return verifyUsage
	}
	p, err := replicate.ParseParamsWith(body, replicate.JobDefaults(cfg.Replicator))
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd verify: %v\n", redact.Text(err.Error()))
		return verifyUsage
	}
	out := redact.Writer(stdout)
	o := verify.Options{Extra: *extra, Repair: *repair, OnDifference: verify.Lines(out),
		Replicate: replicate.Options{Logger: logger, Endpoints: replicate.EndpointConfigFrom(cfg.Replicator)}}
	sum, err := verify.Run(ctx, p, o)
	if err != nil {
		status, _, reason := verify.Error(err)
		fmt.Fprintf(out, "%s\n", verify.ErrorLine(err))
		fmt.Fprintf(stderr, "couchrepd verify: %s\n", reason)
		if status == 400 {
			return verifyUsage
		}
		return verifyFailed
	}
	fmt.Fprintf(out, "%s\n", verify.SummaryLine(sum))
	if !sum.OK {
		return verifyDifferences
	}
	return verifyClean
}
