package replicate

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// DocFlags are the command-line flags that make a replication document: the endpoints
// (arguments or --doc), filters and per-job options. replicate and verify
// share them; replicate.ParseParams checks what they make.
type DocFlags struct {
	docFile, ctParams, docIDs, selector, filter, queryParams, sinceSeq *string
	proxy, sourceProxy, targetProxy                                    *string
	createTarget, useCkpt, useBulkGet, winning                         *bool
	workers, batchSize, conns, connTimeout, retries, ckptInterval      *int
	replicating                                                        bool
}

// RegisterDocFlags defines the document's flags on fs; replicating adds
// those that only a replication uses (create_target, checkpoints, workers).
func RegisterDocFlags(fs *flag.FlagSet, replicating bool) *DocFlags {
	d := &DocFlags{replicating: replicating}
	d.docFile = fs.String("doc", "", "read the whole replication document (JSON) from `FILE` (- for stdin)")
	d.docIDs = fs.String("doc-ids", "", "only these documents: a JSON array or a comma-separated list")
	d.selector = fs.String("selector", "", "Mango selector (JSON object)")
	d.filter = fs.String("filter", "", "named filter ddoc/name (or _view, _design)")
	d.queryParams = fs.String("query-params", "", "JSON object passed to the filter")
	d.sinceSeq = fs.String("since-seq", "", "start sequence when there is no checkpoint (JSON, or a bare string)")
	d.winning = fs.Bool("winning-revs-only", false, "replicate only winning revisions")
	d.conns = fs.Int("http-connections", DefaultHTTPConnections, "http_connections")
	d.connTimeout = fs.Int("connection-timeout", int(DefaultConnectionTimeout/time.Millisecond), "connection_timeout in ms")
	d.retries = fs.Int("retries-per-request", DefaultRetriesPerRequest, "retries_per_request")
	d.proxy = fs.String("proxy", "", "proxy `URL` for both endpoints: http://, https:// or socks5://, optional user:password@")
	d.sourceProxy = fs.String("source-proxy", "", "proxy `URL` for the source only")
	d.targetProxy = fs.String("target-proxy", "", "proxy `URL` for the target only")
	if replicating {
		d.createTarget = fs.Bool("create-target", false, "create the target database")
		d.ctParams = fs.String("create-target-params", "", "JSON object of parameters for creating the target (e.g. {\"q\":1})")
		d.workers = fs.Int("worker-processes", DefaultWorkerProcesses, "worker_processes")
		d.batchSize = fs.Int("worker-batch-size", DefaultWorkerBatchSize, "worker_batch_size")
		d.ckptInterval = fs.Int("checkpoint-interval", int(DefaultCheckpointInterval/time.Millisecond), "checkpoint_interval in ms")
		d.useCkpt = fs.Bool("use-checkpoints", true, "record and use checkpoints")
		d.useBulkGet = fs.Bool("use-bulk-get", true, "fetch documents with _bulk_get")
	}
	return d
}

// Document builds the replication document from fs's arguments and the
// flags set (extra: more fields from flags of the caller's, put when their
// flag was set); code is the exit code (2) of a usage error, printed under
// prog.
func (d *DocFlags) Document(fs *flag.FlagSet, stderr io.Writer, prog string, extra map[string]any) (body []byte, code int) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	doc := map[string]json.RawMessage{}
	if *d.docFile != "" {
		var b []byte
		var err error
		if *d.docFile == "-" {
			b, err = io.ReadAll(os.Stdin)
		} else {
			b, err = os.ReadFile(*d.docFile)
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", prog, err)
			return nil, 2
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			fmt.Fprintf(stderr, "%s: %s: not a JSON object: %v\n", prog, *d.docFile, err)
			return nil, 2
		}
	}
	switch n := fs.NArg(); {
	case n == 2:
		doc["source"], _ = json.Marshal(fs.Arg(0))
		doc["target"], _ = json.Marshal(fs.Arg(1))
	case n == 0 && *d.docFile != "":
	default:
		fs.Usage()
		return nil, 2
	}
	put := func(flagName, field string, v any) {
		if set[flagName] {
			doc[field], _ = json.Marshal(v)
		}
	}
	for name, v := range extra {
		put(strings.ReplaceAll(name, "_", "-"), name, v)
	}
	put("filter", "filter", *d.filter)
	put("http-connections", "http_connections", *d.conns)
	put("connection-timeout", "connection_timeout", *d.connTimeout)
	put("retries-per-request", "retries_per_request", *d.retries)
	put("winning-revs-only", "winning_revs_only", *d.winning)
	put("proxy", "proxy", *d.proxy)
	put("source-proxy", "source_proxy", *d.sourceProxy)
	put("target-proxy", "target_proxy", *d.targetProxy)
	jsons := [][3]string{{"selector", "selector", *d.selector}, {"query-params", "query_params", *d.queryParams}}
	if d.replicating {
		put("create-target", "create_target", *d.createTarget)
		put("worker-processes", "worker_processes", *d.workers)
		put("worker-batch-size", "worker_batch_size", *d.batchSize)
		put("checkpoint-interval", "checkpoint_interval", *d.ckptInterval)
		put("use-checkpoints", "use_checkpoints", *d.useCkpt)
		put("use-bulk-get", "use_bulk_get", *d.useBulkGet)
		jsons = append(jsons, [3]string{"create-target-params", "create_target_params", *d.ctParams})
	}
	for _, j := range jsons {
		if !set[j[0]] {
			continue
		}
		if !json.Valid([]byte(j[2])) {
			fmt.Fprintf(stderr, "%s: --%s: not valid JSON: %s\n", prog, j[0], j[2])
			return nil, 2
		}
		doc[j[1]] = json.RawMessage(j[2])
	}
	if set["since-seq"] {
		if json.Valid([]byte(*d.sinceSeq)) {
			doc["since_seq"] = json.RawMessage(*d.sinceSeq)
		} else {
			doc["since_seq"], _ = json.Marshal(*d.sinceSeq)
		}
	}
	if set["doc-ids"] {
		var ids []string
		if err := json.Unmarshal([]byte(*d.docIDs), &ids); err != nil {
			ids = nil
			for _, id := range strings.Split(*d.docIDs, ",") {
				if id = strings.TrimSpace(id); id != "" {
					ids = append(ids, id)
				}
			}
		}
		doc["doc_ids"], _ = json.Marshal(ids)
	}
	body, _ = json.Marshal(doc)
	return body, 0
}
