package replicate

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// pipelineState is a runState with only what the pool and the batcher
// use: no endpoints.
func pipelineState(workers, batchSize int, continuous bool) *runState {
	p := Params{WorkerProcesses: workers, WorkerBatchSize: batchSize, Continuous: continuous}
	return &runState{r: &Replication{p: p}, tracker: newSeqTracker(nil)}
}

// startBatch registers a change-less batch ending at seq, as the batcher
// does.
func startBatch(s *runState, seq string) batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return batch{n: s.tracker.start(couch.Seq(seq)), seq: couch.Seq(seq)}
}

// blockingWork replaces a pool's batch processing: each batch reports on
// started, waits for release, then is marked done (or fails with fail).
type blockingWork struct {
	started chan uint64
	release chan struct{}
	fail    error
}

func newBlockingWork(p *workerPool) *blockingWork {
	bw := &blockingWork{started: make(chan uint64, 100), release: make(chan struct{})}
	p.do = func(w *worker, b batch) error {
		bw.started <- b.n
		select {
		case <-bw.release:
		case <-p.ctx.Done():
			return context.Cause(p.ctx)
		}
		if bw.fail != nil {
			return bw.fail
		}
		p.s.mu.Lock()
		p.s.tracker.finish(b.n)
		p.s.mu.Unlock()
		return nil
	}
	return bw
}

func (p *workerPool) counts() (running, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running, p.idle
}

// TestWorkerPoolStartsWorkersOnDemand: no worker runs before the first
// batch; a batch no idle worker can take starts one, up to
// worker_processes; further batches queue; every batch is done once, and
// close waits for the workers.
func TestWorkerPoolStartsWorkersOnDemand(t *testing.T) {
	tests := []struct {
		name       string
		workers    int
		batches    int
		continuous bool
	}{
		{"one-shot, 4 workers, 7 batches", 4, 7, false},
		{"continuous, 3 workers, 5 batches", 3, 5, true},
		{"one worker", 1, 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := pipelineState(tc.workers, 10, tc.continuous)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			p := newWorkerPool(ctx, s, func(err error) { t.Errorf("aborted: %v", err) })
			bw := newBlockingWork(p)
			if r, _ := p.counts(); r != 0 || p.batches != nil {
				t.Fatalf("%d workers and a queue before any batch", r)
			}
			for i := range tc.batches {
				if err := p.submit(startBatch(s, strconv.Itoa(i+1))); err != nil {
					t.Fatal(err)
				}
				if i < tc.workers {
					<-bw.started // a worker took it: the next batch finds no idle worker
				}
			}
			if r, _ := p.counts(); r != tc.workers {
				t.Fatalf("%d workers running with %d batches submitted, want %d", r, tc.batches, tc.workers)
			}
			select {
			case n := <-bw.started:
				t.Fatalf("batch %d started while %d workers were busy", n, tc.workers)
			default:
			}
			close(bw.release)
			p.close()
			if r, _ := p.counts(); r != 0 {
				t.Errorf("%d workers after close", r)
			}
			if got, want := string(s.through()), strconv.Itoa(tc.batches); got != want {
				t.Errorf("through %s after all batches, want %s", got, want)
			}
		})
	}
}

// TestWorkerPoolIdleWorkersExit: a continuous replication's worker exits
// when no batch comes for idleAfter, and the next batch starts one again.
func TestWorkerPoolIdleWorkersExit(t *testing.T) {
	s := pipelineState(4, 10, true)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	p := newWorkerPool(ctx, s, func(err error) { t.Errorf("aborted: %v", err) })
	if p.idleAfter != workerIdle {
		t.Fatalf("continuous pool idleAfter %s, want %s", p.idleAfter, workerIdle)
	}
	p.idleAfter = time.Millisecond
	exited := make(chan struct{}, 10)
	p.exited = func() { exited <- struct{}{} }
	bw := newBlockingWork(p)
	close(bw.release)
	for round := range 3 {
		seq := strconv.Itoa(round + 1)
		if err := p.submit(startBatch(s, seq)); err != nil {
			t.Fatal(err)
		}
		<-bw.started
		<-exited
		if r, i := p.counts(); r != 0 || i != 0 {
			t.Fatalf("round %d: %d running, %d idle after the worker exited", round, r, i)
		}
		if got := string(s.through()); got != seq {
			t.Fatalf("round %d: through %s, want %s", round, got, seq)
		}
	}
	p.close()
}

// TestWorkerPoolFailureAborts: a batch that fails aborts the run with its
// error; the other workers stop, and the failed batch is not done.
func TestWorkerPoolFailureAborts(t *testing.T) {
	s := pipelineState(2, 10, false)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	aborted := make(chan error, 2)
	p := newWorkerPool(ctx, s, func(err error) { aborted <- err; cancel(err) })
	bw := newBlockingWork(p)
	bw.fail = errors.New("boom")
	for i := range 2 {
		if err := p.submit(startBatch(s, strconv.Itoa(i+1))); err != nil {
			t.Fatal(err)
		}
		<-bw.started
	}
	close(bw.release)
	if err := <-aborted; !errors.Is(err, bw.fail) {
		t.Fatalf("aborted with %v, want %v", err, bw.fail)
	}
	p.close()
	if got := s.through(); got != nil {
		t.Errorf("through %s after failed batches", got)
	}
}

// TestBatcher: rows are cut into batches of worker_batch_size in feed
// order; a partial batch is flushed once the feed is quiet; a feed end is
// through as soon as the batches before it are done; a row without a seq
// takes the previous row's.
func TestBatcher(t *testing.T) {
	s := pipelineState(1, 3, true)
	got := make(chan batch, 10)
	bt := newBatcher(s, func(b batch) error { got <- b; return nil })
	defer bt.close()
	row := func(seq string) couch.Change {
		c := couch.Change{ID: "d" + seq, Revs: []string{"1-a"}}
		if seq != "" {
			c.Seq = couch.Seq(seq)
		}
		return c
	}
	for _, seq := range []string{"1", "2", "", "4"} {
		if err := bt.add(row(seq)); err != nil {
			t.Fatal(err)
		}
	}
	b := <-got
	if len(b.changes) != 3 || string(b.seq) != "2" || b.n != 0 {
		t.Fatalf("first batch: %d changes ending at %s (number %d), want 3 ending at 2 (the seq-less row takes the previous seq)", len(b.changes), b.seq, b.n)
	}
	b2 := <-got // "4" alone, flushed by the idle timer
	if len(b2.changes) != 1 || string(b2.seq) != "4" || b2.n != 1 {
		t.Fatalf("idle flush: %d changes ending at %s (number %d), want 1 ending at 4", len(b2.changes), b2.seq, b2.n)
	}
	if err := bt.end(couch.Seq("9"), true); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		t.Fatalf("a feed end with no rows pending submitted a batch of %d", len(b.changes))
	default:
	}
	if s.through() != nil {
		t.Fatalf("through %s before any batch was done", s.through())
	}
	for _, n := range []uint64{b2.n, b.n} {
		s.mu.Lock()
		s.tracker.finish(n)
		s.mu.Unlock()
	}
	if got := string(s.through()); got != "9" {
		t.Errorf("through %s once the batches before the feed end are done, want 9", got)
	}
}
