package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/supervisor"
)

// waitLimit bounds every wait in the tests. It is a deadlock guard, not a
// timing assertion: on a loaded machine a heal takes milliseconds.
const waitLimit = 30 * time.Second

// newSystem returns an actor system whose own logging is discarded.
func newSystem(t testing.TB) *actor.ActorSystem {
	t.Helper()
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
}

// eventLog records every supervisor event of a system and lets tests await
// one.
type eventLog struct {
	mu      sync.Mutex
	events  []*supervisor.Event
	changed chan struct{}
}

func watchEvents(t testing.TB, system *actor.ActorSystem) *eventLog {
	t.Helper()
	l := &eventLog{changed: make(chan struct{})}
	sub := system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*supervisor.Event); ok {
			l.mu.Lock()
			l.events = append(l.events, e)
			close(l.changed)
			l.changed = make(chan struct{})
			l.mu.Unlock()
		}
	})
	t.Cleanup(func() { system.EventStream.Unsubscribe(sub) })
	return l
}

// mark is the position after the events seen so far.
func (l *eventLog) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// since returns the events from position from on.
func (l *eventLog) since(from int) []*supervisor.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*supervisor.Event(nil), l.events[from:]...)
}

// await returns the position and the first event at or after from that
// matches, waiting for it if need be.
func (l *eventLog) await(t testing.TB, from int, what string, match func(*supervisor.Event) bool) (int, *supervisor.Event) {
	t.Helper()
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for i := from; ; {
		l.mu.Lock()
		for ; i < len(l.events); i++ {
			if match(l.events[i]) {
				e := l.events[i]
				l.mu.Unlock()
				return i, e
			}
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no event %s after position %d; events since:\n%s", what, from, formatEvents(l.since(from)))
		}
	}
}

// is returns a matcher for an event kind from supervisor sup about child.
func is(kind supervisor.EventKind, sup, child string) func(*supervisor.Event) bool {
	return func(e *supervisor.Event) bool {
		return e.Kind == kind && e.Supervisor == sup && e.Child == child
	}
}

func formatEvents(evs []*supervisor.Event) string {
	var b strings.Builder
	for _, e := range evs {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	return b.String()
}

// trace records the lifecycle of the test workers in the order it happened.
type trace struct {
	mu      sync.Mutex
	entries []string
}

func (tr *trace) add(s string) {
	tr.mu.Lock()
	tr.entries = append(tr.entries, s)
	tr.mu.Unlock()
}

// since returns the entries from position from on.
func (tr *trace) since(from int) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.entries[from:]...)
}

func (tr *trace) len() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.entries)
}

// Messages the test worker understands.
type (
	panicMsg struct{ value any }
	exitMsg  struct{ err error }
	blockMsg struct{ entered, release chan struct{} }
	pingMsg  struct{ reply chan uint64 }
)

// incarnations numbers every worker instance ever created, so that a ping
// tells which instance answered.
var incarnations atomic.Uint64

// worker is a test actor: it records "start:<name>" when started and
// "stop:<name>" when stopping in tr, and obeys the messages above.
type worker struct {
	name     string
	tr       *trace
	instance uint64
	// failStarts, if set, is decremented on each start; while it was
	// positive the start panics.
	failStarts *atomic.Int32
	// gate, if set, blocks the Started handler until it is closed;
	// entered is closed when it begins to wait.
	gate, entered chan struct{}
	// stopGate, if set, blocks the Stopping handler until it is closed;
	// stopEntered is closed when it begins to wait.
	stopGate, stopEntered chan struct{}
}

func (w *worker) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		w.instance = incarnations.Add(1)
		if w.entered != nil {
			close(w.entered)
			<-w.gate
		}
		if w.failStarts != nil && w.failStarts.Add(-1) >= 0 {
			w.tr.add("failstart:" + w.name)
			panic("start failure")
		}
		w.tr.add("start:" + w.name)
	case *actor.Stopping:
		w.tr.add("stop:" + w.name)
		if w.stopEntered != nil {
			close(w.stopEntered)
			<-w.stopGate
		}
	case panicMsg:
		panic(m.value)
	case exitMsg:
		supervisor.Exit(ctx, m.err)
	case blockMsg:
		close(m.entered)
		<-m.release
	case pingMsg:
		m.reply <- w.instance
	}
}

// workerProps returns props for a test worker named name.
func workerProps(tr *trace, name string) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &worker{name: name, tr: tr} })
}

// workerSpec is a ChildSpec of a test worker.
func workerSpec(tr *trace, name string, restart supervisor.Restart) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: name, Props: workerProps(tr, name), Restart: restart}
}

// ping asks the actor at pid which worker instance it is.
func ping(t testing.TB, system *actor.ActorSystem, pid *actor.PID) uint64 {
	t.Helper()
	reply := make(chan uint64, 1)
	system.Root.Send(pid, pingMsg{reply: reply})
	select {
	case n := <-reply:
		return n
	case <-time.After(waitLimit):
		t.Fatalf("no ping reply from %s", pid.Id)
		return 0
	}
}

func testContext(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// startTree starts a top supervisor and stops it at the end of the test.
func startTree(t testing.TB, system *actor.ActorSystem, name string, spec supervisor.Spec) *supervisor.Supervisor {
	t.Helper()
	sup, err := supervisor.Start(testContext(t), system, name, spec)
	if err != nil {
		t.Fatalf("Start(%s): %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := sup.Stop(ctx); err != nil && !errors.Is(err, supervisor.ErrEscalated) {
			t.Errorf("Stop(%s): %v", name, err)
		}
	})
	return sup
}

// which lists the tree under pid or fails the test.
func which(t testing.TB, system *actor.ActorSystem, pid *actor.PID) *supervisor.TreeNode {
	t.Helper()
	n, err := supervisor.Which(testContext(t), system, pid)
	if err != nil {
		t.Fatalf("Which(%s): %v", pid.Id, err)
	}
	return n
}

// child returns the direct child name of n, or nil.
func child(n *supervisor.TreeNode, name string) *supervisor.TreeNode {
	for _, c := range n.Children {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
