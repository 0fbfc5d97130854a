package repjob

import (
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

// PolicyFromConfig is the scheduling policy of a [replicator] section.
func PolicyFromConfig(r config.Replicator) schedpolicy.Policy {
	return schedpolicy.Policy{
		MaxJobs: r.MaxJobs, MaxChurn: r.MaxChurn, Interval: r.Interval,
		MinBackoff: r.MinBackoff, MaxBackoff: r.MaxBackoff, HealthThreshold: r.HealthThreshold,
		MaxHistory: r.MaxHistory, StartupJitter: r.StartupJitter, MinRunTime: r.MinRunTime,
	}
}

// NewFromConfig returns the store of a node configured by cfg: its server
// UUID, scheduling policy, shares and transient job max age. Every part of a
// node should share the one store the node builds (actors.Deps.RepJobs), so
// that run-time share and policy changes reach all of them.
func NewFromConfig(queue *jobqueue.Queue, db kv.Database, cfg config.Config, log zerolog.Logger) *Store {
	p := PolicyFromConfig(cfg.Replicator)
	if p.Validate() != nil {
		p = schedpolicy.DefaultPolicy()
	}
	return New(queue, db, Options{
		Logger: log, ServerUUID: cfg.CouchDB.UUID, Policy: p, Shares: cfg.Shares,
		TransientMaxAge: cfg.Replicator.TransientJobMaxAge,
		ActivityTimeout: cfg.Couchrep.ActivityTimeout,
	})
}
