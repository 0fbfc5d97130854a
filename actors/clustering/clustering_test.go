package clustering_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/clustering"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// member is one clustering actor (one "node") on a shared store.
type member struct {
	sup    *supervisor.Supervisor
	system *actor.ActorSystem
	events chan *messages.ClusterEvent
	store  *repjob.Store
	slots  *schedpolicy.FreeSlots
}

func openStore(t *testing.T) kv.Database {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func startMember(t *testing.T, db kv.Database, name string, types ...string) (*member, error) {
	t.Helper()
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	cfg := config.Default()
	cfg.Couchrep.NodeName = name
	cfg.Couchrep.NodeTypes = types
	cfg.Couchrep.DataDir = t.TempDir()
	q := jobqueue.New(db, jobqueue.Options{NodeName: name})
	store := repjob.New(q, db, repjob.Options{ServerUUID: "u"})
	slots := &schedpolicy.FreeSlots{}
	deps := actors.Deps{Config: cfg, Logger: zerolog.Nop(), System: system, Store: db, Jobs: q, RepJobs: store, Slots: slots}
	m := &member{system: system, events: make(chan *messages.ClusterEvent, 100), store: store, slots: slots}
	sub := system.EventStream.Subscribe(func(e any) {
		if ev, ok := e.(*messages.ClusterEvent); ok {
			m.events <- ev
		}
	})
	t.Cleanup(func() { system.EventStream.Unsubscribe(sub) })
	spec := supervisor.ChildSpec{Name: clustering.Name, Props: clustering.Props(deps, clustering.Options{
		Interval: 250 * time.Millisecond, Quiet: 100 * time.Millisecond, FailAfter: 200 * time.Millisecond})}
	sup, err := supervisor.Start(t.Context(), system, "couchrep_sup", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 3, Period: time.Second, Children: []supervisor.ChildSpec{spec}})
	if err != nil {
		return nil, err
	}
	m.sup = sup
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	return m, nil
}

// next waits for the next cluster event of kind.
func (m *member) next(t *testing.T, kind messages.ClusterEvent_Kind) *messages.ClusterEvent {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev := <-m.events:
			if ev.GetKind() == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event", kind)
		}
	}
}

func (m *member) nodes(t *testing.T) *messages.NodesResponse {
	t.Helper()
	pid := actor.NewPID(m.system.Address(), "couchrep_sup/"+clustering.Name)
	res, err := m.system.Root.RequestFuture(pid, &actors.Ask{Msg: &messages.NodesRequest{}}, 10*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := res.(*messages.NodesResponse)
	if !ok {
		t.Fatalf("reply %T %v", res, res)
	}
	return resp
}

func TestMembershipEventsAndNodes(t *testing.T) {
	db := openStore(t)
	a, err := startMember(t, db, "a", config.NodeTypeReplication)
	if err != nil {
		t.Fatal(err)
	}
	if ev := a.next(t, messages.ClusterEvent_KIND_UNSTABLE); len(ev.GetMembers()) != 1 || ev.GetMembers()[0] != "a" {
		t.Fatalf("first event %v", ev)
	}
	a.next(t, messages.ClusterEvent_KIND_STABLE)

	// A job running on a shows in its node info.
	ctx := t.Context()
	if _, err := a.store.AddTransient(ctx, []byte(`{"source":"http://127.0.0.1:1/s","target":"http://127.0.0.1:1/t"}`), "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.store.Accept(ctx, false); err != nil {
		t.Fatal(err)
	}

	b, err := startMember(t, db, "b", config.NodeTypeAPIFrontend)
	if err != nil {
		t.Fatal(err)
	}
	if ev := a.next(t, messages.ClusterEvent_KIND_UNSTABLE); len(ev.GetMembers()) != 2 {
		t.Fatalf("after b joined: %v", ev)
	}
	a.next(t, messages.ClusterEvent_KIND_STABLE)
	resp := a.nodes(t)
	if len(resp.GetNodes()) != 2 || resp.GetUnstable() {
		t.Fatalf("nodes %v", resp)
	}
	want := map[string]struct {
		typ     string
		running uint32
	}{"a": {config.NodeTypeReplication, 1}, "b": {config.NodeTypeAPIFrontend, 0}}
	for _, n := range resp.GetNodes() {
		w := want[n.GetName()]
		if !n.GetAlive() || len(n.GetTypes()) != 1 || n.GetTypes()[0] != w.typ || n.GetRunningJobs() != w.running {
			t.Fatalf("node %v, want %+v", n, w)
		}
	}

	// b stops cleanly: it leaves at once, and a sees the change.
	if err := b.sup.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := a.next(t, messages.ClusterEvent_KIND_UNSTABLE); len(ev.GetMembers()) != 1 {
		t.Fatalf("after b left: %v", ev)
	}
	for _, n := range a.nodes(t).GetNodes() {
		if n.GetName() == "b" && n.GetAlive() {
			t.Fatalf("b still alive after leaving: %v", n)
		}
	}
}

// TestStoreUnavailable: a node whose store cannot take its heartbeat does
// not start, and one whose store goes away mid-run stops with the error.
func TestStoreUnavailable(t *testing.T) {
	tests := []struct {
		name       string
		closeFirst bool
	}{
		{"at start", true},
		{"mid-run", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.closeFirst {
				db.Close()
				_, err := startMember(t, db, "a", config.NodeTypeReplication)
				if !errors.Is(err, supervisor.ErrStartFailed) {
					t.Fatalf("start on a closed store: %v", err)
				}
				return
			}
			m, err := startMember(t, db, "a", config.NodeTypeReplication)
			if err != nil {
				t.Fatal(err)
			}
			m.next(t, messages.ClusterEvent_KIND_UNSTABLE)
			db.Close()
			select {
			case <-m.sup.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the supervisor did not give up after the store went away")
			}
			if err := m.sup.Err(); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// TestHeartbeatCarriesFreeSlots: the node's record says its scheduler's
// free slots (none before the scheduler set them), for the other nodes'
// schedulers (scheduler.PeersFrom).
func TestHeartbeatCarriesFreeSlots(t *testing.T) {
	db := openStore(t)
	a, err := startMember(t, db, "a", config.NodeTypeReplication)
	if err != nil {
		t.Fatal(err)
	}
	reg := cluster.New(db, cluster.Options{})
	record := func() *messages.NodeRecord {
		t.Helper()
		ms, err := reg.Members(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if m.GetName() == "a" {
				return m.NodeRecord
			}
		}
		t.Fatal("no record of a")
		return nil
	}
	if rec := record(); rec.FreeSlots != nil {
		t.Fatalf("free slots %d before the scheduler set them", rec.GetFreeSlots())
	}
	for _, free := range []int{4, 0, 2} {
		a.slots.Set(free)
		deadline := time.Now().Add(30 * time.Second)
		for rec := record(); rec.FreeSlots == nil || int(rec.GetFreeSlots()) != free; rec = record() {
			if time.Now().After(deadline) {
				t.Fatalf("record's free slots %v, want %d", rec.FreeSlots, free)
			}
			time.Sleep(50 * time.Millisecond) // the heartbeat runs on its own: poll
		}
	}
}
