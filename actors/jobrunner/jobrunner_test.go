package jobrunner_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

type engineFunc = func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error)

// TestJobActor runs one job actor per case with a fake engine and checks
// how it ends the run in the store, the event it publishes, and that it
// gives its slot back exactly once.
func TestJobActor(t *testing.T) {
	untilStopped := func(ctx context.Context, _ replicate.Params, _ replicate.Options) (replicate.Result, error) {
		<-ctx.Done()
		return replicate.Result{}, nil
	}
	cases := []struct {
		name       string
		body       string
		engine     engineFunc
		stop       bool // send a StopReplicationJobRequest once it runs
		remove     bool // remove the job from the store once it runs
		state      repjob.State
		eventState repjob.State // 0: no terminal event expected
		lastError  string
	}{
		{name: "one-shot completes", body: `{"source":"http://a/s","target":"http://b/t"}`,
			engine: func(context.Context, replicate.Params, replicate.Options) (replicate.Result, error) {
				return replicate.Result{Stats: replicate.Stats{DocsWritten: 7}, Body: []byte(`{"ok":true}`)}, nil
			},
			state: repjob.StateCompleted, eventState: repjob.StateCompleted},
		{name: "stop request hands it back", body: `{"source":"http://a/s","target":"http://b/t","continuous":true}`,
			engine: untilStopped, stop: true,
			state: repjob.StatePending, eventState: repjob.StatePending},
		{name: "engine error crashes", body: `{"source":"http://a/s","target":"http://b/t"}`,
			engine: func(context.Context, replicate.Params, replicate.Options) (replicate.Result, error) {
				return replicate.Result{}, fmt.Errorf("%w: could not open source", replicate.ErrDBNotFound)
			},
			state: repjob.StateCrashing, eventState: repjob.StateCrashing,
			lastError: "could not open source"},
		{name: "invalid parameters fail", body: `{"source":"http://a/s","target":"http://b/t"}`,
			engine: func(context.Context, replicate.Params, replicate.Options) (replicate.Result, error) {
				return replicate.Result{}, fmt.Errorf("%w: bad", replicate.ErrInvalidParams)
			},
			state: repjob.StateFailed, eventState: repjob.StateFailed,
			lastError: "bad"},
		{name: "a continuous run that ends crashes", body: `{"source":"http://a/s","target":"http://b/t","continuous":true}`,
			engine: func(context.Context, replicate.Params, replicate.Options) (replicate.Result, error) {
				return replicate.Result{}, nil
			},
			state: repjob.StateCrashing, eventState: repjob.StateCrashing,
			lastError: "ended unexpectedly"},
		{name: "a removed job exits writing nothing", body: `{"source":"http://a/s","target":"http://b/t","continuous":true}`,
			engine: untilStopped, remove: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			p := schedpolicy.DefaultPolicy()
			p.MinBackoff, p.MaxBackoff = time.Minute, time.Minute
			q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
			// A short activity timeout makes a removed job's actor notice at
			// its next progress write.
			store := repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: p, ActivityTimeout: 200 * time.Millisecond})
			added, err := store.AddTransient(ctx, []byte(tc.body), "alice")
			if err != nil {
				t.Fatal(err)
			}
			run, err := store.Accept(ctx, false)
			if err != nil {
				t.Fatal(err)
			}
			system := actor.NewActorSystem()
			defer system.Shutdown()
			events := make(chan *messages.ReplicationJobEvent, 100)
			sub := system.EventStream.Subscribe(func(e any) {
				if ev, ok := e.(*messages.ReplicationJobEvent); ok {
					events <- ev
				}
			})
			defer system.EventStream.Unsubscribe(sub)
			sup, err := supervisor.Start(ctx, system, "jobs_sup", supervisor.Spec{Strategy: supervisor.SimpleOneForOne,
				MaxRestarts: 10, Period: time.Second, Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sup.Stop(context.Background()) }()
			var released atomic.Int32
			exited := make(chan struct{})
			o := jobrunner.Options{Store: store, Node: "n1", ServerUUID: "u", Logger: zerolog.Nop(), Engine: tc.engine,
				Released: func() {
					if released.Add(1) == 1 {
						close(exited)
					}
				}}
			pid, err := supervisor.StartChild(ctx, system, sup.PID(), jobrunner.Name(added.JobID), jobrunner.Props(run, o))
			if err != nil {
				t.Fatal(err)
			}
			if tc.stop || tc.remove {
				if _, err := store.WaitState(ctx, added.JobID, repjob.StateRunning); err != nil {
					t.Fatal(err)
				}
				waitEvent(t, events, repjob.StateRunning)
			}
			if tc.stop {
				system.Root.Send(pid, &messages.StopReplicationJobRequest{JobId: added.JobID, Reason: "operator"})
			}
			if tc.remove {
				if err := store.Remove(ctx, added.JobID); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-exited:
			case <-ctx.Done():
				t.Fatal("the job actor did not exit")
			}
			if tc.remove {
				if _, err := store.Get(ctx, added.JobID); !errors.Is(err, repjob.ErrNotFound) {
					t.Fatalf("a removed job was written again: %v", err)
				}
			} else {
				rec, err := store.Get(ctx, added.JobID)
				if err != nil {
					t.Fatal(err)
				}
				if rec.State() != tc.state || (tc.lastError != "" && !strings.Contains(rec.LastError, tc.lastError)) {
					t.Fatalf("job ended %s (%q), want %s (%q)", rec.State(), rec.LastError, tc.state, tc.lastError)
				}
			}
			if tc.eventState != 0 {
				ev := waitEvent(t, events, tc.eventState)
				if ev.GetJobId() != added.JobID || ev.GetNode() != "n1" {
					t.Fatalf("event %v", ev)
				}
				if tc.stop && ev.GetReason() != "operator" {
					t.Fatalf("stop event reason %q, want operator", ev.GetReason())
				}
			}
			if n := released.Load(); n != 1 {
				t.Fatalf("slot released %d times", n)
			}
		})
	}
}

func waitEvent(t *testing.T, events <-chan *messages.ReplicationJobEvent, st repjob.State) *messages.ReplicationJobEvent {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ev := <-events:
			if repjob.State(ev.GetState()) == st && !ev.GetProgress() {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s event", st)
			return nil
		}
	}
}

// flakyDB fails every read-write transaction while fail is set.
type flakyDB struct {
	kv.Database
	fail atomic.Bool
}

var errFlaky = errors.New("flaky store: write refused")

func (d *flakyDB) Transact(ctx context.Context, fn func(kv.Tx) error) error {
	if d.fail.Load() {
		return errFlaky
	}
	return d.Database.Transact(ctx, fn)
}

// TestProgressRetriedAfterFailedWrite: a run under the node's lease writes
// only the engine's reports, and the engine reports only changes; when a
// report's write fails, the job actor writes it again by itself (after half
// the activity timeout), so the store does not keep stale stats until the
// next change.
func TestProgressRetriedAfterFailedWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sdb, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	db := &flakyDB{Database: sdb}
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
	store := repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy(), ActivityTimeout: 2 * time.Second})
	added, err := store.AddTransient(ctx, []byte(`{"source":"http://a/s","target":"http://b/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	leaseCtx, stopLease := context.WithCancel(ctx)
	defer stopLease()
	go store.KeepLease(leaseCtx)
	var run *repjob.Run
	for run == nil { // until the node's lease is open: a run accepted under it
		r, err := store.Accept(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		stop, leased := r.Watch(func() {}, func() {})
		stop()
		if leased {
			run = r
			break
		}
		if err := r.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // the lease is another goroutine's: poll
	}
	if err := run.Start(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	reported := make(chan struct{})
	engine := func(ectx context.Context, _ replicate.Params, o replicate.Options) (replicate.Result, error) {
		o.OnProgress(replicate.Stats{DocsWritten: 1})
		db.fail.Store(true)
		o.OnProgress(replicate.Stats{DocsWritten: 2}) // its write fails; no further report comes
		db.fail.Store(false)
		close(reported)
		<-ectx.Done()
		return replicate.Result{}, nil
	}
	system := actor.NewActorSystem()
	defer system.Shutdown()
	sup, err := supervisor.Start(ctx, system, "jobs_sup", supervisor.Spec{Strategy: supervisor.SimpleOneForOne,
		MaxRestarts: 10, Period: time.Second, Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sup.Stop(context.Background()) }()
	o := jobrunner.Options{Store: store, Node: "n1", ServerUUID: "u", Logger: zerolog.Nop(), Engine: engine}
	if _, err := supervisor.StartChild(ctx, system, sup.PID(), jobrunner.Name(added.JobID), jobrunner.Props(run, o)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reported:
	case <-ctx.Done():
		t.Fatal("the engine did not report")
	}
	for {
		rec, err := store.Get(ctx, added.JobID)
		if err == nil && rec.Stats.GetDocsWritten() == 2 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the failed report was not written again within a minute (stats %v, %v)", rec.GetStats(), err)
		}
		time.Sleep(20 * time.Millisecond) // the store: poll
	}
}
