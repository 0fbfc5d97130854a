package couchrep

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/repjob"
)

// owner is this process as the claimant of the node's name (the
// clustering actor heartbeats as the same owner).
func owner(cfg Config) cluster.Owner { return cluster.OwnerOf(cfg.Couchrep.DataDir) }

// heartbeatInterval is the interval the clustering actor keeps.
func heartbeatInterval(cfg Config) time.Duration {
	if iv := cfg.Couchrep.HeartbeatInterval; iv > 0 {
		return iv
	}
	return 5 * time.Second
}

// uuidRequest is what the node asks the store for its server uuid: a
// configured uuid is checked against the one in the data directory too.
func uuidRequest(cfg Config) cluster.UUIDRequest {
	req := cluster.UUIDRequest{UUID: cfg.CouchDB.UUID, Generated: cfg.CouchDB.Generated, Adopted: cfg.CouchDB.Adopted}
	if !req.Generated && !req.Adopted && cfg.Couchrep.DataDir != "" {
		if b, err := os.ReadFile(filepath.Join(cfg.Couchrep.DataDir, config.UUIDFile)); err == nil {
			req.DataDir = strings.TrimSpace(string(b))
		}
	}
	return req
}

// UUIDChange is a server uuid change this node's start made on purpose
// (an adopted uuid, couchrepd --adopt-uuid): replication ids are computed
// from the uuid, so the unfinished jobs get new ones and start from zero,
// unless a checkpoint exists under the new uuid (CouchDB's, for the
// replications CouchDB ran, when the uuid is its server's).
type UUIDChange struct {
	// From is the uuid the store recorded; To the one now in force.
	From, To string
	// Jobs are the ids of the store's unfinished jobs (pending, running,
	// crashing), sorted as the store lists them.
	Jobs []string
	// Err is set when the jobs could not be listed.
	Err error
}

// UUIDChange reports the server uuid change this node's start made, if it
// made one.
func (n *Node) UUIDChange() (UUIDChange, bool) {
	if n.uuidChange == nil {
		return UUIDChange{}, false
	}
	return *n.uuidChange, true
}

// maxLoggedJobIDs bounds the job ids one log line lists.
const maxLoggedJobIDs = 1000

// reportUUIDChange lists the jobs a uuid change restarts from zero and
// logs them at warn level.
func (n *Node) reportUUIDChange(ctx context.Context, from string) *UUIDChange {
	c := &UUIDChange{From: from, To: n.cfg.CouchDB.UUID}
	c.Err = n.deps.RepJobs.Each(ctx, repjob.Filter{}, func(r *repjob.Record) error {
		if !r.State().Terminal() {
			c.Jobs = append(c.Jobs, r.GetJobId())
		}
		return nil
	})
	ids := c.Jobs
	if len(ids) > maxLoggedJobIDs {
		ids = ids[:maxLoggedJobIDs]
	}
	n.log.Warn().Err(c.Err).Str("old_uuid", c.From).Str("new_uuid", c.To).Int("jobs", len(c.Jobs)).Strs("job_ids", ids).
		Msg("server uuid replaced: replication ids are computed from it, so these jobs restart from zero unless a checkpoint exists under the new uuid")
	return c
}
