package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
)

// serverUUID asks the CouchDB server at rawURL (its root; a database URL
// also works) for its uuid: GET / answers {"couchdb":"Welcome","uuid":...}
// on CouchDB 2 and later (and PouchDB Server). The request is made as a
// replication job's would be under rc's [replicator] settings (TLS
// verification, CA file, client certificate, auth plugins), so a server
// behind TLS with a private CA can be adopted.
func serverUUID(ctx context.Context, rawURL string, rc config.Replicator, logger zerolog.Logger) (string, error) {
	ep, err := couch.ParseEndpoint(rawURL)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db, release, err := replicate.EndpointConfigFrom(rc).ServerDB(ep, 2, logger)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", ep.Redacted(), err)
	}
	defer release()
	raw, err := db.GetDoc(ctx, "", nil)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", ep.Redacted(), err)
	}
	var root struct {
		UUID string `json:"uuid"`
	}
	if err := json.Unmarshal(raw, &root); err != nil || root.UUID == "" {
		return "", fmt.Errorf("GET %s: the answer has no \"uuid\" (is it a CouchDB server's root URL?)", ep.Redacted())
	}
	return root.UUID, nil
}

// adoptUUID makes cfg use the uuid of the server at from (a URL), or from
// itself (a bare uuid), and records it in the data directory (later starts
// without the flag keep it); the node records it in the job store at start
// (config.CouchDB.Adopted), replacing the one recorded there: an explicit
// uuid change, which the node reports with the jobs it restarts from zero.
func adoptUUID(ctx context.Context, cfg *config.Config, from string, logger zerolog.Logger) error {
	uuid := from
	// host:port, a path or a dotted name is a server meant as a URL (the
	// parse error says what is missing), never a uuid.
	if strings.ContainsAny(from, ":/.") {
		var err error
		if uuid, err = serverUUID(ctx, from, cfg.Replicator, logger); err != nil {
			return err
		}
	}
	if cfg.CouchDB.UUID != "" && cfg.CouchDB.UUID != uuid {
		return fmt.Errorf("[couchdb] uuid is configured as %q but the server's is %q: remove one of them", cfg.CouchDB.UUID, uuid)
	}
	if err := config.AdoptUUID(cfg.Couchrep.DataDir, uuid); err != nil {
		return err
	}
	cfg.CouchDB.UUID, cfg.CouchDB.Adopted = uuid, true
	logger.Info().Str("uuid", uuid).Msg("adopted the server uuid: replication ids are the CouchDB server's, so jobs resume from its checkpoints")
	return nil
}

// printUUIDChange tells the operator, in plain words on stderr, which jobs
// an adopted uuid restarts from zero (the node logs the same at warn level).
func printUUIDChange(w io.Writer, c couchrep.UUIDChange) {
	fmt.Fprintf(w, "couchrepd: server uuid changed from %s to %s (--adopt-uuid): replication ids are computed from it, so %d unfinished job(s) restart from zero unless a checkpoint exists under the new uuid (CouchDB's own, for replications CouchDB ran)", c.From, c.To, len(c.Jobs))
	if c.Err != nil {
		fmt.Fprintf(w, "; listing them failed: %v", c.Err)
	}
	if len(c.Jobs) > 0 {
		fmt.Fprintf(w, ":\n  %s", strings.Join(c.Jobs, "\n  "))
	}
	fmt.Fprintln(w)
}
