package clustering_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/postgres"
	"github.com/couchrep/couchrep/internal/kv/postgres/pgtest"
	"github.com/couchrep/couchrep/messages"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// holdPool keeps maxConns job transactions of db inside their snapshot
// (each holds a connection of the store's pool) with queued more waiting
// for one, until the test ends; it returns once the pool is full.
func holdPool(t *testing.T, db kv.Database, maxConns, queued int) {
	t.Helper()
	hold := make(chan struct{})
	holding := make(chan struct{}, maxConns+queued)
	var wg sync.WaitGroup
	for i := range maxConns + queued {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			_ = db.Transact(context.Background(), func(tx kv.Tx) error {
				if _, err := kv.Keys(tx.GetRange([]byte("busy/"), []byte("busy0"), kv.RangeOptions{Limit: 1})); err != nil {
					return err
				}
				if first {
					first = false
					holding <- struct{}{}
				}
				<-hold
				tx.Set(fmt.Appendf(nil, "busy/%d", i), nil)
				return nil
			})
		}()
	}
	for range maxConns {
		<-holding
	}
	t.Cleanup(func() { close(hold); wg.Wait() })
}

// TestHeartbeatWhileStoreSaturated: a node on PostgreSQL whose store pool
// is taken by job transactions, with more queued, still heartbeats (the
// other nodes see it alive, its record's heartbeat moving on) and still
// renews its job lease: both go through the store's liveness lane
// (kv.WithPriority). At 10,000 jobs per node they queued behind the job
// transactions, and the node showed as dead while it ran its jobs.
func TestHeartbeatWhileStoreSaturated(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts a PostgreSQL server")
	}
	dsn := pgtest.Shared(t).NewDatabase(t)
	ctx := context.Background()
	open := func(maxConns int32) *postgres.DB {
		db, err := postgres.Open(ctx, dsn, postgres.Options{MaxConns: maxConns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open(2)
	observer := cluster.New(open(2), cluster.Options{})

	q := jobqueue.New(db, jobqueue.Options{NodeName: "a"})
	if err := q.SetTypeTimeout(ctx, "t", time.Minute); err != nil {
		t.Fatal(err)
	}
	lease, err := q.OpenLease(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	a, err := startMember(t, db, "a", config.NodeTypeReplication)
	if err != nil {
		t.Fatal(err)
	}
	a.next(t, messages.ClusterEvent_KIND_UNSTABLE)

	holdPool(t, db, 2, 30)
	saturated := time.Now()

	// Heartbeats go on: the record's heartbeat passes the time the pool
	// filled, again and again (the member's interval is 250 ms), and the
	// node is alive to another node.
	deadline := time.Now().Add(time.Minute)
	beats := 0
	var last time.Time
	for beats < 5 {
		members, err := observer.Members(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			if m.GetName() != "a" {
				continue
			}
			if hb := m.GetHeartbeat().AsTime(); hb.After(saturated) && hb.After(last) {
				if !m.Alive {
					t.Fatalf("a's heartbeat at %v, but it is not alive", hb)
				}
				last = hb
				beats++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeats of a since its store's pool filled at %v (last %v), want 5", beats, saturated, last)
		}
		time.Sleep(10 * time.Millisecond) // another node's view of the store: poll
	}
	// The lease renews, as often as asked, while the pool stays taken.
	for i := range 10 {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		err := lease.Renew(c)
		cancel()
		if err != nil {
			t.Fatalf("renewal %d with the pool taken: %v", i, err)
		}
	}
}
