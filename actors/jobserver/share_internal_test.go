package jobserver

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/kv/storetest"
	"github.com/couchrep/couchrep/messages"
)

// TestFairShare: the accept loop's bound is this node's share of the
// pending jobs with the peers its store's membership records list (alive,
// replication, not drained); a node over its share leaves the jobs to the
// peers while their held jobs grow, and takes them itself (no bound) once
// they took none for two of their heartbeat intervals; alone it takes all.
func TestFairShare(t *testing.T) {
	ctx := context.Background()
	reg := cluster.New(storetest.OpenSQLite(t), cluster.Options{})
	now := time.Now()
	f := &fairShare{reg: reg, self: "self", now: func() time.Time { return now }}
	if got := f.next(ctx, 0, 100)(60); got != 60 {
		t.Fatalf("alone: share %d of 60, want 60", got)
	}
	beat := func(name string, held uint32, types ...string) {
		t.Helper()
		if err := reg.Heartbeat(ctx, &messages.NodeRecord{Name: name, Types: types, HeartbeatIntervalMs: time.Minute.Milliseconds(),
			FreeSlots: proto.Uint32(100), HeldJobs: proto.Uint32(held)}); err != nil {
			t.Fatal(err)
		}
	}
	repl := config.NodeTypeReplication
	beat("self", 0, repl)
	beat("p1", 0, repl)
	beat("p2", 0, repl)
	beat("front", 0, config.NodeTypeAPIFrontend)
	if got := f.next(ctx, 0, 100)(60); got != 20 {
		t.Fatalf("3 replication nodes (and a front end): share %d of 60, want 20", got)
	}
	if err := reg.SetDraining(ctx, "p2", true); err != nil {
		t.Fatal(err)
	}
	if got := f.next(ctx, 0, 100)(60); got != 30 {
		t.Fatalf("a peer drained: share %d of 60, want 30", got)
	}
	// Over its share: the peer holds nothing yet, it will take the 10.
	if got := f.next(ctx, 20, 100)(10); got != 0 {
		t.Fatalf("holding 20 of 30: share %d of 10, want 0", got)
	}
	f.deferred()
	now = now.Add(90 * time.Second)
	beat("p1", 5, repl) // it takes jobs: the deferral goes on
	if share := f.next(ctx, 20, 100); share == nil || share(5) != 0 {
		t.Fatal("the peer takes jobs: want the bound kept")
	}
	f.deferred()
	now = now.Add(90 * time.Second)
	if share := f.next(ctx, 20, 100); share == nil {
		t.Fatal("bound lifted 90 s into the deferral (grace: 2 heartbeat intervals of a minute)")
	}
	now = now.Add(31 * time.Second)
	if share := f.next(ctx, 20, 100); share != nil {
		t.Fatalf("the peer took nothing for 2 min: want no bound, got a share of %d of 5", share(5))
	}
	f.taken()
	if share := f.next(ctx, 20, 100); share == nil || share(5) != 0 {
		t.Fatal("after a bounded batch: want the bound back")
	}
}
