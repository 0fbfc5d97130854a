package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

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
		docFile      = fs.String("doc", "", "read the whole replication document (JSON) from `FILE` (- for stdin)")
		uuid         = fs.String("uuid", "", "server UUID used in the replication id ([couchdb] uuid)")
		adoptFrom    = fs.String("adopt-uuid", "", "use the uuid of the CouchDB server at `URL` (GET /) as --uuid: resume from that server's checkpoints")
		continuous   = fs.Bool("continuous", false, "follow the source until interrupted")
		createTarget = fs.Bool("create-target", false, "create the target database")
		ctParams     = fs.String("create-target-params", "", "JSON object of parameters for creating the target (e.g. {\"q\":1})")
		docIDs       = fs.String("doc-ids", "", "only these documents: a JSON array or a comma-separated list")
		selector     = fs.String("selector", "", "Mango selector (JSON object)")
		filter       = fs.String("filter", "", "named filter ddoc/name (or _view, _design)")
		queryParams  = fs.String("query-params", "", "JSON object passed to the filter")
		sinceSeq     = fs.String("since-seq", "", "start sequence when there is no checkpoint (JSON, or a bare string)")
		workers      = fs.Int("worker-processes", replicate.DefaultWorkerProcesses, "worker_processes")
		batchSize    = fs.Int("worker-batch-size", replicate.DefaultWorkerBatchSize, "worker_batch_size")
		conns        = fs.Int("http-connections", replicate.DefaultHTTPConnections, "http_connections")
		connTimeout  = fs.Int("connection-timeout", int(replicate.DefaultConnectionTimeout/time.Millisecond), "connection_timeout in ms")
		retries      = fs.Int("retries-per-request", replicate.DefaultRetriesPerRequest, "retries_per_request")
		ckptInterval = fs.Int("checkpoint-interval", int(replicate.DefaultCheckpointInterval/time.Millisecond), "checkpoint_interval in ms")
		useCkpt      = fs.Bool("use-checkpoints", true, "record and use checkpoints")
		useBulkGet   = fs.Bool("use-bulk-get", true, "fetch documents with _bulk_get")
		winning      = fs.Bool("winning-revs-only", false, "replicate only winning revisions")
		quiet        = fs.Bool("quiet", false, "no progress line (there is one only when stderr is a terminal)")
		proxy        = fs.String("proxy", "", "proxy `URL` for both endpoints: http://, https:// or socks5://, optional user:password@")
		sourceProxy  = fs.String("source-proxy", "", "proxy `URL` for the source only")
		targetProxy  = fs.String("target-proxy", "", "proxy `URL` for the target only")
		configPath   = fs.String("config", "", "ini `FILE` whose [replicator] TLS, session, socket and retry settings apply (COUCHREP_REPLICATOR_* variables too)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	doc := map[string]json.RawMessage{}
	if *docFile != "" {
		var b []byte
		var err error
		if *docFile == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(*docFile)
		}
		if err != nil {
			fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
			return 2
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			fmt.Fprintf(stderr, "couchrepd replicate: %s: not a JSON object: %v\n", *docFile, err)
			return 2
		}
	}
	switch n := fs.NArg(); {
	case n == 2:
		doc["source"], _ = json.Marshal(fs.Arg(0))
		doc["target"], _ = json.Marshal(fs.Arg(1))
	case n == 0 && *docFile != "":
	default:
		fs.Usage()
		return 2
	}
	jsonFlag := func(flagName, field, value string) error {
		if !set[flagName] {
			return nil
		}
		if !json.Valid([]byte(value)) {
			return fmt.Errorf("--%s: not valid JSON: %s", flagName, value)
		}
		doc[field] = json.RawMessage(value)
		return nil
	}
	put := func(flagName, field string, v any) {
		if set[flagName] {
			doc[field], _ = json.Marshal(v)
		}
	}
	put("continuous", "continuous", *continuous)
	put("create-target", "create_target", *createTarget)
	put("filter", "filter", *filter)
	put("worker-processes", "worker_processes", *workers)
	put("worker-batch-size", "worker_batch_size", *batchSize)
	put("http-connections", "http_connections", *conns)
	put("connection-timeout", "connection_timeout", *connTimeout)
	put("retries-per-request", "retries_per_request", *retries)
	put("checkpoint-interval", "checkpoint_interval", *ckptInterval)
	put("use-checkpoints", "use_checkpoints", *useCkpt)
	put("use-bulk-get", "use_bulk_get", *useBulkGet)
	put("winning-revs-only", "winning_revs_only", *winning)
	put("proxy", "proxy", *proxy)
	put("source-proxy", "source_proxy", *sourceProxy)
	put("target-proxy", "target_proxy", *targetProxy)
	for _, j := range [][3]string{
		{"create-target-params", "create_target_params", *ctParams},
		{"selector", "selector", *selector},
		{"query-params", "query_params", *queryParams},
	} {
		if err := jsonFlag(j[0], j[1], j[2]); err != nil {
			fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
			return 2
		}
	}
	if set["since-seq"] {
		if json.Valid([]byte(*sinceSeq)) {
			doc["since_seq"] = json.RawMessage(*sinceSeq)
		} else {
			doc["since_seq"], _ = json.Marshal(*sinceSeq)
		}
	}
	if set["doc-ids"] {
		var ids []string
		if err := json.Unmarshal([]byte(*docIDs), &ids); err != nil {
			ids = nil
			for _, id := range strings.Split(*docIDs, ",") {
				if id = strings.TrimSpace(id); id != "" {
					ids = append(ids, id)
				}
			}
		}
		doc["doc_ids"], _ = json.Marshal(ids)
	}
	body, _ := json.Marshal(doc)
	p, err := replicate.ParseParams(body)
	if err != nil {
		fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
		return 2
	}

	cfg := config.Default()
	if *configPath != "" {
		if cfg, err = config.Load(*configPath); err != nil {
			fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
			return 2
		}
	}
	if err := cfg.ApplyEnv(os.Environ()); err != nil {
		fmt.Fprintf(stderr, "couchrepd replicate: %v\n", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
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
