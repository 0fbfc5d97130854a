package actors

import (
	"context"
	"fmt"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// Home follows the incarnations of one actor (keyed by actor system and
// actor id, like Local), so that Go callers can tell whether one is running
// and wait for the next: an actor Publishes an Incarnation when it starts
// and Ends it when it stops. Homes are created on first use and kept for the
// life of the process (one small record per actor).
type Home struct {
	mu   sync.Mutex
	cur  *Incarnation
	next chan struct{} // closed when cur changes
}

// Incarnation is one run of an actor, from Publish to End.
type Incarnation struct {
	h    *Home
	done chan struct{}
	once sync.Once
}

var homes Local[Home]

// HomeOf returns the home of pid in system.
func HomeOf(system *actor.ActorSystem, pid *actor.PID) *Home {
	return homes.Get(system, pid, func() *Home { return &Home{next: make(chan struct{})} })
}

// Current returns the running incarnation (nil between incarnations) and a
// channel closed when that changes.
func (h *Home) Current() (*Incarnation, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur, h.next
}

// Publish makes a new incarnation of self current; the actor calls it on
// *actor.Started and calls End on the result on *actor.Stopped.
func Publish(system *actor.ActorSystem, self *actor.PID) *Incarnation {
	h := HomeOf(system, self)
	inc := &Incarnation{h: h, done: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur = inc
	close(h.next)
	h.next = make(chan struct{})
	return inc
}

// End ends the incarnation: it is no longer current and Done is closed.
// Later calls do nothing.
func (inc *Incarnation) End() {
	inc.once.Do(func() {
		inc.h.mu.Lock()
		if inc.h.cur == inc {
			inc.h.cur = nil
			close(inc.h.next)
			inc.h.next = make(chan struct{})
		}
		inc.h.mu.Unlock()
		close(inc.done)
	})
}

// Done is closed when the incarnation ends.
func (inc *Incarnation) Done() <-chan struct{} { return inc.done }

// Call sends the request built around a reply channel to the current
// incarnation of pid (an actor that Publishes its incarnations) and waits
// for its answer. If the incarnation ends before answering (it stopped or
// crashed, and its messages are lost), Call waits for the next incarnation
// and asks again, so a request never waits for a reply that cannot come.
// Between incarnations it waits for the next one; it gives up when ctx ends,
// with an error wrapping the context's cause.
func Call[T any](ctx context.Context, system *actor.ActorSystem, pid *actor.PID, build func(chan T) any) (T, error) {
	var zero T
	h := HomeOf(system, pid)
	for {
		inc, next := h.Current()
		if inc == nil {
			select {
			case <-next:
				continue
			case <-ctx.Done():
				return zero, fmt.Errorf("%s not running: %w", pid.Id, context.Cause(ctx))
			}
		}
		reply := make(chan T, 1)
		system.Root.Send(pid, build(reply))
		select {
		case r := <-reply:
			return r, nil
		case <-inc.done:
			select {
			case r := <-reply:
				return r, nil
			default:
			}
		case <-ctx.Done():
			return zero, fmt.Errorf("request to %s: %w", pid.Id, context.Cause(ctx))
		}
	}
}
