package scheduler_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/actors/jobserver"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// node is a scheduler + job server on a real queue over sqlite, with a fake
// clock and a fake replication engine.
type node struct {
	db     *sqlite.DB
	store  *repjob.Store
	clock  *schedpolicy.FakeClock
	system *actor.ActorSystem
	jobs   *jobserver.Registry
	events chan any
	sched  *actor.PID
}

// engine is the fake replication: continuous jobs run until stopped,
// one-shot ones too (they are never rotated), and crashing ones fail at
// once.
func engine(crash map[string]bool) func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
	return func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
		if crash[p.Source.URL] {
			return replicate.Result{}, fmt.Errorf("%w: could not open source", replicate.ErrDBNotFound)
		}
		<-ctx.Done()
		return replicate.Result{}, nil
	}
}

func startNode(t *testing.T, p schedpolicy.Policy, crash map[string]bool) *node {
	t.Helper()
	return startNodeWith(t, p, crash, nil)
}

// startNodeWith starts a node whose scheduler options opts changes (its
// clock and manual ticks are set first), given the store.
func startNodeWith(t *testing.T, p schedpolicy.Policy, crash map[string]bool, opts func(*scheduler.Options, *sqlite.DB, *schedpolicy.FakeClock)) *node {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := schedpolicy.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	q := jobqueue.New(db, jobqueue.Options{Clock: clock.Now, NodeName: "n1", AcceptSpread: 1})
	store := repjob.New(q, db, repjob.Options{Clock: clock, ServerUUID: "u", Policy: p})
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	cfg := config.Default()
	cfg.Couchrep.NodeName = "n1"
	cfg.CouchDB.UUID = "u"
	deps := actors.Deps{Config: cfg, Logger: zerolog.Nop(), System: system, Store: db, Jobs: q, RepJobs: store}
	n := &node{db: db, store: store, clock: clock, system: system, jobs: jobserver.NewRegistry(), events: make(chan any, 10000)}
	sub := system.EventStream.Subscribe(func(e any) {
		switch e.(type) {
		case *scheduler.TickDone, *messages.ReplicationJobEvent:
			n.events <- e
		}
	})
	t.Cleanup(func() { system.EventStream.Unsubscribe(sub) })
	n.sched = actor.NewPID(system.Address(), actors.RootName+"/"+scheduler.Name)
	so := scheduler.Options{Clock: clock, Manual: true}
	if opts != nil {
		opts(&so, db, clock)
	}
	js := jobserver.Spec(deps, jobserver.Wiring{Scheduler: n.sched}, n.jobs, jobserver.Options{
		NoJitter: true,
		// The fake engine makes no HTTP requests: no connection_pool needed.
		JobOptions: func(o *jobrunner.Options) { o.Engine = engine(crash) },
	})
	sup, err := supervisor.Start(context.Background(), system, actors.RootName, supervisor.Spec{
		Strategy: supervisor.RestForOne, MaxRestarts: 10, Period: time.Second,
		Children: []supervisor.ChildSpec{
			{Name: scheduler.Name, Props: scheduler.Props(store, zerolog.Nop(), so)},
			js,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = sup.Stop(ctx)
	})
	return n
}

// waitRunning waits for job events until want jobs run on the node (as the
// scheduler sees them), checking max_jobs all along.
func (n *node) waitRunning(t *testing.T, want, maxJobs int) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if r := n.jobs.Running(); r > maxJobs {
			t.Fatalf("%d jobs running, max_jobs %d", r, maxJobs)
		}
		st := n.status(t)
		if len(st.Running) == want && n.jobs.Running() == want {
			return st.Running
		}
		select {
		case <-n.events:
		case <-deadline:
			t.Fatalf("waiting for %d running jobs, have %v", want, st.Running)
		}
	}
}

func (n *node) status(t *testing.T) *messages.SchedulerStatusResponse {
	t.Helper()
	res, err := n.system.Root.RequestFuture(n.sched, &messages.SchedulerStatusRequest{}, 10*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res.(*messages.SchedulerStatusResponse)
}

func (n *node) tick(t *testing.T) *scheduler.TickDone {
	t.Helper()
	n.system.Root.Send(n.sched, scheduler.Tick{})
	deadline := time.After(30 * time.Second)
	for {
		select {
		case e := <-n.events:
			if d, ok := e.(*scheduler.TickDone); ok {
				return d
			}
		case <-deadline:
			t.Fatal("no TickDone")
		}
	}
}

func TestRotationRespectsMaxJobsAndChurn(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn, p.Interval = 3, 2, time.Minute
	n := startNode(t, p, nil)
	ctx := context.Background()
	oneShot, err := n.store.AddTransient(ctx, []byte(`{"source":"http://a/oneshot","target":"http://b/t"}`), "u")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		_, err := n.store.AddTransient(ctx, fmt.Appendf(nil, `{"source":"http://a/c%d","target":"http://b/t","continuous":true}`, i), "u")
		if err != nil {
			t.Fatal(err)
		}
	}
	running := n.waitRunning(t, 3, p.MaxJobs)
	if !contains(running, oneShot.JobID) {
		t.Fatalf("the one-shot job (added first) is not running: %v", running)
	}
	seen := map[string]bool{}
	for round := range 6 {
		n.clock.Advance(p.Interval)
		d := n.tick(t)
		if d.Pending != 4 || d.Running != 3 {
			t.Fatalf("round %d: pending %d running %d", round, d.Pending, d.Running)
		}
		// 4 pending, 3 running (one one-shot): the 2 continuous jobs go.
		if len(d.Stopped) != p.MaxChurn || contains(d.Stopped, oneShot.JobID) {
			t.Fatalf("round %d: stopped %v", round, d.Stopped)
		}
		// The stopped jobs go back to the queue (a "stopped" event at this
		// tick's time) and others fill the slots.
		for _, id := range d.Stopped {
			waitStopped(t, n, id, n.clock.Now())
		}
		running = n.waitRunning(t, 3, p.MaxJobs)
		for _, id := range running {
			seen[id] = true
		}
	}
	if len(seen) != 7 {
		t.Fatalf("rotation ran %d distinct jobs, want all 7", len(seen))
	}
	st := n.status(t)
	if st.Rotated != int64(6*p.MaxChurn) {
		t.Fatalf("rotated %d", st.Rotated)
	}
}

// TestRotationOnlyBeyondClusterSlots: a full node with a live peer rotates
// only for the pending jobs beyond the peer's free slots, as the peer's
// membership record (its heartbeat) tells them; the node publishes its own
// free slots for the peer; once the peer is gone it rotates as CouchDB.
// Without the rule, the first tick stops max_churn jobs that the peer
// would have had room for.
func TestRotationOnlyBeyondClusterSlots(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MaxChurn, p.Interval = 3, 2, time.Minute
	slots := &schedpolicy.FreeSlots{}
	var reg *cluster.Registry
	n := startNodeWith(t, p, nil, func(o *scheduler.Options, db *sqlite.DB, clock *schedpolicy.FakeClock) {
		reg = cluster.New(db, cluster.Options{Clock: clock.Now})
		o.Slots, o.Peers = slots, scheduler.PeersFrom(reg, "n1")
	})
	ctx := context.Background()
	if free, ok := slots.Get(); !ok || free != p.MaxJobs {
		t.Fatalf("free slots of an empty node: %d %v, want %d", free, ok, p.MaxJobs)
	}
	for i := range 5 {
		if _, err := n.store.AddTransient(ctx, fmt.Appendf(nil, `{"source":"http://a/c%d","target":"http://b/t","continuous":true}`, i), "u"); err != nil {
			t.Fatal(err)
		}
	}
	n.waitRunning(t, 3, p.MaxJobs)
	if free, _ := slots.Get(); free != 0 {
		t.Fatalf("free slots of a full node: %d", free)
	}
	peer := func(free uint32, types ...string) {
		t.Helper()
		if err := reg.Heartbeat(ctx, &messages.NodeRecord{Name: "n2", Types: types, Incarnation: "i2",
			HeartbeatIntervalMs: p.Interval.Milliseconds(), FreeSlots: proto.Uint32(free)}); err != nil {
			t.Fatal(err)
		}
	}
	repl := config.NodeTypeReplication
	tests := []struct {
		name      string
		peer      func()
		wantPeers schedpolicy.Peers
		wantStops int
	}{
		{"peer's free slots cover the 2 pending", func() { peer(2, repl) }, schedpolicy.Peers{N: 1, Free: 2}, 0},
		{"peer has room for more", func() { peer(7, repl) }, schedpolicy.Peers{N: 1, Free: 7}, 0},
		{"one pending beyond the peer's slot", func() { peer(1, repl) }, schedpolicy.Peers{N: 1, Free: 1}, 1},
		{"an api_frontend node is no peer", func() { peer(5, config.NodeTypeAPIFrontend) }, schedpolicy.Peers{}, 2},
		// Both full: they split the 2 pending jobs (n1 sorts first).
		{"peer full", func() { peer(0, repl) }, schedpolicy.Peers{N: 1, Full: 1}, 1},
		{"peer drained", func() {
			peer(5, repl)
			if err := reg.SetDraining(ctx, "n2", true); err != nil {
				t.Fatal(err)
			}
		}, schedpolicy.Peers{N: 1}, 2},
		// No heartbeat for three intervals: n2 is gone, n1 is alone.
		{"peer dead", func() { n.clock.Advance(3 * p.Interval) }, schedpolicy.Peers{}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n.clock.Advance(p.Interval)
			tc.peer()
			d := n.tick(t)
			if d.Pending != 2 || d.Running != 3 || d.Peers != tc.wantPeers || len(d.Stopped) != tc.wantStops {
				t.Fatalf("tick: pending %d running %d peers %+v stopped %v; want 2, 3, %+v, %d stopped",
					d.Pending, d.Running, d.Peers, d.Stopped, tc.wantPeers, tc.wantStops)
			}
			for _, id := range d.Stopped {
				waitStopped(t, n, id, n.clock.Now())
			}
			n.waitRunning(t, 3, p.MaxJobs)
		})
	}
}

func TestCrashingJobBacksOffAndHeals(t *testing.T) {
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs, p.MinBackoff, p.MaxBackoff, p.HealthThreshold = 2, 20*time.Millisecond, 80*time.Millisecond, time.Minute
	crash := map[string]bool{"http://a/bad/": true}
	n := startNode(t, p, crash)
	ctx := context.Background()
	r, err := n.store.AddTransient(ctx, []byte(`{"source":"http://a/bad","target":"http://b/t","continuous":true}`), "u")
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{20 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 80 * time.Millisecond}
	var after uint64
	for i, backoff := range want {
		rec := waitCrash(t, n, r.JobID, &after, int32(i+1))
		crashedAt := rec.History()[0].At
		if got := rec.ScheduledAt.Sub(crashedAt); got != backoff {
			t.Fatalf("crash %d: backoff %v, want %v", i+1, got, backoff)
		}
		if !strings.Contains(rec.LastError, "could not open source") {
			t.Fatalf("crash %d: reason %q", i+1, rec.LastError)
		}
		n.clock.Advance(backoff) // the acceptor takes it again
	}
	// (Healing after health_threshold is tested in internal/repjob.)
}

func waitCrash(t *testing.T, n *node, id string, after *uint64, crashes int32) *repjob.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		rec, err := n.store.WaitChange(ctx, id, *after)
		if err != nil {
			t.Fatalf("waiting for crash %d: %v", crashes, err)
		}
		*after = rec.Version
		if rec.State() == repjob.StateCrashing && rec.ErrorCount == crashes {
			return rec
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func waitStopped(t *testing.T, n *node, id string, at time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var after uint64
	for {
		rec, err := n.store.WaitChange(ctx, id, after)
		if err != nil {
			t.Fatalf("waiting for %s to stop: %v", id, err)
		}
		after = rec.Version
		for _, e := range rec.History() {
			if e.Type == schedpolicy.EventStopped && e.At.Equal(at) {
				return
			}
		}
	}
}
