package docproc

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/testserver"
)

// TestRecreatedDatabase: a _replicator database deleted and created again
// between two listings of the server's databases (discovery never sees it
// gone) is a new database: the jobs of the old one's documents are
// removed, and the new one's documents get jobs. The follower finds out
// when its feed ends (its update_seq is behind the checkpoint). Before,
// the old documents' jobs stayed forever.
func TestRecreatedDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts pouchdb-server: skipped with -short")
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	srv := testserver.StartPouchDB(t)
	plainReplicatorDB(t, srv, true)
	store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "store.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	fj := newFakeJobs()
	// Discovery lists the databases once an hour: only the follower can
	// notice.
	p, err := New(Options{Servers: []string{srv.URL}, Node: "n1", Store: store, Jobs: fj, HTTPClient: client,
		Logger:       zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		PollInterval: time.Hour, LeaseTTL: 3 * time.Second, FeedTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	rdb := srv.DBURL("_replicator")
	job := func(id string) string { return couchKey(t, srv.URL) + "|_replicator|" + id }
	exists := func(id string) bool { _, err := fj.Get(context.Background(), job(id)); return err == nil }
	for i := range 3 {
		id := fmt.Sprintf("old-%d", i)
		srv.Do(t, "PUT", rdb+id, []byte(validBody), 201)
		eventually(t, id+" added", func() bool { return exists(id) })
	}
	srv.Do(t, "DELETE", rdb, nil, 200)
	srv.Do(t, "PUT", rdb, nil, 201)
	srv.Do(t, "PUT", rdb+"new", []byte(validBody), 201)
	eventually(t, "the new database's document added", func() bool { return exists("new") })
	for i := range 3 {
		id := fmt.Sprintf("old-%d", i)
		eventually(t, id+" removed", func() bool { return !exists(id) && fj.removeCount(job(id)) == 1 })
	}
}
