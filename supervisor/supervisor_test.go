package supervisor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/couchrep/couchrep/supervisor"
)

func TestMain(m *testing.M) {
	// protoactor's dead-letter throttle runs a goroutine for one throttle
	// period (1 s) after a message to a terminated actor; it ends by itself.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"))
}

// TestStartAndStopOrder: children start in order, a nested supervisor's
// children before its next sibling, and stop in reverse order.
func TestStartAndStopOrder(t *testing.T) {
	system := newSystem(t)
	tr := &trace{}
	spec := supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 1, Period: time.Minute,
		Children: []supervisor.ChildSpec{
			workerSpec(tr, "a", 0),
			{Name: "inner", Supervisor: &supervisor.Spec{
				Strategy: supervisor.RestForOne, MaxRestarts: 1, Period: time.Minute,
				Children: []supervisor.ChildSpec{workerSpec(tr, "x", 0), workerSpec(tr, "y", 0)},
			}},
			workerSpec(tr, "c", 0),
		},
	}
	sup, err := supervisor.Start(testContext(t), system, "order", spec)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tr.since(0), []string{"start:a", "start:x", "start:y", "start:c"}; !equal(got, want) {
		t.Fatalf("start order %v, want %v", got, want)
	}
	tree := which(t, system, sup.PID())
	if tree.Incarnation != 1 || tree.State != supervisor.Running || len(child(tree, "inner").Children) != 2 {
		t.Errorf("tree:\n%s", tree)
	}
	if got := tree.String(); !strings.Contains(got, "inner (rest_for_one) permanent running") {
		t.Errorf("tree misses the nested supervisor:\n%s", got)
	}
	if err := sup.Stop(testContext(t)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case <-sup.Done():
	default:
		t.Fatal("Done not closed after Stop returned")
	}
	if sup.Err() != nil {
		t.Fatalf("Err after clean Stop = %v", sup.Err())
	}
	if got, want := tr.since(4), []string{"stop:c", "stop:y", "stop:x", "stop:a"}; !equal(got, want) {
		t.Fatalf("stop order %v, want %v", got, want)
	}
	// The name is free again.
	sup2 := startTree(t, system, "order", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{workerSpec(tr, "a", 0)}})
	if sup2.PID().Id != "order" {
		t.Fatalf("PID %s", sup2.PID().Id)
	}
}

// TestStartWaitsForAck: a child is spawned only after the one before it has
// finished its Started handler.
func TestStartWaitsForAck(t *testing.T) {
	system := newSystem(t)
	tr := &trace{}
	gate, entered := make(chan struct{}), make(chan struct{})
	slow := actor.PropsFromProducer(func() actor.Actor {
		return &worker{name: "a", tr: tr, gate: gate, entered: entered}
	})
	spec := supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{
		{Name: "a", Props: slow}, workerSpec(tr, "b", 0),
	}}
	type result struct {
		sup *supervisor.Supervisor
		err error
	}
	done := make(chan result, 1)
	go func() {
		sup, err := supervisor.Start(context.Background(), system, "ack", spec)
		done <- result{sup, err}
	}()
	<-entered
	tree := which(t, system, actor.NewPID("nonhost", "ack"))
	if a, b := child(tree, "a"), child(tree, "b"); a.State != supervisor.Starting || b.State != supervisor.Stopped || b.Incarnation != 0 {
		t.Fatalf("while a starts: a %s, b %s (incarnation %d); want starting, stopped (0)", a.State, b.State, b.Incarnation)
	}
	if got := tr.since(0); len(got) != 0 {
		t.Fatalf("trace %v before a finished starting", got)
	}
	close(gate)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got, want := tr.since(0), []string{"start:a", "start:b"}; !equal(got, want) {
		t.Fatalf("start order %v, want %v", got, want)
	}
	if err := r.sup.Stop(testContext(t)); err != nil {
		t.Fatal(err)
	}
}

// cause is one way of making a child exit.
type cause struct {
	name   string
	reason string // the expected exit reason
	normal bool
	do     func(t *testing.T, system *actor.ActorSystem, pid *actor.PID)
}

var causes = []cause{
	{"panic", "panic: boom", false, func(_ *testing.T, s *actor.ActorSystem, pid *actor.PID) {
		s.Root.Send(pid, panicMsg{value: "boom"})
	}},
	{"exit_error", "disk full", false, func(_ *testing.T, s *actor.ActorSystem, pid *actor.PID) {
		s.Root.Send(pid, exitMsg{err: errors.New("disk full")})
	}},
	{"exit_normal", "normal", true, func(_ *testing.T, s *actor.ActorSystem, pid *actor.PID) {
		s.Root.Send(pid, exitMsg{})
	}},
	{"kill", "killed: chaos", false, func(t *testing.T, s *actor.ActorSystem, pid *actor.PID) {
		if err := supervisor.Kill(testContext(t), s, pid, "chaos"); err != nil {
			t.Fatalf("Kill: %v", err)
		}
	}},
	{"external_stop", "stopped", false, func(_ *testing.T, s *actor.ActorSystem, pid *actor.PID) {
		s.Root.Stop(pid)
	}},
}

// TestStrategies: which siblings restart, in which order, for each strategy
// and each way a permanent child can exit; and names resolve to the new
// incarnation.
func TestStrategies(t *testing.T) {
	strategies := []struct {
		strategy supervisor.Strategy
		trace    []string // after b exits
		restart  []string // children restarted, in order
	}{
		{supervisor.OneForOne, []string{"stop:b", "start:b"}, []string{"b"}},
		{supervisor.OneForAll, []string{"stop:b", "stop:d", "stop:c", "stop:a", "start:a", "start:b", "start:c", "start:d"}, []string{"a", "b", "c", "d"}},
		{supervisor.RestForOne, []string{"stop:b", "stop:d", "stop:c", "start:b", "start:c", "start:d"}, []string{"b", "c", "d"}},
	}
	for _, st := range strategies {
		for _, c := range causes {
			t.Run(st.strategy.String()+"/"+c.name, func(t *testing.T) {
				system := newSystem(t)
				events := watchEvents(t, system)
				tr := &trace{}
				var children []supervisor.ChildSpec
				for _, n := range []string{"a", "b", "c", "d"} {
					children = append(children, workerSpec(tr, n, supervisor.Permanent))
				}
				sup := startTree(t, system, "top", supervisor.Spec{Strategy: st.strategy, MaxRestarts: 10, Period: time.Hour, Children: children})
				before := which(t, system, sup.PID())
				pid := child(before, "b").PID
				oldInstance := ping(t, system, pid)
				from, trFrom := events.mark(), tr.len()

				c.do(t, system, pid)

				_, exited := events.await(t, from, "b exited", is(supervisor.ChildExited, "top", "b"))
				if exited.Reason != c.reason {
					t.Errorf("exit reason %q, want %q", exited.Reason, c.reason)
				}
				last := st.restart[len(st.restart)-1]
				events.await(t, from, last+" restarted", is(supervisor.ChildRestarted, "top", last))
				var restarted []string
				for _, e := range events.since(from) {
					if e.Kind == supervisor.ChildRestarted {
						restarted = append(restarted, e.Child)
					}
				}
				if !equal(restarted, st.restart) {
					t.Errorf("restarted %v, want %v", restarted, st.restart)
				}
				if got := tr.since(trFrom); !equal(got, st.trace) {
					t.Errorf("trace %v, want %v", got, st.trace)
				}
				after := which(t, system, sup.PID())
				for _, n := range after.Children {
					wantInc := uint64(1)
					for _, r := range st.restart {
						if r == n.Name {
							wantInc = 2
						}
					}
					if n.State != supervisor.Running || n.Incarnation != wantInc || n.RestartCount != int(wantInc-1) {
						t.Errorf("%s: %s incarnation %d restarts %d, want running %d %d", n.Name, n.State, n.Incarnation, n.RestartCount, wantInc, wantInc-1)
					}
				}
				// The old PID value reaches the new incarnation.
				if nb := child(after, "b"); !nb.PID.Equal(pid) {
					t.Errorf("PID changed: %s → %s", pid, nb.PID)
				}
				if inst := ping(t, system, pid); inst == oldInstance {
					t.Errorf("old PID still answered by the old instance %d", inst)
				}
			})
		}
	}
}

// TestRestartTypes: which exits restart permanent, transient and temporary
// children.
func TestRestartTypes(t *testing.T) {
	restarts := map[supervisor.Restart]func(c cause) bool{
		supervisor.Permanent: func(cause) bool { return true },
		supervisor.Transient: func(c cause) bool { return !c.normal },
		supervisor.Temporary: func(cause) bool { return false },
	}
	for _, rt := range []supervisor.Restart{supervisor.Permanent, supervisor.Transient, supervisor.Temporary} {
		for _, c := range causes {
			t.Run(rt.String()+"/"+c.name, func(t *testing.T) {
				system := newSystem(t)
				events := watchEvents(t, system)
				tr := &trace{}
				sup := startTree(t, system, "top", supervisor.Spec{
					Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Hour,
					Children: []supervisor.ChildSpec{workerSpec(tr, "a", supervisor.Permanent), workerSpec(tr, "w", rt)},
				})
				pid := child(which(t, system, sup.PID()), "w").PID
				from := events.mark()
				c.do(t, system, pid)
				_, e := events.await(t, from, "w exited", is(supervisor.ChildExited, "top", "w"))
				if e.Reason != c.reason {
					t.Errorf("reason %q, want %q", e.Reason, c.reason)
				}
				if restarts[rt](c) {
					_, e := events.await(t, from, "w restarted", is(supervisor.ChildRestarted, "top", "w"))
					if e.RestartCount != 1 || e.Incarnation != 2 {
						t.Errorf("restart event %+v", e)
					}
					return
				}
				// The decision was taken in the same step as the exit:
				// a Which queued after it sees the outcome.
				w := child(which(t, system, sup.PID()), "w")
				switch rt {
				case supervisor.Temporary:
					if w != nil {
						t.Errorf("temporary child still listed: %+v", w)
					}
				default:
					if w == nil || w.State != supervisor.Stopped || w.Incarnation != 1 {
						t.Errorf("child after exit: %+v, want stopped incarnation 1", w)
					}
				}
				for _, e := range events.since(from) {
					if e.Kind == supervisor.ChildRestarted {
						t.Errorf("unexpected %s", e)
					}
				}
			})
		}
	}
}

// TestPanicStack: a panic's stack reaches the exit event.
func TestPanicStack(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	sup := startTree(t, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne, MaxRestarts: 5, Period: time.Hour,
		Children: []supervisor.ChildSpec{workerSpec(tr, "w", 0)}})
	from := events.mark()
	system.Root.Send(child(which(t, system, sup.PID()), "w").PID, panicMsg{value: errors.New("bad state")})
	_, e := events.await(t, from, "w exited", is(supervisor.ChildExited, "top", "w"))
	if e.Reason != "panic: bad state" || !strings.Contains(e.Stack, "(*worker).Receive") {
		t.Fatalf("reason %q stack %q", e.Reason, e.Stack)
	}
	events.await(t, from, "w restarted", is(supervisor.ChildRestarted, "top", "w"))
}

// TestIntensity: more than MaxRestarts restarts within Period make the
// supervisor give up: stop its children in reverse order and escalate.
func TestIntensity(t *testing.T) {
	cases := []struct {
		name       string
		max        int
		kills      int // kills of b; the last one exceeds the intensity
		failStarts int32
	}{
		{"kills", 2, 3, 0},
		{"zero_max", 0, 1, 0},
		{"failed_restarts_count", 3, 1, 3}, // 1 restart + 3 failed restarts = 4 > 3
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			system := newSystem(t)
			events := watchEvents(t, system)
			tr := &trace{}
			failStarts := &atomic.Int32{}
			bProps := actor.PropsFromProducer(func() actor.Actor { return &worker{name: "b", tr: tr, failStarts: failStarts} })
			sup, err := supervisor.Start(testContext(t), system, "top", supervisor.Spec{
				Strategy: supervisor.OneForOne, MaxRestarts: tc.max, Period: time.Hour,
				Children: []supervisor.ChildSpec{workerSpec(tr, "a", 0), {Name: "b", Props: bProps}, workerSpec(tr, "c", 0)},
			})
			if err != nil {
				t.Fatal(err)
			}
			pid := actor.NewPID("nonhost", "top/b")
			for i := 1; i < tc.kills; i++ {
				from := events.mark()
				if err := supervisor.Kill(testContext(t), system, pid, "chaos"); err != nil {
					t.Fatal(err)
				}
				events.await(t, from, "b restarted", is(supervisor.ChildRestarted, "top", "b"))
			}
			failStarts.Store(tc.failStarts)
			trFrom := tr.len()
			if err := supervisor.Kill(testContext(t), system, pid, "last straw"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-sup.Done():
			case <-time.After(waitLimit):
				t.Fatal("supervisor did not give up")
			}
			if err := sup.Err(); !errors.Is(err, supervisor.ErrEscalated) {
				t.Fatalf("Err = %v, want ErrEscalated", err)
			}
			var wantTrace []string
			wantTrace = append(wantTrace, "stop:b")
			for i := int32(0); i < tc.failStarts; i++ {
				wantTrace = append(wantTrace, "failstart:b", "stop:b")
			}
			wantTrace = append(wantTrace, "stop:c", "stop:a")
			if got := tr.since(trFrom); !equal(got, wantTrace) {
				t.Errorf("trace %v, want %v", got, wantTrace)
			}
			_, gave := events.await(t, 0, "gave up", func(e *supervisor.Event) bool { return e.Kind == supervisor.GaveUp })
			if gave.Child != "b" || gave.Supervisor != "top" {
				t.Errorf("gave up event %s", gave)
			}
			_, esc := events.await(t, 0, "escalated", func(e *supervisor.Event) bool { return e.Kind == supervisor.Escalated })
			if !strings.Contains(esc.Reason, "max restart intensity") || !strings.Contains(sup.Err().Error(), esc.Reason) {
				t.Errorf("escalated reason %q, Err %v", esc.Reason, sup.Err())
			}
		})
	}
}

// TestNormalExitCountsTowardIntensity: a permanent child that keeps exiting
// normally is restarted each time, and that exhausts the intensity.
func TestNormalExitCountsTowardIntensity(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	sup, err := supervisor.Start(testContext(t), system, "top", supervisor.Spec{
		Strategy: supervisor.OneForOne, MaxRestarts: 1, Period: time.Hour,
		Children: []supervisor.ChildSpec{workerSpec(tr, "w", supervisor.Permanent)},
	})
	if err != nil {
		t.Fatal(err)
	}
	pid := actor.NewPID("nonhost", "top/w")
	from := events.mark()
	system.Root.Send(pid, exitMsg{})
	events.await(t, from, "w restarted", is(supervisor.ChildRestarted, "top", "w"))
	system.Root.Send(pid, exitMsg{})
	<-sup.Done()
	if !errors.Is(sup.Err(), supervisor.ErrEscalated) {
		t.Fatalf("Err = %v", sup.Err())
	}
}

// TestNestedEscalation: a nested supervisor that gives up fails to its
// parent, which restarts it (and counts that restart).
func TestNestedEscalation(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	sup := startTree(t, system, "top", supervisor.Spec{
		Strategy: supervisor.RestForOne, MaxRestarts: 5, Period: time.Hour,
		Children: []supervisor.ChildSpec{
			workerSpec(tr, "a", 0),
			{Name: "inner", Supervisor: &supervisor.Spec{
				Strategy: supervisor.OneForOne, MaxRestarts: 1, Period: time.Hour,
				Children: []supervisor.ChildSpec{workerSpec(tr, "x", 0), workerSpec(tr, "y", 0)},
			}},
			workerSpec(tr, "z", 0),
		},
	})
	y := actor.NewPID("nonhost", "top/inner/y")
	from := events.mark()
	if err := supervisor.Kill(testContext(t), system, y, "one"); err != nil {
		t.Fatal(err)
	}
	events.await(t, from, "y restarted", is(supervisor.ChildRestarted, "top/inner", "y"))
	from, trFrom := events.mark(), tr.len()
	if err := supervisor.Kill(testContext(t), system, y, "two"); err != nil {
		t.Fatal(err)
	}
	_, exited := events.await(t, from, "inner exited", is(supervisor.ChildExited, "top", "inner"))
	if !strings.Contains(exited.Reason, "max restart intensity") {
		t.Errorf("inner exit reason %q", exited.Reason)
	}
	_, e := events.await(t, from, "z restarted", is(supervisor.ChildRestarted, "top", "z"))
	if e.RestartCount != 1 {
		t.Errorf("z restart count %d", e.RestartCount)
	}
	want := []string{"stop:y", "stop:x", "stop:z", "start:x", "start:y", "start:z"}
	if got := tr.since(trFrom); !equal(got, want) {
		t.Errorf("trace %v, want %v", got, want)
	}
	var kinds []string
	for _, e := range events.since(from) {
		kinds = append(kinds, e.Supervisor+" "+e.Kind.String()+" "+e.Child)
	}
	wantKinds := []string{
		"top/inner child_exited y", "top/inner gave_up y",
		"top/inner child_exited x", "top/inner escalated ",
		"top child_exited inner", "top child_exited z",
		"top/inner child_started x", "top/inner child_started y",
		"top child_restarted inner", "top child_restarted z",
	}
	if !equal(kinds, wantKinds) {
		t.Errorf("events\n%v\nwant\n%v", strings.Join(kinds, "\n"), strings.Join(wantKinds, "\n"))
	}
	tree := which(t, system, sup.PID())
	inner := child(tree, "inner")
	if inner.RestartCount != 1 || inner.Incarnation != 2 || child(inner, "y").Incarnation != 1 || child(inner, "y").State != supervisor.Running {
		t.Errorf("tree after escalation:\n%s", tree)
	}
}

// TestShutdownTimeoutOnStop: a child that does not stop in time is reported
// and its elder siblings are stopped anyway; the tree terminates once it
// finally stops.
func TestShutdownTimeoutOnStop(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	b := workerSpec(tr, "b", 0)
	b.Shutdown = 10 * time.Millisecond
	sup, err := supervisor.Start(testContext(t), system, "top", supervisor.Spec{Strategy: supervisor.OneForOne,
		Children: []supervisor.ChildSpec{workerSpec(tr, "a", 0), b, workerSpec(tr, "c", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	system.Root.Send(actor.NewPID("nonhost", "top/b"), blockMsg{entered: entered, release: release})
	<-entered
	from, trFrom := events.mark(), tr.len()
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Stop(context.Background()) }()
	_, to := events.await(t, from, "b timed out", is(supervisor.ShutdownTimeout, "top", "b"))
	if !strings.Contains(to.Reason, "10ms") {
		t.Errorf("timeout reason %q", to.Reason)
	}
	events.await(t, from, "a exited", is(supervisor.ChildExited, "top", "a"))
	if got, want := tr.since(trFrom), []string{"stop:c", "stop:a"}; !equal(got, want) {
		t.Errorf("trace while b is stuck %v, want %v", got, want)
	}
	select {
	case <-sup.Done():
		t.Fatal("supervisor terminated while b is still running")
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if got, want := tr.since(trFrom), []string{"stop:c", "stop:a", "stop:b"}; !equal(got, want) {
		t.Errorf("trace %v, want %v", got, want)
	}
}

// TestShutdownTimeoutDuringRestartEscalates: a sibling that does not stop in
// time during a restart makes the supervisor give up.
func TestShutdownTimeoutDuringRestartEscalates(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	a := workerSpec(tr, "a", 0)
	a.Shutdown = 10 * time.Millisecond
	sup, err := supervisor.Start(testContext(t), system, "top", supervisor.Spec{Strategy: supervisor.OneForAll, MaxRestarts: 10, Period: time.Hour,
		Children: []supervisor.ChildSpec{a, workerSpec(tr, "b", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	system.Root.Send(actor.NewPID("nonhost", "top/a"), blockMsg{entered: entered, release: release})
	<-entered
	from := events.mark()
	system.Root.Send(actor.NewPID("nonhost", "top/b"), panicMsg{value: "boom"})
	_, gave := events.await(t, from, "gave up", is(supervisor.GaveUp, "top", "a"))
	if !strings.HasPrefix(gave.Reason, "shutdown_timeout") {
		t.Errorf("gave up reason %q", gave.Reason)
	}
	events.await(t, from, "escalated", is(supervisor.Escalated, "top", ""))
	select {
	case <-sup.Done():
		t.Fatal("terminated while a is still running")
	default:
	}
	close(release)
	<-sup.Done()
	if err := sup.Err(); !errors.Is(err, supervisor.ErrEscalated) || !strings.Contains(err.Error(), "shutdown_timeout") {
		t.Fatalf("Err = %v", err)
	}
}

// TestDynamicChildren: StartChild/TerminateChild on a simple_one_for_one
// supervisor; temporary children are not restarted and names are reusable.
func TestDynamicChildren(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	top := startTree(t, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Hour,
		Children: []supervisor.ChildSpec{
			{Name: "jobs", Supervisor: &supervisor.Spec{Strategy: supervisor.SimpleOneForOne, MaxRestarts: 10, Period: time.Hour,
				Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}}},
			{Name: "perm", Supervisor: &supervisor.Spec{Strategy: supervisor.SimpleOneForOne, MaxRestarts: 10, Period: time.Hour,
				Children: []supervisor.ChildSpec{{Name: "job", Props: workerProps(tr, "p")}}}},
		}})
	ctx := testContext(t)
	jobs := actor.NewPID("nonhost", "top/jobs")
	for _, n := range []string{"j1", "j2", "j3"} {
		pid, err := supervisor.StartChild(ctx, system, jobs, n, workerProps(tr, n))
		if err != nil {
			t.Fatalf("StartChild(%s): %v", n, err)
		}
		if pid.Id != "top/jobs/"+n {
			t.Errorf("pid %s", pid.Id)
		}
	}
	if got, want := tr.since(0), []string{"start:j1", "start:j2", "start:j3"}; !equal(got, want) {
		t.Fatalf("trace %v", got)
	}
	if _, err := supervisor.StartChild(ctx, system, jobs, "j1", workerProps(tr, "j1")); !errors.Is(err, supervisor.ErrAlreadyStarted) {
		t.Errorf("duplicate StartChild: %v", err)
	}
	if _, err := supervisor.StartChild(ctx, system, jobs, "j4", nil); !errors.Is(err, supervisor.ErrInvalidSpec) {
		t.Errorf("StartChild without props: %v", err)
	}
	if _, err := supervisor.StartChild(ctx, system, top.PID(), "x", workerProps(tr, "x")); !errors.Is(err, supervisor.ErrNotSimple) {
		t.Errorf("StartChild on one_for_one: %v", err)
	}
	failing := actor.PropsFromProducer(func() actor.Actor {
		n := &atomic.Int32{}
		n.Store(1)
		return &worker{name: "bad", tr: tr, failStarts: n}
	})
	if _, err := supervisor.StartChild(ctx, system, jobs, "bad", failing); !errors.Is(err, supervisor.ErrStartFailed) || !strings.Contains(err.Error(), "panic: start failure") {
		t.Errorf("failing StartChild: %v", err)
	}

	// A killed temporary child is not restarted and is forgotten.
	from := events.mark()
	if err := supervisor.Kill(ctx, system, actor.NewPID("nonhost", "top/jobs/j2"), "chaos"); err != nil {
		t.Fatal(err)
	}
	events.await(t, from, "j2 exited", is(supervisor.ChildExited, "top/jobs", "j2"))
	names := func() []string {
		var ns []string
		for _, c := range which(t, system, jobs).Children {
			ns = append(ns, c.Name+":"+c.State.String())
		}
		return ns
	}
	if got, want := names(), []string{"j1:running", "j3:running"}; !equal(got, want) {
		t.Errorf("children %v, want %v", got, want)
	}
	// TerminateChild stops and forgets; the names are reusable.
	trFrom := tr.len()
	if err := supervisor.TerminateChild(ctx, system, jobs, "j1"); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.since(trFrom), []string{"stop:j1"}; !equal(got, want) {
		t.Errorf("trace %v", got)
	}
	if err := supervisor.TerminateChild(ctx, system, jobs, "j1"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("second TerminateChild: %v", err)
	}
	for _, n := range []string{"j1", "j2"} {
		if _, err := supervisor.StartChild(ctx, system, jobs, n, workerProps(tr, n)); err != nil {
			t.Fatalf("StartChild(%s) again: %v", n, err)
		}
	}
	if got, want := names(), []string{"j3:running", "j1:running", "j2:running"}; !equal(got, want) {
		t.Errorf("children %v, want %v", got, want)
	}
	for _, e := range events.since(0) {
		if e.Kind == supervisor.ChildRestarted {
			t.Errorf("temporary child restarted: %s", e)
		}
	}

	// Permanent dynamic children (template props) are restarted on their own.
	perm := actor.NewPID("nonhost", "top/perm")
	for _, n := range []string{"p1", "p2"} {
		if _, err := supervisor.StartChild(ctx, system, perm, n, nil); err != nil {
			t.Fatal(err)
		}
	}
	from = events.mark()
	system.Root.Send(actor.NewPID("nonhost", "top/perm/p1"), panicMsg{value: "x"})
	_, e := events.await(t, from, "p1 restarted", is(supervisor.ChildRestarted, "top/perm", "p1"))
	if e.RestartCount != 1 {
		t.Errorf("restart count %d", e.RestartCount)
	}

	// Dynamic children stop in reverse start order with their supervisor.
	trFrom = tr.len()
	if err := supervisor.TerminateChild(ctx, system, top.PID(), "jobs"); err != nil {
		t.Fatal(err)
	}
	if got, want := tr.since(trFrom), []string{"stop:j2", "stop:j1", "stop:j3"}; !equal(got, want) {
		t.Errorf("trace %v, want %v", got, want)
	}
	if n := child(which(t, system, top.PID()), "jobs"); n.State != supervisor.Stopped {
		t.Errorf("jobs after TerminateChild: %s", n.State)
	}
}

// TestStartFailure: a child that fails to start makes Start fail; the
// children started before it are stopped in reverse order.
func TestStartFailure(t *testing.T) {
	system := newSystem(t)
	tr := &trace{}
	n := &atomic.Int32{}
	n.Store(1)
	bad := actor.PropsFromProducer(func() actor.Actor { return &worker{name: "y", tr: tr, failStarts: n} })
	_, err := supervisor.Start(testContext(t), system, "top", supervisor.Spec{Strategy: supervisor.OneForOne,
		Children: []supervisor.ChildSpec{
			workerSpec(tr, "a", 0),
			{Name: "inner", Supervisor: &supervisor.Spec{Strategy: supervisor.OneForAll,
				Children: []supervisor.ChildSpec{workerSpec(tr, "x", 0), {Name: "y", Props: bad}}}},
			workerSpec(tr, "c", 0),
		}})
	if !errors.Is(err, supervisor.ErrStartFailed) || !strings.Contains(err.Error(), "panic: start failure") {
		t.Fatalf("Start: %v", err)
	}
	want := []string{"start:a", "start:x", "failstart:y", "stop:y", "stop:x", "stop:a"}
	if got := tr.since(0); !equal(got, want) {
		t.Fatalf("trace %v, want %v", got, want)
	}
}

// TestInvalid: malformed specs and requests fail with the right sentinel.
func TestInvalid(t *testing.T) {
	system := newSystem(t)
	tr := &trace{}
	w := workerSpec(tr, "w", 0)
	cases := []struct {
		name string
		spec supervisor.Spec
	}{
		{"no strategy", supervisor.Spec{Children: []supervisor.ChildSpec{w}}},
		{"duplicate", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{w, w}}},
		{"no props", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{{Name: "x"}}}},
		{"slash", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{{Name: "x/y", Props: w.Props}}}},
		{"simple two templates", supervisor.Spec{Strategy: supervisor.SimpleOneForOne, Children: []supervisor.ChildSpec{w, w}}},
		{"negative", supervisor.Spec{Strategy: supervisor.OneForOne, MaxRestarts: -1, Period: time.Second}},
		{"nested bad", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{{Name: "s", Supervisor: &supervisor.Spec{}}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := supervisor.Start(testContext(t), system, "top", tc.spec); !errors.Is(err, supervisor.ErrInvalidSpec) {
				t.Fatalf("Start: %v, want ErrInvalidSpec", err)
			}
		})
	}
	sup := startTree(t, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne, Children: []supervisor.ChildSpec{w}})
	ctx := testContext(t)
	if _, err := supervisor.Start(ctx, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne}); !errors.Is(err, supervisor.ErrAlreadyStarted) {
		t.Errorf("second Start: %v", err)
	}
	if err := supervisor.Kill(ctx, system, sup.PID(), "x"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("Kill(top): %v", err)
	}
	if err := supervisor.Kill(ctx, system, actor.NewPID("nonhost", "top/nope"), "x"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("Kill(unknown): %v", err)
	}
	if _, err := supervisor.Which(ctx, system, actor.NewPID("nonhost", "top/w")); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("Which(worker): %v", err)
	}
	if err := supervisor.TerminateChild(ctx, system, sup.PID(), "nope"); !errors.Is(err, supervisor.ErrNotFound) {
		t.Errorf("TerminateChild(unknown): %v", err)
	}
}

// TestExitUnsupervised: Exit on an actor not started by a supervisor just
// stops it.
func TestExitUnsupervised(t *testing.T) {
	system := newSystem(t)
	tr := &trace{}
	pid := system.Root.Spawn(workerProps(tr, "lone"))
	system.Root.Send(pid, exitMsg{err: errors.New("bye")})
	if _, err := system.Root.StopFuture(pid).Result(); err != nil {
		// StopFuture on a stopped actor still answers (Terminated).
		t.Fatalf("stop future: %v", err)
	}
	if got := tr.since(0); !equal(got, []string{"start:lone", "stop:lone"}) {
		t.Fatalf("trace %v", got)
	}
}

// TestConcurrentKills: exits that arrive while a restart is under way are
// applied after it; the tree ends whole.
func TestConcurrentKills(t *testing.T) {
	for _, strategy := range []supervisor.Strategy{supervisor.OneForOne, supervisor.OneForAll, supervisor.RestForOne} {
		t.Run(strategy.String(), func(t *testing.T) {
			system := newSystem(t)
			events := watchEvents(t, system)
			tr := &trace{}
			var children []supervisor.ChildSpec
			names := []string{"a", "b", "c", "d", "e"}
			for _, n := range names {
				children = append(children, workerSpec(tr, n, supervisor.Permanent))
			}
			sup := startTree(t, system, "top", supervisor.Spec{Strategy: strategy, MaxRestarts: 1000, Period: time.Hour, Children: children})
			ctx := testContext(t)
			for round := 0; round < 20; round++ {
				for _, n := range []string{"d", "b", "e", "a"} {
					err := supervisor.Kill(ctx, system, actor.NewPID("nonhost", "top/"+n), "burst")
					if err != nil && !errors.Is(err, supervisor.ErrNotFound) { // not running at that instant
						t.Fatal(err)
					}
				}
				pos := events.mark()
				for {
					tree := which(t, system, sup.PID())
					whole := true
					for _, c := range tree.Children {
						whole = whole && c.State == supervisor.Running
					}
					if whole {
						break
					}
					pos, _ = events.await(t, pos, "any", func(*supervisor.Event) bool { return true })
					pos++
				}
			}
			for _, e := range events.since(0) {
				if e.Kind == supervisor.GaveUp || e.Kind == supervisor.StartFailed {
					t.Fatalf("unexpected %s", e)
				}
			}
			tree := which(t, system, sup.PID())
			for _, c := range tree.Children {
				if c.Name == "c" && strategy == supervisor.OneForOne && c.RestartCount != 0 {
					t.Errorf("c restarted %d times under one_for_one", c.RestartCount)
				}
				if c.Name != "c" && c.RestartCount == 0 {
					t.Errorf("%s never restarted", c.Name)
				}
			}
			// Every start and stop alternates per child.
			last := map[string]string{}
			for _, e := range tr.since(0) {
				kind, name, _ := strings.Cut(e, ":")
				if last[name] == kind {
					t.Fatalf("%s twice in a row for %s: %v", kind, name, tr.since(0))
				}
				last[name] = kind
			}
		})
	}
}

// TestStartCanceled: Start returns the context's error when it ends before
// the tree has started; the tree then shuts itself down.
func TestStartCanceled(t *testing.T) {
	system := newSystem(t)
	events := watchEvents(t, system)
	tr := &trace{}
	gate, entered := make(chan struct{}), make(chan struct{})
	slow := actor.PropsFromProducer(func() actor.Actor {
		return &worker{name: "b", tr: tr, gate: gate, entered: entered}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := supervisor.Start(ctx, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne,
			Children: []supervisor.ChildSpec{workerSpec(tr, "a", 0), {Name: "b", Props: slow}}})
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Start: %v", err)
	}
	close(gate)
	events.await(t, 0, "a stopped", is(supervisor.ChildExited, "top", "a"))
	if got, want := tr.since(0), []string{"start:a", "start:b", "stop:b", "stop:a"}; !equal(got, want) {
		t.Fatalf("trace %v, want %v", got, want)
	}
}

// signalWriter closes seen when a log line containing what is written.
type signalWriter struct {
	what string
	once sync.Once
	seen chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.what) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

// TestStartChildWaitsForTheLeavingChild: a StartChild for the name of a
// dynamic child that is exiting — it stopped itself (Exit), or is being
// killed, but its Stopping handler still runs, so the supervisor has not
// seen it terminate — waits for that exit and then starts the new child,
// instead of failing with ErrAlreadyStarted (a job taken again before its
// old actor has exited). The old child's stop is held until the test has
// seen the supervisor take the request.
func TestStartChildWaitsForTheLeavingChild(t *testing.T) {
	tests := []struct {
		name  string
		leave func(t *testing.T, system *actor.ActorSystem, pid *actor.PID)
	}{
		{"exit", func(_ *testing.T, system *actor.ActorSystem, pid *actor.PID) {
			system.Root.Send(pid, exitMsg{})
		}},
		{"kill", func(t *testing.T, system *actor.ActorSystem, pid *actor.PID) {
			if err := supervisor.Kill(testContext(t), system, pid, "chaos"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			system := newSystem(t)
			events := watchEvents(t, system)
			tr := &trace{}
			w := &signalWriter{what: "start waits for the previous child", seen: make(chan struct{})}
			log := zerolog.New(w)
			startTree(t, system, "top", supervisor.Spec{Strategy: supervisor.OneForOne, MaxRestarts: 10, Period: time.Hour,
				Children: []supervisor.ChildSpec{
					{Name: "jobs", Supervisor: &supervisor.Spec{Strategy: supervisor.SimpleOneForOne, MaxRestarts: 10, Period: time.Hour,
						Logger: &log, Children: []supervisor.ChildSpec{{Name: "job", Restart: supervisor.Temporary}}}},
				}})
			ctx := testContext(t)
			jobs := actor.NewPID("nonhost", "top/jobs")
			entered, gate := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(gate) }) }
			t.Cleanup(release) // before the tree stops, should the test fail
			old, err := supervisor.StartChild(ctx, system, jobs, "j", actor.PropsFromProducer(func() actor.Actor {
				return &worker{name: "old", tr: tr, stopEntered: entered, stopGate: gate}
			}))
			if err != nil {
				t.Fatal(err)
			}
			from := events.mark()
			tc.leave(t, system, old)
			select {
			case <-entered:
			case <-ctx.Done():
				t.Fatal("the old child never began to stop")
			}
			type result struct {
				pid *actor.PID
				err error
			}
			started := make(chan result, 1)
			go func() {
				pid, err := supervisor.StartChild(ctx, system, jobs, "j", workerProps(tr, "new"))
				started <- result{pid, err}
			}()
			select {
			case <-w.seen: // the supervisor holds the request until the old child has exited
			case r := <-started:
				t.Fatalf("StartChild while the old child is stopping returned %v, %v; want it to wait for the exit", r.pid, r.err)
			case <-ctx.Done():
				t.Fatal("the supervisor never took the StartChild request")
			}
			release()
			var r result
			select {
			case r = <-started:
			case <-ctx.Done():
				t.Fatal("StartChild did not return after the old child exited")
			}
			if r.err != nil || r.pid == nil || r.pid.Id != "top/jobs/j" {
				t.Fatalf("StartChild after the old child exited: %v, %v", r.pid, r.err)
			}
			if got, want := tr.since(0), []string{"start:old", "stop:old", "start:new"}; !equal(got, want) {
				t.Fatalf("trace %v, want %v", got, want)
			}
			exited, _ := events.await(t, from, "the old child's exit", is(supervisor.ChildExited, "top/jobs", "j"))
			if begun, _ := events.await(t, from, "the new child's start", is(supervisor.ChildStarted, "top/jobs", "j")); begun < exited {
				t.Fatalf("the new child started before the old one exited:\n%s", formatEvents(events.since(from)))
			}
			if n := which(t, system, jobs); len(n.Children) != 1 || n.Children[0].State != supervisor.Running {
				t.Fatalf("jobs has %d children, want the new one running: %+v", len(n.Children), n.Children)
			}
		})
	}
}
