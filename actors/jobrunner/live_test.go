package jobrunner_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// TestLiveProgress: every stats report of the engine is published at once
// as a progress event (the node's HTTP API serves those), while the store
// gets the first report and then nothing more until ActivityTimeout/2 has
// passed (here 5 minutes) or the run ends: the held-back report is written
// before the run is ended. The engine is asked for a report every
// LiveInterval, not every ActivityTimeout/2.
func TestLiveProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
	store := repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy(), ActivityTimeout: 10 * time.Minute})
	added, err := store.AddTransient(ctx, []byte(`{"source":"http://a/s","target":"http://b/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	run, err := store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	system := actor.NewActorSystem()
	defer system.Shutdown()
	progress := make(chan *messages.ReplicationJobEvent, 16)
	sub := system.EventStream.Subscribe(func(e any) {
		if ev, ok := e.(*messages.ReplicationJobEvent); ok && ev.GetProgress() {
			progress <- ev
		}
	})
	defer system.EventStream.Unsubscribe(sub)
	sup, err := supervisor.Start(ctx, system, "jobs_sup", supervisor.Spec{Strategy: supervisor.SimpleOneForOne,
		MaxRestarts: 10, Period: time.Second, Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sup.Stop(context.Background()) }()

	interval := make(chan time.Duration, 1)
	engine := func(ctx context.Context, _ replicate.Params, o replicate.Options) (replicate.Result, error) {
		interval <- o.ProgressInterval
		for i := int64(1); i <= 3; i++ {
			o.OnProgress(replicate.Stats{DocsRead: i, DocsWritten: i, RevisionsChecked: i})
		}
		<-ctx.Done() // until stopped
		return replicate.Result{Stats: replicate.Stats{DocsRead: 3, DocsWritten: 3, RevisionsChecked: 3}}, ctx.Err()
	}
	exited := make(chan struct{})
	o := jobrunner.Options{Store: store, Node: "n1", ServerUUID: "u", Logger: zerolog.Nop(), Engine: engine,
		Released: func() { close(exited) }}
	pid, err := supervisor.StartChild(ctx, system, sup.PID(), jobrunner.Name(added.JobID), jobrunner.Props(run, o))
	if err != nil {
		t.Fatal(err)
	}
	if got := <-interval; got != jobrunner.LiveInterval {
		t.Errorf("engine's ProgressInterval %v, want %v", got, jobrunner.LiveInterval)
	}
	for i := int64(1); i <= 3; i++ {
		select {
		case ev := <-progress:
			if ev.GetJobId() != added.JobID || ev.GetNode() != "n1" || repjob.State(ev.GetState()) != repjob.StateRunning ||
				ev.GetStats().GetDocsWritten() != i || ev.GetStartedAt() == nil {
				t.Fatalf("progress event %d: %v", i, ev)
			}
		case <-ctx.Done():
			t.Fatalf("no progress event %d", i)
		}
	}
	rec, err := store.Get(ctx, added.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.GetStats().GetDocsWritten(); got != 1 {
		t.Errorf("the store has docs_written %d while the run is under way, want the first report's 1 (the next write is due in 5 minutes)", got)
	}
	system.Root.Send(pid, &messages.StopReplicationJobRequest{JobId: added.JobID, Reason: "operator"})
	select {
	case <-exited:
	case <-ctx.Done():
		t.Fatal("the job actor did not exit")
	}
	rec, err = store.Get(ctx, added.JobID)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.GetStats().GetDocsWritten(); got != 3 || rec.State() != repjob.StatePending {
		t.Errorf("after the stop: %s with docs_written %d, want pending with the last report's 3", rec.State(), got)
	}

	// The job's next run starts its counters from the last run's (Prior:
	// they never go backwards, even when its checkpoint has fewer), and
	// the node is told only what the run itself counts (OnCounted).
	run, err = store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	prior := make(chan *replicate.Prior, 1)
	o.Engine = func(ctx context.Context, _ replicate.Params, o replicate.Options) (replicate.Result, error) {
		prior <- o.Prior
		o.OnCounted(replicate.Stats{DocsRead: 2, DocsWritten: 2})
		return replicate.Result{Stats: replicate.Stats{DocsRead: 5, DocsWritten: 5}}, nil
	}
	counted := make(chan string, 1)
	o.OnCounted = func(id string, s replicate.Stats) { counted <- fmt.Sprint(id, " ", s.DocsRead, " ", s.DocsWritten) }
	exited = make(chan struct{})
	o.Released = func() { close(exited) }
	if _, err := supervisor.StartChild(ctx, system, sup.PID(), jobrunner.Name(added.JobID), jobrunner.Props(run, o)); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-prior:
		if p == nil || p.RepID != rec.GetRepId() || p.RepID == "" || p.Stats.DocsWritten != 3 || p.Stats.DocsRead != 3 || p.Stats.RevisionsChecked != 3 {
			t.Errorf("the next run's Prior %+v, want the job's last counters (3) for %s", p, rec.GetRepId())
		}
	case <-ctx.Done():
		t.Fatal("the job did not run again")
	}
	select {
	case got := <-counted:
		if want := added.JobID + " 2 2"; got != want {
			t.Errorf("OnCounted got %q, want %q", got, want)
		}
	case <-ctx.Done():
		t.Fatal("OnCounted was not called")
	}
	select {
	case <-exited:
	case <-ctx.Done():
		t.Fatal("the job actor did not exit")
	}
}
