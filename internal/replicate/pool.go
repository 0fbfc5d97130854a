package replicate

import (
	"context"
	"sync"
	"time"
)

// workerIdle is how long a worker of a continuous replication waits for a
// batch before it exits; the next batch starts a worker again. An idle
// continuous job so holds no worker goroutines.
const workerIdle = 5 * time.Second

// workerPool runs batches on at most worker_processes workers. Workers are
// started by the batches, not ahead of them: a batch that no idle worker
// can take starts one (up to the limit). With idleAfter set (continuous
// replications), a worker exits when no batch came for that long. A worker
// marks its batches done in the seq tracker itself; a failing batch aborts
// the run.
type workerPool struct {
	s         *runState
	ctx       context.Context // the run's pipeline context
	abort     func(error)
	max       int
	idleAfter time.Duration // 0: workers stay until close
	// do processes one batch (runBatch; tests replace it).
	do func(w *worker, b batch) error
	// exited, if set, is called when a worker exits (tests).
	exited  func()
	batches chan batch // made by the first batch; workers start after

	mu      sync.Mutex
	running int // workers started and not exited
	idle    int // workers waiting for a batch
	wg      sync.WaitGroup
}

func newWorkerPool(ctx context.Context, s *runState, abort func(error)) *workerPool {
	p := &workerPool{s: s, ctx: ctx, abort: abort, max: s.r.p.WorkerProcesses}
	p.do = p.runBatch
	if s.r.p.Continuous {
		p.idleAfter = workerIdle
	}
	return p
}

// submit hands b to a worker, starting one when every running worker is
// busy (and the limit allows); it blocks while the queue is full, until the
// pipeline context is done.
func (p *workerPool) submit(b batch) error {
	p.mu.Lock()
	if p.batches == nil {
		p.batches = make(chan batch, p.max)
	}
	if p.running < p.max && len(p.batches) >= p.idle {
		p.running++
		p.wg.Add(1)
		go p.work()
	}
	// A queued batch always has a worker: workers exit only while the queue
	// is empty, checked under mu.
	select {
	case p.batches <- b:
		p.mu.Unlock()
		return nil
	default:
	}
	p.mu.Unlock()
	select {
	case p.batches <- b:
		return nil
	case <-p.ctx.Done():
		return context.Cause(p.ctx)
	}
}

// close ends the workers once they have drained the queue (or the pipeline
// context is done) and waits for them. Nothing may be submitted afterwards.
func (p *workerPool) close() {
	p.mu.Lock()
	if p.batches != nil {
		close(p.batches)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *workerPool) work() {
	defer p.wg.Done()
	if p.exited != nil {
		defer p.exited()
	}
	w := &worker{r: p.s.r}
	// A failed write in flight has aborted the run already.
	defer func() { _ = w.settle() }()
	var idle *time.Timer
	var idleC <-chan time.Time
	if p.idleAfter > 0 {
		idle = time.NewTimer(p.idleAfter)
		defer idle.Stop()
		idleC = idle.C
	}
	exit := func() {
		p.mu.Lock()
		p.idle--
		p.running--
		p.mu.Unlock()
	}
	for {
		p.mu.Lock()
		p.idle++
		p.mu.Unlock()
		if idle != nil {
			idle.Reset(p.idleAfter)
		}
		select {
		case b, ok := <-p.batches:
			if !ok {
				exit()
				return
			}
			p.mu.Lock()
			p.idle--
			p.mu.Unlock()
			if err := p.do(w, b); err != nil {
				p.mu.Lock()
				p.running--
				p.mu.Unlock()
				if p.ctx.Err() == nil {
					p.abort(err)
				}
				return
			}
		case <-idleC:
			p.mu.Lock()
			if len(p.batches) > 0 {
				p.idle--
				p.mu.Unlock()
				continue
			}
			p.idle--
			p.running--
			p.mu.Unlock()
			return
		case <-p.ctx.Done():
			exit()
			return
		}
	}
}

// runBatch processes one batch; its last write goes on while the worker
// takes the next batch, and marks the batch done when it succeeds.
func (p *workerPool) runBatch(w *worker, b batch) error {
	if len(b.changes) > 0 {
		if err := w.process(p.ctx, b.changes); err != nil {
			return err
		}
	}
	return w.flushAsync(p.ctx, func(err error) {
		switch {
		case err != nil:
			if p.ctx.Err() == nil {
				p.abort(err)
			}
		case p.ctx.Err() != nil:
			// Cancelled mid-batch: the batch may be incomplete.
		default:
			s := p.s
			s.mu.Lock()
			s.tracker.finish(b.n)
			s.mu.Unlock()
		}
	})
}
