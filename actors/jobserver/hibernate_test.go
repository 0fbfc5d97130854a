package jobserver_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/couchrep/couchrep/actors/jobrunner"
	"github.com/couchrep/couchrep/actors/scheduler"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/park"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/messages"
)

// testWake is a wake-up source (a park.Notifier) whose Moved the test sets.
type testWake struct {
	c      chan struct{}
	moved  atomic.Bool
	mu     sync.Mutex
	notify func()
	closed atomic.Int32
	looks  atomic.Int32
}

func (w *testWake) C() <-chan struct{}   { return w.c }
func (w *testWake) Close()               { w.closed.Add(1) }
func (w *testWake) Moved(couch.Seq) bool { w.looks.Add(1); return w.moved.Load() }
func (w *testWake) lookedAt() int32      { return w.looks.Load() }
func (w *testWake) OnSignal(f func())    { w.mu.Lock(); w.notify = f; w.mu.Unlock() }
func (w *testWake) signal() {
	w.mu.Lock()
	f := w.notify
	w.mu.Unlock()
	select {
	case w.c <- struct{}{}:
	default:
	}
	if f != nil {
		f()
	}
}

var _ park.Notifier = (*testWake)(nil)

// TestHibernation: parked jobs leave the actor system and their max_jobs
// slot (a node with max_jobs 1 runs three, all parked, no actor); a
// wake-up whose source moved starts an actor that runs again and takes the
// slot; a second one waits for it (the scheduler hears it counted as
// pending) and runs once the first is stopped; a drain ends hibernated and
// running jobs alike, and a look that finds nothing puts a job back to
// sleep.
func TestHibernation(t *testing.T) {
	s := newShared(t)
	var mu sync.Mutex
	wakes := map[string]*testWake{}
	runs := map[string]int{}
	s.jobOptions = func(o *jobrunner.Options) {
		o.Wake = func(_ context.Context, p replicate.Params, _ replicate.Options) (park.Wake, error) {
			mu.Lock()
			defer mu.Unlock()
			w := &testWake{c: make(chan struct{}, 1)}
			wakes[p.Source.URL] = w
			return w, nil
		}
		o.Engine = func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
			mu.Lock()
			runs[p.Source.URL]++
			first := runs[p.Source.URL] == 1
			mu.Unlock()
			if !first {
				<-ctx.Done() // woken: it runs until stopped
				return replicate.Result{}, nil
			}
			// The first run parks at once, checkpointed at seq 1.
			return replicate.Result{Stats: replicate.Stats{CheckpointedSourceSeq: couch.Seq(`1`)},
				Parked: replicate.NewParked(couch.Seq(`1`), time.Now(), func(context.Context) (bool, error) { return false, nil })}, nil
		}
	}
	s.lease = true // hibernated jobs are held under the node's lease
	n := s.startNode(t, "n1", true, 1)
	// A job that hibernates says so with a progress event without stats
	// (the node's live view of its stats drops them: httpapi.ObserveLive).
	var slept sync.Map
	sub := n.system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*messages.ReplicationJobEvent); ok && e.GetProgress() && e.GetStats() == nil {
			slept.Store(e.GetJobId(), true)
		}
	})
	defer n.system.EventStream.Unsubscribe(sub)

	ids := []string{s.add(t, n, 0), s.add(t, n, 1), s.add(t, n, 2)}
	waitFor(t, "three jobs hibernated", func() bool { return n.reg.Hibernated() == 3 })
	for _, id := range ids {
		waitFor(t, "the hibernation's event of "+id, func() bool { _, ok := slept.Load(id); return ok })
	}
	if got := n.reg.Running(); got > 1 {
		t.Errorf("%d slots taken with every job parked", got)
	}
	if got := s.runningOn(t, "n1"); len(got) != 3 {
		t.Errorf("running on n1 in the store: %v, want the three", got)
	}

	wake := func(i int) *testWake {
		mu.Lock()
		defer mu.Unlock()
		return wakes["http://a/s"+string(rune('0'+i))+"/"]
	}
	for i := range 3 {
		if wake(i) == nil {
			t.Fatalf("no wake-up source for job %d: %v", i, wakes)
		}
	}
	// A look that finds nothing: back to sleep, no run.
	wake(0).signal()
	waitFor(t, "job 0 looked", func() bool { return wake(0).lookedAt() > 0 })
	waitFor(t, "job 0 asleep again", func() bool { return n.reg.Hibernated() == 3 })
	mu.Lock()
	if runs["http://a/s0/"] != 1 {
		t.Errorf("job 0 ran %d times after a look that found nothing", runs["http://a/s0/"])
	}
	mu.Unlock()

	// Job 0's source moved: it runs, in the one slot.
	wake(0).moved.Store(true)
	wake(0).signal()
	waitFor(t, "job 0 running again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs["http://a/s0/"] == 2
	})
	// Job 1's too: it waits for the slot, counted as pending.
	wake(1).moved.Store(true)
	wake(1).signal()
	deadline := time.After(30 * time.Second)
	for waiting := false; !waiting; {
		select {
		case m := <-n.sched:
			if w, ok := m.(*scheduler.WokenWaiting); ok && w.N == 1 {
				waiting = true
			}
		case <-deadline:
			t.Fatal("the scheduler never heard of a woken job waiting for a slot")
		}
	}
	mu.Lock()
	if runs["http://a/s1/"] != 1 {
		t.Errorf("job 1 ran with the slot taken (runs %d)", runs["http://a/s1/"])
	}
	mu.Unlock()
	mustAsk[*messages.StopJobResponse](t, n, &messages.StopJobRequest{Id: ids[0]})
	waitFor(t, "job 1 running once job 0 stopped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return runs["http://a/s1/"] == 2
	})

	// Drain: the running job and the hibernated one both end.
	r := mustAsk[*messages.DrainResponse](t, n, &messages.DrainRequest{})
	if r.GetReleased() < 2 {
		t.Errorf("drain released %d jobs (%v), want job 1 and job 2 at least", r.GetReleased(), r.GetJobIds())
	}
	waitFor(t, "nothing left on n1", func() bool {
		return len(s.runningOn(t, "n1")) == 0 && n.reg.Hibernated() == 0 && len(n.reg.Jobs()) == 0
	})
	if c := wake(2).closed.Load(); c == 0 {
		t.Error("the drained hibernated job's wake-up source was not closed")
	}
}

// lookWake is a wake-up source parked on a server's _db_updates (as a
// *dbupdates.Watch): its job's recheck reads the server's update_seq of db
// without an actor (park.Rechecks.Look through Server).
type lookWake struct {
	c      chan struct{}
	srv    *seqServer
	mu     sync.Mutex
	notify func()
}

func (w *lookWake) C() <-chan struct{} { return w.c }
func (w *lookWake) Close()             {}
func (w *lookWake) OnSignal(f func())  { w.mu.Lock(); w.notify = f; w.mu.Unlock() }

func (w *lookWake) Server() park.Server { return w.srv }
func (w *lookWake) DB() string          { return "db" }

// seqServer answers every database's info with its update_seq, and counts
// the reads.
type seqServer struct {
	seq   atomic.Value // string
	reads atomic.Int32
}

func (s *seqServer) Key() string { return "k" }
func (s *seqServer) DBsInfo(ctx context.Context, dbs []string) ([]couch.DBsInfoResult, error) {
	out := make([]couch.DBsInfoResult, len(dbs))
	for i := range dbs {
		info, err := s.InfoOf(ctx, dbs[i])
		out[i] = couch.DBsInfoResult{Info: info, Err: err}
	}
	return out, nil
}
func (s *seqServer) InfoOf(context.Context, string) (couch.DBInfo, error) {
	s.reads.Add(1)
	return couch.DBInfo{UpdateSeq: couch.Seq(s.seq.Load().(string)), InstanceStartTime: "0"}, nil
}

// TestHibernatedRecheckWithoutActor: a hibernated job parked on its
// server's _db_updates rechecks (park_recheck 1 s) by reading its source's
// update_seq through the node's batcher, without an actor: while it stays
// at the parked seq the job sleeps on (its recheck armed again, no run);
// once it moved, the job wakes and runs.
func TestHibernatedRecheckWithoutActor(t *testing.T) {
	s := newShared(t)
	s.parkRecheck = time.Second
	srv := &seqServer{}
	srv.seq.Store(`"1-abc"`)
	var runs atomic.Int32
	s.jobOptions = func(o *jobrunner.Options) {
		o.Wake = func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) {
			return &lookWake{c: make(chan struct{}, 1), srv: srv}, nil
		}
		o.Engine = func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
			if runs.Add(1) > 1 {
				<-ctx.Done() // woken: it runs until stopped
				return replicate.Result{}, nil
			}
			return replicate.Result{Stats: replicate.Stats{CheckpointedSourceSeq: couch.Seq(`"1-abc"`)},
				Parked: replicate.NewParked(couch.Seq(`"1-abc"`), time.Now(), func(context.Context) (bool, error) { return false, nil })}, nil
		}
	}
	s.lease = true
	n := s.startNode(t, "n1", true, 1)
	s.add(t, n, 0)
	waitFor(t, "the job hibernated", func() bool { return n.reg.Hibernated() == 1 })
	waitFor(t, "two rechecks", func() bool { return srv.reads.Load() >= 2 })
	if got := runs.Load(); got != 1 || n.reg.Hibernated() != 1 {
		t.Fatalf("after %d rechecks that found nothing: %d runs, %d hibernated; want 1 and 1", srv.reads.Load(), got, n.reg.Hibernated())
	}
	srv.seq.Store(`"2-def"`)
	waitFor(t, "the job woken and running", func() bool { return runs.Load() == 2 })
}

// TestHibernatedRecheckAnsweredByItsWatch: a hibernated job whose wake-up
// source answers for its source (a shared feed's watch: Moved, from the
// rows the node's feed read) rechecks (park_recheck 1 s) without an actor
// — no JobStarted, so not paced at the node's 5 requests a second either
// (100,000 parked selector jobs at 1800 s ask ~56 rechecks a second) —
// while Moved says no; once it says yes, the recheck wakes the job and it
// runs.
func TestHibernatedRecheckAnsweredByItsWatch(t *testing.T) {
	s := newShared(t)
	s.parkRecheck = time.Second
	w := &testWake{c: make(chan struct{}, 1)}
	var runs atomic.Int32
	s.jobOptions = func(o *jobrunner.Options) {
		o.Wake = func(context.Context, replicate.Params, replicate.Options) (park.Wake, error) { return w, nil }
		o.Engine = func(ctx context.Context, p replicate.Params, o replicate.Options) (replicate.Result, error) {
			if runs.Add(1) > 1 {
				<-ctx.Done() // woken: it runs until stopped
				return replicate.Result{}, nil
			}
			return replicate.Result{Stats: replicate.Stats{CheckpointedSourceSeq: couch.Seq(`1`)},
				Parked: replicate.NewParked(couch.Seq(`1`), time.Now(), func(context.Context) (bool, error) { return false, nil })}, nil
		}
	}
	s.lease = true
	n := s.startNode(t, "n1", true, 1)
	s.add(t, n, 0)
	waitFor(t, "the job hibernated", func() bool { return n.reg.Hibernated() == 1 })
	// The first actor's start (and its exit once it hibernated).
	waitFor(t, "the first actor's start", func() bool {
		select {
		case m := <-n.sched:
			_, ok := m.(*scheduler.JobStarted)
			return ok
		default:
			return false
		}
	})
	waitFor(t, "three rechecks", func() bool { return w.lookedAt() >= 3 })
	for len(n.sched) > 0 {
		if m := <-n.sched; m != nil {
			if _, ok := m.(*scheduler.JobStarted); ok {
				t.Fatalf("an actor started for a recheck its watch answers (%d rechecks, %d runs)", w.lookedAt(), runs.Load())
			}
		}
	}
	if got := runs.Load(); got != 1 || n.reg.Hibernated() != 1 {
		t.Fatalf("after %d rechecks that found nothing: %d runs, %d hibernated; want 1 and 1", w.lookedAt(), got, n.reg.Hibernated())
	}
	w.moved.Store(true)
	waitFor(t, "the job woken by a recheck and running", func() bool { return runs.Load() == 2 })
}
