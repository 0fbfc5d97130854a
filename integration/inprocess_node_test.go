package integration

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
)

// inProcessNode is a node running in this process (couchrep.Start: the actors
// couchrepd runs) with its job store opened beside it, as the benchmarks
// that measure what the node itself holds and spends use it (a couchrepd
// process would hide its heap and goroutines). Jobs are added through
// Store (AddTransient), as POST /_replicate adds them.
type inProcessNode struct {
	*couchrep.Node
	Store *repjob.Store

	db       *sqlite.DB
	stopOnce sync.Once
	stopErr  error
}

// startInProcessNode starts a node in this process with cfg on a new data
// directory (cfg.Couchrep.DataDir is set here, then cfg.Complete) and
// logger, and opens its store (repjob.NewFromConfig, Init). The node runs
// on its own context: a benchmark's context cancelled by a defer does not
// stop it. stop ends it; it is also a cleanup of tb, and cleanups run
// after the benchmark's defers, last registered first: whatever the
// benchmark started before the node (a fake or test server, a temporary
// directory) outlives the node. A benchmark that starts a node per
// iteration of b.N calls stop at the end of each.
func startInProcessNode(tb testing.TB, cfg couchrep.Config, logger zerolog.Logger) *inProcessNode {
	tb.Helper()
	dir := tb.TempDir()
	cfg.Couchrep.DataDir = dir
	if err := cfg.Complete(); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // the start only
	defer cancel()
	node, err := couchrep.Start(ctx, cfg, couchrep.WithLogger(logger))
	if err != nil {
		tb.Fatal(err)
	}
	n := &inProcessNode{Node: node}
	tb.Cleanup(func() {
		if err := n.stop(); err != nil {
			tb.Errorf("in-process node: %v", err)
		}
	})
	db, err := sqlite.Open(ctx, filepath.Join(dir, config.StoreFileName), sqlite.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	n.db = db
	n.Store = repjob.NewFromConfig(jobqueue.New(db, jobqueue.Options{NodeName: "bench", Logger: zerolog.Nop()}), db, cfg, zerolog.Nop())
	if err := n.Store.Init(ctx); err != nil {
		tb.Fatal(err)
	}
	return n
}

// stop stops the node (waiting up to 5 minutes for its jobs to end), then
// closes the store opened beside it; once, whoever calls it first.
func (n *inProcessNode) stop() error {
	n.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := n.Node.Stop(ctx); err != nil {
			n.stopErr = err
		}
		if n.db != nil {
			if err := n.db.Close(); err != nil && n.stopErr == nil {
				n.stopErr = err
			}
		}
	})
	return n.stopErr
}
