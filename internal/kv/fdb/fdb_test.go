//go:build fdb

package fdb

import (
	"context"
	"os"
	"testing"

	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/kvtest"
)

func TestMain(m *testing.M) {
	if kvtest.IsChild() {
		os.Exit(kvtest.RunChild(func(ctx context.Context, clusterFile string) (kv.Database, error) {
			return Open(ctx, Options{ClusterFile: clusterFile})
		}))
	}
	os.Exit(m.Run())
}

func openCluster(t *testing.T) *DB {
	cf := os.Getenv("FDB_CLUSTER_FILE")
	if cf == "" {
		t.Skip("FDB_CLUSTER_FILE not set: no FoundationDB cluster to test against")
	}
	db, err := Open(context.Background(), Options{ClusterFile: cf})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestConformance runs kvtest against the cluster; every case writes under
// a fresh random prefix, so a shared test cluster is fine.
func TestConformance(t *testing.T) {
	db := openCluster(t)
	kvtest.Run(t, func(*testing.T) kv.Database { return db })
}

func TestConformanceMultiProcess(t *testing.T) {
	db := openCluster(t)
	kvtest.RunMultiProcess(t, db, os.Getenv("FDB_CLUSTER_FILE"))
}
