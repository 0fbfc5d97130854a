//go:build fdb

package couchrep

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/fdb"
)

func init() {
	openFDB = func(ctx context.Context, clusterFile string, log zerolog.Logger) (kv.Database, error) {
		return fdb.Open(ctx, fdb.Options{ClusterFile: clusterFile, Logger: log})
	}
}
