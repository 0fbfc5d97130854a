package actors

import (
	"context"
	"time"
)

// Task is an actor's background goroutine. Actors never block in Receive:
// their I/O runs in a Task started from Receive (usually on *actor.Started),
// under a context that Stop cancels (usually on *actor.Stopping), and Stop
// waits for it so that the goroutine never outlives its actor's incarnation.
// A Task is used from Receive only, so it needs no locking.
type Task struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Go runs fn in a new goroutine under a fresh context. A Task runs one
// goroutine at a time: Go on a running Task stops the old one first.
func (t *Task) Go(fn func(ctx context.Context)) {
	t.Stop(0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.cancel, t.done = cancel, done
	go func() {
		defer close(done)
		fn(ctx)
	}()
}

// Running reports whether the task was started and not stopped.
func (t *Task) Running() bool { return t.cancel != nil }

// Cancel cancels the task's context without waiting: the goroutine returns
// on its own, after the actor may have stopped.
func (t *Task) Cancel() {
	if t.cancel != nil {
		t.cancel()
		t.cancel, t.done = nil, nil
	}
}

// Stop cancels the task's context and waits for its goroutine to return, at
// most timeout (zero or less: without bound). It reports whether the
// goroutine returned; a Task never started stops at once.
func (t *Task) Stop(timeout time.Duration) bool {
	if t.cancel == nil {
		return true
	}
	t.cancel()
	done := t.done
	t.cancel, t.done = nil, nil
	if timeout <= 0 {
		<-done
		return true
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}
