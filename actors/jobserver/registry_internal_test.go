package jobserver

import (
	"context"
	"testing"
	"time"
)

// TestWokenJobYieldsAWaitingAcceptLoop: a woken hibernated job that asks
// for a slot after the accept loop took the last one but before the loop
// began its wait in the queue still gets it: setAccepting ends that wait
// at once (it waited forever with the loop's slot the only one taken).
// The other order (the wait begun first) yields in acquireFor.
func TestWokenJobYieldsAWaitingAcceptLoop(t *testing.T) {
	for _, waitFirst := range []bool{false, true} {
		r := NewRegistry()
		maxJobs := func() int { return 1 }
		ctx := t.Context()
		release, err := r.acquire(ctx, maxJobs) // the accept loop's slot
		if err != nil {
			t.Fatal(err)
		}
		actx, yield := context.WithCancel(ctx)
		defer yield()
		if waitFirst {
			r.setAccepting(yield)
		}
		got := make(chan error, 1)
		go func() {
			rel, err := r.acquireFor(ctx, maxJobs, true)
			if err == nil {
				rel()
			}
			got <- err
		}()
		deadline := time.Now().Add(30 * time.Second)
		for !waitFirst {
			r.mu.Lock()
			w := r.woken
			r.mu.Unlock()
			if w == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the woken job never asked for a slot")
			}
			time.Sleep(time.Millisecond)
		}
		if !waitFirst {
			r.setAccepting(yield)
		}
		select {
		case <-actx.Done(): // the loop's wait ends; it gives its slot back
		case <-time.After(30 * time.Second):
			t.Fatalf("waitFirst %v: the accept loop's wait was not ended for the woken job", waitFirst)
		}
		r.setAccepting(nil)
		release()
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("waitFirst %v: the woken job never got the slot", waitFirst)
		}
	}
}
