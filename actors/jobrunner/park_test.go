package jobrunner_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/dbupdates"
	"github.com/couchrep/couchrep/internal/jobqueue"
	"github.com/couchrep/couchrep/internal/kv/sqlite"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/repjob"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/internal/schedpolicy"
	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// fakeWake is a wake-up source the test signals.
type fakeWake struct {
	c      chan struct{}
	mu     sync.Mutex
	err    error
	closed atomic.Int32
	notify atomic.Pointer[func()] // notifyingWake's OnSignal
}

// notifyingWake is a fakeWake that is also a park.Notifier (as
// dbupdates.Watch): the parked job holds no goroutine for it.
type notifyingWake struct{ *fakeWake }

func (w notifyingWake) OnSignal(f func()) {
	if f == nil {
		w.notify.Store(nil)
		return
	}
	w.notify.Store(&f)
}

// wakeVariants run a test with each kind of wake-up source.
var wakeVariants = []struct {
	name string
	wrap func(*fakeWake) park.Wake
}{
	{"relayed", func(w *fakeWake) park.Wake { return w }},
	{"notifier", func(w *fakeWake) park.Wake { return notifyingWake{w} }},
}

func newFakeWake() *fakeWake { return &fakeWake{c: make(chan struct{}, 1)} }

func (w *fakeWake) C() <-chan struct{} { return w.c }
func (w *fakeWake) Close()             { w.closed.Add(1) }
func (w *fakeWake) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
func (w *fakeWake) signal() {
	if f := w.notify.Load(); f != nil {
		(*f)()
	}
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// parkRig is one continuous job actor whose fake engine parks each run as
// soon as it starts (unless told otherwise) and reports how it was called.
type parkRig struct {
	t      *testing.T
	ctx    context.Context
	store  *repjob.Store
	jobID  string
	system *actor.ActorSystem
	pid    *actor.PID
	exited chan struct{}
	events chan *messages.ReplicationJobEvent

	// runs receives the Options.Park of each engine run.
	runs chan bool
	// moved answers the parked runs' Moved; probes counts its calls.
	moved  atomic.Bool
	probes atomic.Int32
	// resume makes the next parked run ask to resume at once.
	resume atomic.Bool
	// block makes engine runs wait for their context instead of parking;
	// so does blockFrom for the runs from that one on (1 is the first).
	block     atomic.Bool
	blockFrom atomic.Int32
	// quiet, when set (unix nanoseconds), makes each parked run a quiet
	// one as of then (replicate.Parked.Quiet).
	quiet atomic.Int64
}

func newParkRig(t *testing.T, wake func(context.Context, replicate.Params, replicate.Options) (park.Wake, error), recheck ...time.Duration) *parkRig {
	t.Helper()
	return newParkRigWith(t, wake, nil, recheck...)
}

// newParkRigWith is newParkRig with setup called before the job actor
// starts (the engine's switches set before its first run).
func newParkRigWith(t *testing.T, wake func(context.Context, replicate.Params, replicate.Options) (park.Wake, error),
	setup func(*parkRig), recheck ...time.Duration) *parkRig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "s.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	q := jobqueue.New(db, jobqueue.Options{NodeName: "n1"})
	store := repjob.New(q, db, repjob.Options{ServerUUID: "u", Policy: schedpolicy.DefaultPolicy(), ActivityTimeout: 10 * time.Second})
	added, err := store.AddTransient(ctx, []byte(`{"source":"http://a/s","target":"http://b/t","continuous":true}`), "alice")
	if err != nil {
		t.Fatal(err)
	}
	run, err := store.Accept(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	r := &parkRig{t: t, ctx: ctx, store: store, jobID: added.JobID, exited: make(chan struct{}),
		events: make(chan *messages.ReplicationJobEvent, 100), runs: make(chan bool, 100)}
	r.system = actor.NewActorSystem()
	t.Cleanup(r.system.Shutdown)
	sub := r.system.EventStream.Subscribe(func(e any) {
		if ev, ok := e.(*messages.ReplicationJobEvent); ok {
			select {
			case r.events <- ev:
			default:
			}
		}
	})
	t.Cleanup(func() { r.system.EventStream.Unsubscribe(sub) })
	sup, err := supervisor.Start(ctx, r.system, "jobs_sup", supervisor.Spec{Strategy: supervisor.SimpleOneForOne,
		MaxRestarts: 10, Period: time.Second, Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	defaults := replicate.DefaultParams()
	defaults.IdleParkAfter, defaults.ParkRecheck = time.Second, time.Hour
	if len(recheck) > 0 {
		defaults.ParkRecheck = recheck[0]
	}
	var docs atomic.Int64
	engine := func(ectx context.Context, _ replicate.Params, o replicate.Options) (replicate.Result, error) {
		r.runs <- o.Park
		n := docs.Add(1)
		st := replicate.Stats{DocsWritten: n}
		o.OnProgress(st)
		if from := int64(r.blockFrom.Load()); !o.Park || r.block.Load() || from > 0 && n >= from {
			<-ectx.Done()
			return replicate.Result{Stats: st}, nil
		}
		pk := replicate.NewParked(couch.Seq("1"), time.Now(), func(context.Context) (bool, error) {
			r.probes.Add(1)
			return r.moved.Load(), nil
		})
		pk.Resume = r.resume.Swap(false)
		if q := r.quiet.Load(); q != 0 {
			pk.MarkQuiet(time.Unix(0, q))
		}
		return replicate.Result{Stats: st, Parked: pk}, nil
	}
	if setup != nil {
		setup(r)
	}
	o := jobrunner.Options{Store: store, Node: "n1", ServerUUID: "u", Logger: zerolog.Nop(), Engine: engine,
		JobDefaults: defaults, Wake: wake, Rechecks: park.NewRechecks(1000),
		Released: func() { close(r.exited) }}
	if r.pid, err = supervisor.StartChild(ctx, r.system, sup.PID(), jobrunner.Name(added.JobID), jobrunner.Props(run, o)); err != nil {
		t.Fatal(err)
	}
	return r
}

// run waits for the next engine run and returns its Options.Park.
func (r *parkRig) run() bool {
	r.t.Helper()
	select {
	case p := <-r.runs:
		return p
	case <-r.ctx.Done():
		r.t.Fatal("no engine run")
		return false
	}
}

// noRun checks that no engine run started (so far).
func (r *parkRig) noRun() {
	r.t.Helper()
	select {
	case p := <-r.runs:
		r.t.Fatalf("an engine run started (park %v)", p)
	default:
	}
}

// record polls the store until cond holds for the job's record.
func (r *parkRig) record(what string, cond func(*repjob.Record) bool) *repjob.Record {
	r.t.Helper()
	for {
		rec, err := r.store.Get(r.ctx, r.jobID)
		if err == nil && cond(rec) {
			return rec
		}
		if r.ctx.Err() != nil {
			r.t.Fatalf("the job's record is not %s: %v, %v", what, rec, err)
		}
		time.Sleep(5 * time.Millisecond) // the store: poll
	}
}

func (r *parkRig) parked() *repjob.Record {
	r.t.Helper()
	return r.record("running and parked", func(rec *repjob.Record) bool {
		return rec.State() == repjob.StateRunning && rec.GetParkedSince() != nil
	})
}

func (r *parkRig) unparked() *repjob.Record {
	r.t.Helper()
	return r.record("running and not parked", func(rec *repjob.Record) bool {
		return rec.State() == repjob.StateRunning && rec.GetParkedSince() == nil
	})
}

func (r *parkRig) stop() *repjob.Record {
	r.t.Helper()
	r.system.Root.Send(r.pid, &messages.StopReplicationJobRequest{JobId: r.jobID, Reason: "operator"})
	select {
	case <-r.exited:
	case <-r.ctx.Done():
		r.t.Fatal("the job actor did not exit")
	}
	rec, err := r.store.Get(r.ctx, r.jobID)
	if err != nil {
		r.t.Fatal(err)
	}
	if rec.State() != repjob.StatePending || rec.GetParkedSince() != nil {
		r.t.Fatalf("stopped job: %s, parked since %v", rec.State(), rec.GetParkedSince())
	}
	return rec
}

// TestParkWakeResumes: a parked job is running and parked in the store; a
// wake-up whose source did not move keeps it parked, one whose source moved
// starts a new engine run (stats carried on) and the record says it
// resumed; a stop of the parked job ends it as a stop of a running one.
func TestParkWakeResumes(t *testing.T) {
	for _, v := range wakeVariants {
		t.Run(v.name, func(t *testing.T) {
			w := newFakeWake()
			r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return v.wrap(w), nil })
			if !r.run() {
				t.Fatal("the first run may not park")
			}
			rec := r.parked()
			if rec.GetStats().GetDocsWritten() != 1 {
				t.Errorf("parked with stats %v", rec.GetStats())
			}
			if v.name == "notifier" {
				// Asleep on a source that calls it: no goroutine of the job.
				awaitNoGoroutine(t, "actors/jobrunner.")
			}
			w.signal()
			for r.probes.Load() < 1 {
				time.Sleep(time.Millisecond) // the probe is the actor's goroutine's: poll
			}
			if v.name == "notifier" {
				// Its wake-up source was opened before its first run (a
				// change since signals it): it parked without a look, and
				// looked once for the signal.
				awaitNoGoroutine(t, "actors/jobrunner.")
				if n := r.probes.Load(); n != 1 {
					t.Errorf("%d looks at the source, want 1 (the signal's)", n)
				}
			}
			r.noRun()
			r.moved.Store(true)
			r.block.Store(true)
			w.signal()
			if !r.run() {
				t.Fatal("a resumed run may not park")
			}
			r.unparked()
			rec = r.stop()
			if rec.GetStats().GetDocsWritten() != 2 {
				t.Errorf("stopped with stats %v, want docs_written 2", rec.GetStats())
			}
			if w.closed.Load() == 0 {
				t.Error("the wake-up source was not closed")
			}
		})
	}
}

// TestParkQuietLooksOnce: a run that parked as soon as it found nothing
// to replicate (replicate.Parked.Quiet) knew it from a read of its source;
// when that read is older than the job's wake-up source (a change between
// the two would signal nothing), the job looks at its source once as it
// parks; when it is newer, it sleeps without a look.
func TestParkQuietLooksOnce(t *testing.T) {
	for _, c := range []struct {
		name  string
		at    time.Time
		looks int32
	}{
		{"read before the wake-up source opened", time.Unix(1, 0), 1},
		{"read after it", time.Now().Add(time.Hour), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newFakeWake()
			r := newParkRigWith(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) {
				return notifyingWake{w}, nil
			}, func(r *parkRig) { r.quiet.Store(c.at.UnixNano()) })
			if !r.run() {
				t.Fatal("the first run may not park")
			}
			r.parked()
			for r.probes.Load() < c.looks {
				if r.ctx.Err() != nil {
					t.Fatalf("%d looks at the source, want %d", r.probes.Load(), c.looks)
				}
				time.Sleep(time.Millisecond) // the look is the actor's goroutine's: poll
			}
			// Asleep: no goroutine of the job, so no look under way.
			awaitNoGoroutine(t, "actors/jobrunner.")
			if n := r.probes.Load(); n != c.looks {
				t.Errorf("%d looks at the source, want %d", n, c.looks)
			}
			r.noRun()
		})
	}
}

// awaitNoGoroutine waits until no goroutine runs a function whose name
// contains frame (the goroutine profile: other goroutines' state, polled).
func awaitNoGoroutine(t *testing.T, frame string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var b strings.Builder
		if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), frame) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a goroutine in %s stays while the job is parked:\n%s", frame, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestParkStopWhileParked: a stop request to a parked job ends it at once,
// as for a running one: back to the queue, stats kept, no engine run.
func TestParkStopWhileParked(t *testing.T) {
	for _, v := range wakeVariants {
		t.Run(v.name, func(t *testing.T) {
			w := newFakeWake()
			r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return v.wrap(w), nil })
			r.run()
			r.parked()
			rec := r.stop()
			if rec.GetStats().GetDocsWritten() != 1 {
				t.Errorf("stopped with stats %v", rec.GetStats())
			}
			r.noRun()
			waitEvent(t, r.events, repjob.StatePending)
		})
	}
}

// TestParkSafetyNet: with no wake-up at all (a lost event), the recheck
// (park_recheck, jittered) looks at the source again and again, and
// resumes the job once it moved.
func TestParkSafetyNet(t *testing.T) {
	for _, v := range wakeVariants {
		t.Run(v.name, func(t *testing.T) {
			w := newFakeWake() // never signalled
			r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return v.wrap(w), nil },
				20*time.Millisecond)
			r.run()
			r.parked()
			for r.probes.Load() < 3 {
				time.Sleep(time.Millisecond) // the rechecks are the actor's goroutine's: poll
			}
			r.noRun()
			r.block.Store(true)
			r.moved.Store(true)
			r.run()
			r.unparked()
			r.stop()
		})
	}
}

// TestParkFallbacks: a source that cannot wake the job (ErrUnsupported, or
// none) leaves the job's runs unparked; a wake-up source that stops working
// while parked resumes the job with parking off; a change that came in as
// the run parked resumes it at once, without a probe.
func TestParkFallbacks(t *testing.T) {
	t.Run("unsupported", func(t *testing.T) {
		r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) {
			return nil, fmt.Errorf("%w: 400 bad_request", dbupdates.ErrUnsupported)
		})
		if r.run() {
			t.Fatal("a job whose server has no _db_updates may park")
		}
		r.stop()
	})
	t.Run("no source", func(t *testing.T) {
		r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return nil, nil })
		if r.run() {
			t.Fatal("a job without a wake-up source may park")
		}
		r.stop()
	})
	t.Run("transient error", func(t *testing.T) {
		var calls atomic.Int32
		w := newFakeWake()
		r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) {
			if calls.Add(1) == 1 {
				return nil, errors.New("connection refused")
			}
			return w, nil
		})
		if !r.run() {
			t.Fatal("a transient failure turned parking off")
		}
		r.parked() // the source opened at the park
		r.stop()
	})
	t.Run("source fails while parked", func(t *testing.T) {
		w := newFakeWake()
		r := newParkRig(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return w, nil })
		r.run()
		r.parked()
		w.mu.Lock()
		w.err = dbupdates.ErrUnsupported
		w.mu.Unlock()
		w.signal()
		if r.run() {
			t.Fatal("parking stayed on after the wake-up source failed")
		}
		r.unparked()
		r.stop()
	})
	t.Run("resume at once", func(t *testing.T) {
		w := newFakeWake()
		r := newParkRigWith(t, func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return w, nil },
			func(r *parkRig) {
				r.resume.Store(true)
				r.blockFrom.Store(2)
			})
		r.run()
		if !r.run() {
			t.Fatal("the resumed run may not park")
		}
		if n := r.probes.Load(); n != 0 {
			t.Errorf("%d probes before resuming at once", n)
		}
		r.stop()
	})
}
