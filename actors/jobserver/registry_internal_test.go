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

// TestActorExitChannelDropped: once an entry's actor has exited, the entry
// keeps the shared closed channel, not one of its own (a hibernated job's
// entry holds no channel for its exited actor); a later incarnation gets a
// channel of its own again, and a stale exit leaves it alone.
func TestActorExitChannelDropped(t *testing.T) {
	r := NewRegistry()
	e, exitedFn := r.add("job", 1, true, nil, nil)
	own := e.actorExit
	e.mu.Lock()
	e.state = asleep // hibernated: the exit leaves the entry in place
	e.mu.Unlock()
	exitedFn()
	select {
	case <-own:
	default:
		t.Fatal("the actor's exit channel was not closed")
	}
	r.mu.Lock()
	got := e.actorExit
	r.mu.Unlock()
	if got != exited {
		t.Fatal("the entry kept its own closed exit channel")
	}
	if r.lookup("job") != e {
		t.Fatal("a hibernated job's entry left the registry at its actor's exit")
	}
	// The next incarnation (a wake-up) has a channel of its own.
	r.mu.Lock()
	e.inc++
	next := make(chan struct{})
	e.actorExit = next
	r.mu.Unlock()
	r.exitSeen(e, own) // a stale exit
	r.mu.Lock()
	got = e.actorExit
	r.mu.Unlock()
	if got != next {
		t.Fatal("a stale exit replaced the current incarnation's channel")
	}
}
