package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/replicate"
)

// runReplicate implements `couchrepd replicate [flags] SOURCE_URL TARGET_URL`:
// one replication in the foreground. The result (CouchDB's POST /_replicate
// body) goes to stdout; on a terminal, stderr shows a progress line (docs
// read/written, changes pending, docs/s, ETA) redrawn at most 4 times a
// second, unless --quiet. Exit codes: 0 success, 1 failure, 2 usage error.
func runReplicate(ctx context.Context, args []string, stdout, stderr io.Writer, logger zerolog.Logger) int {
	fs := flag.NewFlagSet("replicate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: couchrepd replicate [flags] SOURCE_URL TARGET_URL\n       couchrepd replicate [flags] --doc FILE")
		fs.PrintDefaults()
	}
	var (
		uuid       = fs.String("uuid", "", "server UUID used in the replication id ([couchdb] uuid)")
		adoptFrom  = fs.String("adopt-uuid", "", "use the uuid of the CouchDB server at `URL` (GET /) as --uuid: resume from that server's checkpoints")
		continuous = fs.Bool("continuous", false, "follow the source until interrupted")
		quiet      = fs.Bool("quiet", false, "no progress line (there is one only when stderr is a terminal)")
		configPath = fs.String("config", "", "ini `FILE` whose [replicator] TLS, session, socket and retry settings apply (COUCHREP_REPLICATOR_* variables too)")
	)
	df := replicate.RegisterDocFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	body, code := df.Document(fs, stderr, "couchrepd replicate", map[string]any{"continuous": *continuous})
	if code != 0 {
		return code
	}
	p, err := replicate.ParseParams(body)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
		return 2
	}

	cfg, err := loadReplicatorConfig(*configPath)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
		return 2
	}
	if *adoptFrom != "" {
		if *uuid != "" {
			fmt.Fprintln(stderr, "couchrepd replicate: --uuid and --adopt-uuid are mutually exclusive")
			return 2
		}
		u, err := serverUUID(ctx, *adoptFrom, cfg.Replicator, logger)
		if err != nil {
			fmt.Fprintf(stderr, "couchrepd replicate: --adopt-uuid: %v\n", err)
			return 1
		}
		*uuid = u
	}
	progress := newProgressLine(stderr, *quiet)
	opts := replicate.Options{ServerUUID: *uuid, Logger: logger, Endpoints: replicate.EndpointConfigFrom(cfg.Replicator)}
	if progress != nil {
		opts.OnProgress, opts.ProgressInterval = progress.report, progressEvery
	}
	rep := replicate.New(p, opts)
	res, err := rep.Run(ctx)
	progress.finish()
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd replicate: replication %s failed: %v\n", rep.ID(), err)
		return 1
	}
	out := res.Body
	if p.Continuous {
		out, _ = json.Marshal(map[string]any{"ok": true, "_local_id": res.ID})
	}
	fmt.Fprintf(stdout, "%s\n", out)
	return 0
}

// loadReplicatorConfig reads the ini file at path (none: the defaults) with the
// COUCHREP_* variables over it, and validates it.
func loadReplicatorConfig(path string) (config.Config, error) {
	cfg := config.Default()
	if path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return cfg, err
		}
	}
	if err := cfg.ApplyEnv(os.Environ()); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}
