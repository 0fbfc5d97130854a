// Package docprocessor is the doc_processor actor: it turns documents in
// _replicator databases on the watched CouchDB servers into jobs.
//
// The work is internal/docproc's Processor, run in a goroutine under a
// context cancelled when the actor stops, so Receive never blocks. The
// processor runs only on api_frontend nodes with servers to watch; elsewhere
// the actor idles. If the processor fails (its job store fails in a way it
// cannot retry), the actor exits abnormally and its supervisor restarts it.
package docprocessor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/docproc"
	"github.com/couchrep/couchrep/internal/redact"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "doc_processor"

// stopTimeout bounds how long Stopping waits for the processor to release
// its leases.
const stopTimeout = 5 * time.Second

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: actors.Props(func() actor.Actor {
		return &docProcessor{deps: deps, log: deps.Logger.With().Str("actor", Name).Logger()}
	})}
}

type docProcessor struct {
	deps actors.Deps
	log  zerolog.Logger
	task actors.Task
}

func (a *docProcessor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *actor.Stopping:
		a.stop()
	}
}

// enabled reports whether this node processes documents.
func (a *docProcessor) enabled() bool {
	c := a.deps.Config.Couchrep
	return slices.Contains(c.NodeTypes, config.NodeTypeAPIFrontend) && len(c.Watch) > 0
}

func (a *docProcessor) start(ctx actor.Context) {
	if a.deps.RepJobs == nil || a.deps.Store == nil {
		a.log.Debug().Msg("no job store: idle")
		return
	}
	if !a.enabled() {
		a.forgetAll(ctx)
		return
	}
	cfg := a.deps.Config
	// The watched servers get the same TLS settings as replication
	// endpoints ([replicator] verify_ssl_certificates, CA file, client
	// certificate).
	tr, err := couch.NewTransport(couch.TransportOptions{TLS: replicate.EndpointConfigFrom(cfg.Replicator).TLS,
		IdleTimeout: cfg.Replicator.ConnectionCloseInterval})
	if err != nil {
		supervisor.Exit(ctx, fmt.Errorf("docprocessor: %w", err))
		return
	}
	// _db_updates longpolls may send their headers only when an event
	// comes or the feed's timeout ends: no response-header deadline.
	tr.ResponseHeaderTimeout = 0
	p, err := docproc.New(docproc.Options{
		HTTPClient:         &http.Client{Transport: tr},
		Servers:            cfg.Couchrep.Watch,
		Node:               a.deps.NodeName(),
		Store:              a.deps.Store,
		Jobs:               docproc.RepJobs{Store: a.deps.RepJobs},
		Logger:             a.log,
		PollInterval:       cfg.Replicator.Interval / 2,
		CreateReplicatorDB: cfg.Replicator.CreateReplicatorDB,
		UpdateDocs:         cfg.Replicator.UpdateDocs,
		Competition:        a.deps.Competition,
		OnCompeting:        cfg.Couchrep.OnCompetingReplicator,
		ServerUUID:         cfg.CouchDB.UUID,
	})
	if err != nil {
		supervisor.Exit(ctx, fmt.Errorf("docprocessor: %w", err))
		return
	}
	self, root := ctx.Self(), ctx.ActorSystem().Root
	a.task.Go(func(runCtx context.Context) {
		// The processor adds jobs inside its own transactions
		// (docproc.RepJobs.InTx): the job type is registered first.
		err := a.deps.RepJobs.Init(runCtx)
		if err == nil {
			err = p.Run(runCtx)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			root.Send(self, &actors.Failed{Err: err})
		}
	})
	watch := make([]string, len(cfg.Couchrep.Watch))
	for i, u := range cfg.Couchrep.Watch {
		watch[i] = redact.URL(u)
	}
	a.log.Info().Strs("watch", watch).Msg("doc processor started")
}

// forgetAll is the start of a node that processes no documents (not
// api_frontend, or an empty watch list): the servers no other node watches
// are forgotten (docproc.Processor.ForgetUnwatched: a server removed from
// the last watch list must not keep its jobs), then the actor idles.
func (a *docProcessor) forgetAll(ctx actor.Context) {
	p, err := docproc.New(docproc.Options{Node: a.deps.NodeName(), Store: a.deps.Store,
		Jobs: docproc.RepJobs{Store: a.deps.RepJobs}, Logger: a.log})
	if err != nil {
		supervisor.Exit(ctx, fmt.Errorf("docprocessor: %w", err))
		return
	}
	a.task.Go(func(runCtx context.Context) {
		err := a.deps.RepJobs.Init(runCtx)
		if err == nil {
			_, err = p.ForgetUnwatched(runCtx)
		}
		if err != nil && runCtx.Err() == nil {
			a.log.Warn().Err(err).Msg("forgetting servers no longer watched failed; trying again at the next start")
		}
	})
	a.log.Debug().Msg("not an api_frontend node or nothing to watch: idle")
}

func (a *docProcessor) stop() {
	if !a.task.Stop(stopTimeout) {
		a.log.Warn().Msg("doc processor did not stop in time")
	}
}
