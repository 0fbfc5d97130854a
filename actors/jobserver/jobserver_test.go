package jobserver_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/couchrep/couchrep/internal/timerwheel"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// engine is the fake replication: it runs until its context ends.
func engine(ctx context.Context, _ replicate.Params, _ replicate.Options) (replicate.Result, error) {
	<-ctx.Done()
	return replicate.Result{}, nil
}

// shared is one store that several test nodes share.
type shared struct {
	db      *sqlite.DB
	cluster *cluster.Registry
	store   *repjob.Store // the test's own view
	// log, if set, is the nodes' logger (supervisors included); jobOptions
	// adjusts each job actor's options after the test engine is set.
	log        *zerolog.Logger
	jobOptions func(*jobrunner.Options)
	// lease: each node holds its jobs under a lease (repjob.Store.KeepLease),
	// as couchrepd does.
	lease bool
	// parkRecheck, if set, is the nodes' [replicator] park_recheck.
	parkRecheck time.Duration
}

func newShared(t *testing.T) *shared {
	t.Helper()
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q := jobqueue.New(db, jobqueue.Options{NodeName: "test"})
	return &shared{db: db, cluster: cluster.New(db, cluster.Options{}),
		store: repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy()})}
}

// node is a job server (and a recorder standing in for the scheduler) of
// one node on the shared store.
type node struct {
	name     string
	system   *actor.ActorSystem
	reg      *jobserver.Registry
	sup      *supervisor.Supervisor
	acceptor *actor.PID
	sched    chan any // what the job server told the scheduler
}

// recorder stands in for the scheduler: it forwards what it is told.
type recorder chan any

func (r recorder) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *scheduler.JobStarted, *scheduler.JobExited, *scheduler.WokenWaiting:
		r <- m
	}
}

// startNode starts the job server of node name; replicates says whether it
// runs jobs (else it only answers requests).
func (s *shared) startNode(t *testing.T, name string, replicates bool, maxJobs int) *node {
	t.Helper()
	if err := s.cluster.Heartbeat(context.Background(), &messages.NodeRecord{Name: name, HeartbeatIntervalMs: time.Hour.Milliseconds()}); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Couchrep.NodeName = name
	cfg.Couchrep.NodeTypes = []string{config.NodeTypeAPIFrontend}
	if replicates {
		cfg.Couchrep.NodeTypes = append(cfg.Couchrep.NodeTypes, config.NodeTypeReplication)
	}
	cfg.CouchDB.UUID = "u"
	if s.parkRecheck > 0 {
		cfg.Replicator.ParkRecheck = s.parkRecheck
	}
	p := schedpolicy.DefaultPolicy()
	p.MaxJobs = maxJobs
	q := jobqueue.New(s.db, jobqueue.Options{NodeName: name})
	store := repjob.New(q, s.db, repjob.Options{ServerUUID: "u", Policy: p})
	system := actor.NewActorSystem()
	t.Cleanup(system.Shutdown)
	n := &node{name: name, system: system, reg: jobserver.NewRegistry(), sched: make(chan any, 1000)}
	log := zerolog.Nop()
	if s.log != nil {
		log = *s.log
	}
	deps := actors.Deps{Config: cfg, Logger: log, System: system, Store: s.db, Jobs: q, RepJobs: store,
		Timers: timerwheel.New()}
	if s.lease {
		ctx, cancel := context.WithCancel(context.Background())
		done := store.GoKeepLease(ctx)
		t.Cleanup(func() { cancel(); <-done })
	}
	rec := recorder(n.sched)
	n.start(t, deps, rec, s.jobOptions)
	return n
}

func (n *node) start(t *testing.T, deps actors.Deps, rec recorder, jobOptions func(*jobrunner.Options)) {
	t.Helper()
	schedPID := actor.NewPID(n.system.Address(), actors.RootName+"/"+scheduler.Name)
	sup, err := supervisor.Start(context.Background(), n.system, actors.RootName, supervisor.Spec{
		Strategy: supervisor.RestForOne, MaxRestarts: 10, Period: time.Second, Logger: &deps.Logger,
		Children: []supervisor.ChildSpec{
			{Name: scheduler.Name, Props: actor.PropsFromProducer(func() actor.Actor { return rec })},
			jobserver.Spec(deps, jobserver.Wiring{Scheduler: schedPID}, n.reg, jobserver.Options{
				NoJitter: true, JobOptions: func(o *jobrunner.Options) {
					if o.Timers != deps.Timers {
						t.Error("a job's timers are not on the node's wheel (Deps.Timers)")
					}
					o.Engine = engine
					if jobOptions != nil {
						jobOptions(o)
					}
				},
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.sup = sup
	n.acceptor = actor.NewPID(n.system.Address(), actors.RootName+"/"+jobserver.Name+"/"+jobserver.Acceptor)
	t.Cleanup(func() { n.stop(t) })
}

func (n *node) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.sup.Stop(ctx); err != nil {
		t.Errorf("stop %s: %v", n.name, err)
	}
}

// ask sends an admin request to the node's job server.
func ask[T proto.Message](t *testing.T, n *node, msg proto.Message) (T, error) {
	t.Helper()
	var zero T
	res, err := n.system.Root.RequestFuture(n.acceptor, &actors.Ask{Msg: msg}, 60*time.Second).Result()
	if err != nil {
		return zero, err
	}
	if e, ok := res.(error); ok {
		return zero, e
	}
	r, ok := res.(T)
	if !ok {
		t.Fatalf("%T answered %T", msg, res)
	}
	return r, nil
}

func mustAsk[T proto.Message](t *testing.T, n *node, msg proto.Message) T {
	t.Helper()
	r, err := ask[T](t, n, msg)
	if err != nil {
		t.Fatalf("%T: %v", msg, err)
	}
	return r
}

// waitFor polls cond (the store is another transaction away) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (s *shared) add(t *testing.T, n *node, i int) string {
	t.Helper()
	r := mustAsk[*messages.ReplicateResponse](t, n, &messages.ReplicateRequest{
		Body: fmt.Sprintf(`{"source":"http://a/s%d","target":"http://b/t","continuous":true}`, i)})
	return r.GetId()
}

func (s *shared) runningOn(t *testing.T, node string) []string {
	t.Helper()
	var ids []string
	err := s.store.Each(context.Background(), repjob.Filter{}, func(r *repjob.Record) error {
		if r.State() == repjob.StateRunning && r.WorkerNode == node {
			ids = append(ids, r.GetJobId())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

// TestRegistry: the job server runs at most max_jobs job actors, its
// registry lists exactly the jobs the store says run here, and the
// scheduler hears of every start and exit, in order.
func TestRegistry(t *testing.T) {
	s := newShared(t)
	n := s.startNode(t, "n1", true, 2)
	for i := range 3 {
		s.add(t, n, i)
	}
	// The store says a job runs from the moment it is accepted; the
	// registry has it a moment later.
	waitFor(t, "2 jobs running on n1, in the registry and in the store", func() bool {
		got := s.runningOn(t, "n1")
		return len(got) == 2 && slices.Equal(n.reg.Jobs(), got)
	})
	if n.reg.Running() != 2 {
		t.Fatalf("%d slots taken, want 2 (max_jobs)", n.reg.Running())
	}
	// Stopping one (on this node) frees a slot, taken again at once; the
	// scheduler hears of each start before that job's exit.
	stopped := n.reg.Jobs()[0]
	mustAsk[*messages.StopJobResponse](t, n, &messages.StopJobRequest{Id: stopped})
	started, exited := map[string]int{}, map[string]int{}
	starts := 0
	deadline := time.After(30 * time.Second)
	for starts < 3 || exited[stopped] < 1 {
		select {
		case msg := <-n.sched:
			switch m := msg.(type) {
			case *scheduler.JobStarted:
				if !m.Continuous {
					t.Errorf("job %s reported one-shot", m.ID)
				}
				started[m.ID]++
				starts++
			case *scheduler.JobExited:
				if exited[m.ID] >= started[m.ID] {
					t.Errorf("job %s exited before it started", m.ID)
				}
				exited[m.ID]++
			}
		case <-deadline:
			t.Fatalf("scheduler told: started %v exited %v", started, exited)
		}
	}
	waitFor(t, "2 jobs running again", func() bool { return len(s.runningOn(t, "n1")) == 2 && n.reg.Running() == 2 })
	// The scheduler's decision arrives on the event stream.
	victim := n.reg.Jobs()[0]
	n.system.EventStream.Publish(&scheduler.TickDone{Stopped: []string{victim}})
	waitFor(t, "the rotated job handed back", func() bool {
		r, err := s.store.Get(context.Background(), victim)
		return err == nil && slices.ContainsFunc(r.History(), func(e schedpolicy.Event) bool { return e.Type == schedpolicy.EventStopped })
	})
}

// TestRemoteControl: a stop, restart or cancel asked of a node that runs
// nothing is written to the store and carried out by the job server of the
// node that runs the job.
func TestRemoteControl(t *testing.T) {
	s := newShared(t)
	worker := s.startNode(t, "worker", true, 10)
	front := s.startNode(t, "front", false, 10)
	ctx := context.Background()
	id := s.add(t, front, 0)
	waitFor(t, "the job running on worker", func() bool { return slices.Contains(s.runningOn(t, "worker"), id) })
	first, err := s.store.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	stop := mustAsk[*messages.StopJobResponse](t, front, &messages.StopJobRequest{Id: id})
	if stop.GetJob().GetId() != id || !slices.ContainsFunc(stop.GetJob().GetHistory(), func(e *messages.JobEvent) bool {
		return e.GetType() == messages.JobEventType_JOB_EVENT_TYPE_STOPPED
	}) {
		t.Fatalf("remote stop answered %v", stop)
	}
	waitFor(t, "the job running again", func() bool {
		r, err := s.store.Get(ctx, id)
		return err == nil && r.State() == repjob.StateRunning &&
			r.GetLastStarted().AsTime().After(first.GetLastStarted().AsTime())
	})
	restart := mustAsk[*messages.RestartJobResponse](t, front, &messages.RestartJobRequest{Id: id})
	if restart.GetJob().GetId() != id {
		t.Fatalf("remote restart answered %v", restart)
	}
	waitFor(t, "the job running after the restart", func() bool { return slices.Contains(s.runningOn(t, "worker"), id) })
	mustAsk[*messages.CancelJobResponse](t, front, &messages.CancelJobRequest{Id: id})
	if _, err := s.store.Get(ctx, id); !errors.Is(err, repjob.ErrNotFound) {
		t.Fatalf("canceled transient job: %v", err)
	}
	waitFor(t, "no job actor on worker", func() bool { return len(worker.reg.Jobs()) == 0 })
	if n, err := s.store.CleanupControls(ctx); err != nil || n != 0 {
		t.Fatalf("control requests left behind: %d %v", n, err)
	}
	// A job that does not run cannot be stopped; one on a node that is not
	// alive is refused at once.
	if _, err := ask[*messages.StopJobResponse](t, front, &messages.StopJobRequest{Id: "nope"}); !errors.Is(err, actors.ErrJobNotFound) {
		t.Fatalf("stop of an unknown job: %v", err)
	}
	id = s.add(t, front, 1)
	waitFor(t, "the second job running", func() bool { return slices.Contains(s.runningOn(t, "worker"), id) })
	if err := s.cluster.Leave(ctx, "worker", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := ask[*messages.StopJobResponse](t, front, &messages.StopJobRequest{Id: id}); !errors.Is(err, actors.ErrJobElsewhere) {
		t.Fatalf("stop of a job on a node that left: %v", err)
	}
}

// TestDrainPersists: a drain hands every job back and is recorded in the
// node's record; a restarted job server stays drained until undrained.
func TestDrainPersists(t *testing.T) {
	s := newShared(t)
	n := s.startNode(t, "n1", true, 10)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		ids = append(ids, s.add(t, n, i))
	}
	slices.Sort(ids)
	waitFor(t, "3 job actors running", func() bool { return len(s.runningOn(t, "n1")) == 3 && len(n.reg.Jobs()) == 3 })
	d := mustAsk[*messages.DrainResponse](t, n, &messages.DrainRequest{})
	if d.GetReleased() != 3 || !slices.Equal(d.GetJobIds(), ids) || !n.reg.Draining() || n.reg.Running() != 0 {
		t.Fatalf("drain: %v, registry draining %v running %d", d, n.reg.Draining(), n.reg.Running())
	}
	if got := s.runningOn(t, "n1"); len(got) != 0 {
		t.Fatalf("still running after the drain: %v", got)
	}
	if drained, err := s.cluster.Draining(ctx, "n1"); err != nil || !drained {
		t.Fatalf("record after drain: %v %v", drained, err)
	}
	// A new job server (a restarted node: a fresh registry) stays drained.
	n.stop(t)
	again := &node{name: "n1", system: n.system, reg: jobserver.NewRegistry(), sched: make(chan any, 1000)}
	cfg := config.Default()
	cfg.Couchrep.NodeName = "n1"
	cfg.CouchDB.UUID = "u"
	q := jobqueue.New(s.db, jobqueue.Options{NodeName: "n1"})
	deps := actors.Deps{Config: cfg, Logger: zerolog.Nop(), System: n.system, Store: s.db, Jobs: q,
		RepJobs: repjob.New(q, s.db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy()})}
	again.start(t, deps, recorder(again.sched), nil)
	waitFor(t, "the restarted job server drained", again.reg.Draining)
	if got := s.runningOn(t, "n1"); len(got) != 0 || again.reg.Running() != 0 {
		t.Fatalf("a drained node took jobs: %v", got)
	}
	mustAsk[*messages.UndrainResponse](t, again, &messages.UndrainRequest{})
	waitFor(t, "the jobs running again", func() bool { return len(s.runningOn(t, "n1")) == 3 })
	if drained, err := s.cluster.Draining(ctx, "n1"); err != nil || drained || again.reg.Draining() {
		t.Fatalf("record after undrain: %v %v", drained, err)
	}
}

// TestDrainDuringAStart: a job whose actor is being started when the drain
// comes (registered, running in the store, StartChild not called yet) is
// started, then stopped and counted by the drain like the others; the drain
// answers once every slot is free.
func TestDrainDuringAStart(t *testing.T) {
	s := newShared(t)
	var starts atomic.Int32
	var n *node
	s.jobOptions = func(*jobrunner.Options) {
		// The third start waits, on the accept loop, until the drain has
		// begun: the acceptor then stops the loop.
		if starts.Add(1) == 3 {
			for !n.reg.Draining() {
				time.Sleep(time.Millisecond)
			}
		}
	}
	n = s.startNode(t, "n1", true, 10)
	var ids []string
	for i := range 3 {
		ids = append(ids, s.add(t, n, i))
	}
	slices.Sort(ids)
	waitFor(t, "2 job actors running and the third starting", func() bool {
		return starts.Load() == 3 && len(n.reg.Jobs()) == 3
	})
	d := mustAsk[*messages.DrainResponse](t, n, &messages.DrainRequest{})
	if d.GetReleased() != 3 || !slices.Equal(d.GetJobIds(), ids) || n.reg.Running() != 0 || len(n.reg.Jobs()) != 0 {
		t.Fatalf("drain: %v, registry running %d jobs %v", d, n.reg.Running(), n.reg.Jobs())
	}
	if got := s.runningOn(t, "n1"); len(got) != 0 {
		t.Fatalf("still running after the drain: %v", got)
	}
}

// logWatch is a log writer that keeps every line; seen(text) is closed the
// first time a line contains text (one of those it was made with).
type logWatch struct {
	mu     sync.Mutex
	lines  strings.Builder
	chans  map[string]chan struct{}
	closed map[string]bool
}

func newLogWatch(texts ...string) *logWatch {
	w := &logWatch{chans: map[string]chan struct{}{}, closed: map[string]bool{}}
	for _, s := range texts {
		w.chans[s] = make(chan struct{})
	}
	return w
}

func (w *logWatch) seen(text string) <-chan struct{} { return w.chans[text] }

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines.Write(p)
	for s, ch := range w.chans {
		if !w.closed[s] && strings.Contains(string(p), s) {
			close(ch)
			w.closed[s] = true
		}
	}
	return len(p), nil
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lines.String()
}

// TestRestartBeforeTheOldActorExited: a restart hands the job back to the
// queue before its actor has exited, so the acceptor takes it again while
// the old actor still stops. The new actor must start once the old one has
// exited — never "supervisor: already started" and a job bounced back to
// the queue. The old actor's exit is held in its Stopped handler (where it
// releases the job's slot) until the test has seen the wait: before it
// leaves the registry (the acceptor waits for it), and after (jobs_sup
// waits for the exit it has not handled yet).
func TestRestartBeforeTheOldActorExited(t *testing.T) {
	const (
		acceptorWaits = "job taken again before its previous actor exited"
		supWaits      = "start waits for the previous child of that name to exit"
	)
	tests := []struct {
		name string
		// registered: the old actor is held while still in the registry.
		registered bool
		wait       string
	}{
		{"held in the registry", true, acceptorWaits},
		{"held after leaving the registry", false, supWaits},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newShared(t)
			logs := newLogWatch(tc.wait, "already started", "could not start the job actor")
			log := zerolog.New(logs)
			s.log = &log
			t.Cleanup(func() { t.Log(logs.String()) })
			var actors atomic.Int32
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(gate) }) }
			s.jobOptions = func(o *jobrunner.Options) {
				if actors.Add(1) != 1 {
					return // only the first actor's exit is held
				}
				released := o.Released
				o.Released = func() {
					if !tc.registered {
						released()
					}
					close(entered)
					<-gate
					released()
				}
			}
			n := s.startNode(t, "worker", true, 10)
			t.Cleanup(release) // before the node stops, should the test fail
			ctx := context.Background()
			id := s.add(t, n, 0)
			waitFor(t, "the job running", func() bool { return slices.Contains(s.runningOn(t, "worker"), id) })
			first, err := s.store.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			restarted := make(chan error, 1)
			go func() {
				_, err := ask[*messages.RestartJobResponse](t, n, &messages.RestartJobRequest{Id: id})
				restarted <- err
			}()
			deadline := time.After(time.Minute) // a deadlock guard only
			select {
			case <-entered:
			case <-deadline:
				t.Fatal("the old actor never exited")
			}
			select {
			case <-logs.seen(tc.wait):
			case <-logs.seen("already started"):
				t.Fatalf("the new actor's start failed while the old one stopped:\n%s", logs)
			case <-logs.seen("could not start the job actor"):
				t.Fatalf("the job went back to the queue while the old actor stopped:\n%s", logs)
			case <-deadline:
				t.Fatalf("the job was not taken again while the old actor stopped:\n%s", logs)
			}
			release()
			if err := <-restarted; err != nil {
				t.Fatalf("restart: %v", err)
			}
			waitFor(t, "the job running again under a new actor", func() bool {
				r, err := s.store.Get(ctx, id)
				return err == nil && r.State() == repjob.StateRunning && r.WorkerNode == "worker" &&
					r.GetLastStarted().AsTime().After(first.GetLastStarted().AsTime()) &&
					slices.Contains(n.reg.Jobs(), id) && actors.Load() == 2
			})
			if out := logs.String(); strings.Contains(out, "already started") || strings.Contains(out, "could not start the job actor") {
				t.Fatalf("the restart failed a start on the way:\n%s", out)
			}
		})
	}
}

// TestStopDuringStartupJitter: a stop, restart, cancel, drain or shutdown
// that comes while a job's actor waits out its startup delay
// ([replicator] startup_jitter) takes effect at once: the actor exits, the
// engine never runs, and the job goes back to the queue without ever having
// been marked started (or, canceled, is gone). The delay is 10 minutes, so
// only ending the wait passes.
func TestStopDuringStartupJitter(t *testing.T) {
	cases := []struct {
		name string
		do   func(t *testing.T, n *node, id string)
		// gone: the job is removed (a canceled transient job); pending: it
		// is back in the queue and nobody takes it (the node drained or
		// stopped); else this node takes it again (due now).
		gone, pending bool
	}{
		{name: "stop", do: func(t *testing.T, n *node, id string) {
			mustAsk[*messages.StopJobResponse](t, n, &messages.StopJobRequest{Id: id})
		}},
		{name: "restart", do: func(t *testing.T, n *node, id string) {
			mustAsk[*messages.RestartJobResponse](t, n, &messages.RestartJobRequest{Id: id})
		}},
		{name: "cancel", gone: true, do: func(t *testing.T, n *node, id string) {
			mustAsk[*messages.CancelJobResponse](t, n, &messages.CancelJobRequest{Id: id})
		}},
		{name: "drain", pending: true, do: func(t *testing.T, n *node, id string) {
			d := mustAsk[*messages.DrainResponse](t, n, &messages.DrainRequest{})
			if d.GetReleased() != 1 || !slices.Equal(d.GetJobIds(), []string{id}) {
				t.Fatalf("drain answered %v, want job %s released", d, id)
			}
		}},
		{name: "shutdown", pending: true, do: func(t *testing.T, n *node, _ string) { n.stop(t) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newShared(t)
			var spawned atomic.Int32
			var engineRan atomic.Bool
			exited := make(chan struct{})
			s.jobOptions = func(o *jobrunner.Options) {
				o.StartupDelay = 10 * time.Minute
				o.Engine = func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
					engineRan.Store(true)
					return engine(ctx, p, o)
				}
				if spawned.Add(1) == 1 { // the first actor: the one stopped
					released := o.Released
					o.Released = func() { released(); close(exited) }
				}
			}
			n := s.startNode(t, "n1", true, 10)
			id := s.add(t, n, 0)
			waitFor(t, "the job's actor waiting out its startup delay", func() bool {
				return slices.Equal(n.reg.Jobs(), []string{id}) && slices.Equal(s.runningOn(t, "n1"), []string{id})
			})
			tc.do(t, n, id)
			select {
			case <-exited:
			case <-time.After(time.Minute): // a deadlock guard: the delay is 10 minutes
				t.Fatal("the job's actor did not exit")
			}
			if engineRan.Load() {
				t.Fatal("the engine ran")
			}
			rec, err := s.store.Get(context.Background(), id)
			if tc.gone {
				if !errors.Is(err, repjob.ErrNotFound) {
					t.Fatalf("a canceled job is still there: %v %v", rec, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			h := rec.History()
			started := slices.ContainsFunc(h, func(e schedpolicy.Event) bool { return e.Type == schedpolicy.EventStarted })
			stopped := slices.ContainsFunc(h, func(e schedpolicy.Event) bool { return e.Type == schedpolicy.EventStopped })
			if started || !stopped || rec.GetLastStarted() != nil {
				t.Fatalf("job handed back during its startup delay: history %v, last started %v; want stopped, never started",
					h, rec.GetLastStarted())
			}
			if tc.pending && rec.State() != repjob.StatePending {
				t.Fatalf("job is %s after the %s, want pending", rec.State(), tc.name)
			}
		})
	}
}

// TestDocumentJobLifecycle: a _replicator document's job cannot be
// canceled (actors.ErrJobFollowsDocument; it keeps running, its actor
// too); removing it, as the doc processor does when its document is
// deleted, stops its actor through a request to the node running it, and
// replacing it (its document changed) runs the new parameters. The node lease is renewed only every activity timeout / 3,
// so an actor gone within stopBound was stopped by the request, not found
// out at a renewal.
func TestDocumentJobLifecycle(t *testing.T) {
	s := newShared(t)
	worker := s.startNode(t, "worker", true, 10)
	front := s.startNode(t, "front", false, 10)
	ctx := context.Background()
	doc := repjob.PersistentDoc{Server: "http://c/", DB: "_replicator", DocID: "d1",
		Body: []byte(`{"source":"http://a/s","target":"http://b/t","continuous":true}`)}
	res, err := s.store.AddPersistent(ctx, doc)
	if err != nil {
		t.Fatal(err)
	}
	id := res.JobID
	running := func() bool {
		return slices.Contains(s.runningOn(t, "worker"), id) && slices.Contains(worker.reg.Jobs(), id)
	}
	waitFor(t, "the document's job running on worker", running)
	// Its actor's start writes the record twice (started, then its
	// replication id claimed, after the start): the version compared below
	// is the one after both. The store says the job runs from its accept,
	// before either write: a record without last_started is not started
	// yet (its zero time is before any update).
	var first *repjob.Record
	waitFor(t, "the document's job's replication id claimed", func() bool {
		r, err := s.store.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		first = r
		return r.GetLastStarted() != nil && r.GetLastUpdated().AsTime().After(r.GetLastStarted().AsTime())
	})
	const stopBound = 3 * time.Second
	if every := s.store.ActivityTimeout() / 3; every <= stopBound {
		t.Fatalf("lease renewed every %v: the test cannot tell a request from a renewal", every)
	}
	gone := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(stopBound)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s not within %v", what, stopBound)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if _, err := ask[*messages.CancelJobResponse](t, front, &messages.CancelJobRequest{Id: id}); !errors.Is(err, actors.ErrJobFollowsDocument) ||
		!strings.Contains(err.Error(), `"d1"`) {
		t.Fatalf("cancel of a document's job: %v, want ErrJobFollowsDocument naming the document", err)
	}
	if r, err := s.store.Get(ctx, id); err != nil || r.State() != repjob.StateRunning || r.Version != first.Version || !running() {
		t.Fatalf("the document's job after a refused cancel: %v %v, actors %v", r, err, worker.reg.Jobs())
	}

	changed := doc
	changed.Body = []byte(`{"source":"http://a/other","target":"http://b/t","continuous":true}`)
	if _, err := s.store.AddPersistent(ctx, changed); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the changed document's new run", func() bool {
		r, err := s.store.Get(ctx, id)
		return err == nil && r.State() == repjob.StateRunning && strings.HasPrefix(r.GetSource(), "http://a/other") &&
			r.GetLastStarted().AsTime().After(first.GetLastStarted().AsTime()) && running()
	})

	if err := s.store.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	gone("the removed job's actor stopped", func() bool { return len(worker.reg.Jobs()) == 0 })
	if n, err := s.store.CleanupControls(ctx); err != nil || n != 0 {
		t.Fatalf("control requests left behind: %d %v", n, err)
	}
}
