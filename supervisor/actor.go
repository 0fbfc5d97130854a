package supervisor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// mode is where a supervisor is in its own life.
type mode int

const (
	modeInit     mode = iota // starting its children in order
	modeRunning              // started; restarting children as they exit
	modeShutdown             // orderly stop: children in reverse order, then itself
	modeFailing              // gave up: children in reverse order, then fail to the parent
	modeStopped              // its own actor is stopping
)

// child is a supervisor's record of one child, across incarnations.
type child struct {
	spec         ChildSpec
	pid          *actor.PID
	state        ChildState
	cell         *cell // of the current incarnation
	incarnation  uint64
	restartCount int
	startedAt    time.Time
	restarting   bool // the current start is a restart

	stopping   bool   // the supervisor sent the stop (a step, or its own stop)
	stopReason string // reason reported for that stop ("shutdown")
	killReason string // set by Kill: the exit is abnormal with this reason
	timedOut   bool   // the stop's shutdown timeout fired
	timer      *time.Timer
	remove     bool // drop the child from the list once it has stopped
}

func (c *child) alive() bool {
	return c.state == Starting || c.state == Running || c.state == Stopping
}

func (c *child) isSupervisor() bool { return c.spec.Supervisor != nil }

// leaving reports whether c is on its way out: its actor terminated (the
// exit not yet handled), the supervisor is stopping or killing it, or it
// stopped itself (Exit, a panic) and has not terminated yet.
func (c *child) leaving() bool {
	return !c.alive() || c.stopping || c.killReason != "" || (c.cell != nil && c.cell.leaving())
}

// stepKind names one step of a supervisor's work queue.
type stepKind int

const (
	stepStart  stepKind = iota // spawn a child, wait for its ack or its Terminated
	stepStop                   // stop a child, wait for its Terminated or its shutdown timer
	stepExit                   // apply restart type and strategy to a child's exit
	stepAck                    // the supervisor's own start is complete
	stepFinish                 // the supervisor stops itself
)

type step struct {
	kind        stepKind
	child       *child
	restart     bool   // start: this is a restart
	dynamic     bool   // start: StartChild; a failure goes back to the caller
	escalate    bool   // stop: part of a restart; a shutdown timeout makes the supervisor give up
	remove      bool   // stop: forget the child once stopped
	reason      string // stop: reason reported; exit/finish: the exit reason
	normal      bool   // exit/finish: the exit reason is normal
	stack       string // exit: the panic stack, if any
	incarnation uint64 // exit: the incarnation that exited
	reply       func(*actor.PID, error)
}

// supervisorActor is one supervisor: an ordinary protoactor actor that owns
// its children (spawned with SpawnNamed), never blocks in Receive, and does
// all OTP logic as a queue of steps, one at a time: a start waits for the
// child's acknowledgement, a stop for its Terminated or its shutdown timer.
type supervisorActor struct {
	system *actor.ActorSystem
	self   *actor.PID
	id     string
	name   string
	spec   Spec // normalized
	log    zerolog.Logger
	cell   *cell // its own incarnation's cell
	inst   *instance
	// how its parent sees it, for Which
	restart      Restart
	incarnation  uint64
	restartCount int
	startedAt    time.Time

	mode     mode
	children []*child
	// names indexes children by name (a name is one child's at a time:
	// a start for a name still leaving waits, see onStartChild), so that
	// a start, ack or exit among thousands of dynamic children does not
	// walk them all.
	names    map[string]*child
	restarts []time.Time
	queue    []*step
	cur      *step
	// waiting are StartChild requests for a name whose previous child is
	// still leaving; they are looked at again after every message.
	waiting []*startChildRequest
}

// Ensure the supervisor handles failures that escape the child middleware.
var _ actor.SupervisorStrategy = (*supervisorActor)(nil)

// supervisorProps returns the props of one incarnation of a supervisor.
// self describes it as its parent sees it (for Which): restart type,
// incarnation and restart count.
func supervisorProps(system *actor.ActorSystem, name string, spec Spec, log zerolog.Logger, c *cell, self *child) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &supervisorActor{system: system, name: name, spec: spec, log: log, cell: c,
			restart: self.spec.Restart, incarnation: self.incarnation, restartCount: self.restartCount}
	}, c.options()...)
}

// Receive implements actor.Actor.
func (a *supervisorActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		a.self, a.id = ctx.Self(), ctx.Self().Id
		a.log = a.log.With().Str("supervisor", a.id).Logger()
		a.inst = register(a.system, a.id)
		if a.spec.Strategy != SimpleOneForOne {
			for _, cs := range a.spec.Children {
				c := &child{spec: cs, state: Stopped}
				a.addChild(c)
				a.queue = append(a.queue, &step{kind: stepStart, child: c})
			}
		}
		a.queue = append(a.queue, &step{kind: stepAck})
		a.advance(ctx)
	case *actor.Stopping:
		a.onStopping()
	case *actor.Stopped:
		if a.inst != nil {
			a.inst.unregister()
		}
	case *actor.Terminated:
		dropStaleChild(ctx)
		a.onTerminated(ctx, msg.Who)
	case *childAck:
		a.onAck(ctx, msg.cell, msg.child)
	case *stopTimeout:
		a.onStopTimeout(ctx, msg)
	case *shutdownRequest:
		a.shutdown(ctx)
	case *whichRequest:
		msg.reply <- a.snapshot()
	case *startChildRequest:
		a.onStartChild(ctx, msg)
	case *terminateChildRequest:
		a.onTerminateChild(ctx, msg)
	case *killRequest:
		msg.reply <- a.onKill(ctx, msg)
	}
	if len(a.waiting) > 0 {
		waiting := a.waiting
		a.waiting = nil
		for _, m := range waiting {
			a.onStartChild(ctx, m)
		}
	}
}

// HandleFailure implements actor.SupervisorStrategy for failures that escape
// the child's middleware (a panic in a middleware outside it): record the
// reason and stop the child; the OTP logic runs when Terminated arrives.
func (a *supervisorActor) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, pid *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
	if c := a.byPID(pid); c != nil && c.cell != nil {
		c.cell.recordExit(fmt.Sprintf("panic: %v", reason), false, "")
	}
	sup.StopChildren(pid)
}

// advance runs queued steps until one has to wait.
func (a *supervisorActor) advance(ctx actor.Context) {
	for a.cur == nil && len(a.queue) > 0 && a.mode != modeStopped {
		s := a.queue[0]
		a.queue = a.queue[1:]
		switch s.kind {
		case stepStart:
			a.execStart(ctx, s)
		case stepStop:
			a.execStop(ctx, s)
		case stepExit:
			a.execExit(ctx, s)
		case stepAck:
			if a.mode == modeInit {
				a.mode, a.startedAt = modeRunning, time.Now()
				a.cell.ack()
			}
		case stepFinish:
			a.finish(ctx, s.reason, s.normal)
		}
	}
}

func (a *supervisorActor) execStart(ctx actor.Context, s *step) {
	c := s.child
	if c.alive() || c.remove || !a.has(c) {
		if s.reply != nil {
			s.reply(c.pid, nil)
		}
		return
	}
	c.incarnation++
	if s.restart {
		c.restartCount++
	}
	c.restarting = s.restart
	c.stopping, c.stopReason, c.killReason, c.timedOut = false, "", "", false
	c.cell = &cell{log: a.log, deferAck: c.isSupervisor()}
	self, cl := a.self, c.cell
	c.cell.onAck = func() { a.system.Root.Send(self, &childAck{cell: cl, child: c}) }
	pid, err := a.spawn(ctx, c)
	if err != nil {
		c.state = Stopped
		reason := "spawn: " + err.Error()
		a.publish(StartFailed, c, reason, "")
		a.startFailed(ctx, s, reason)
		return
	}
	c.pid, c.state = pid, Starting
	a.cur = s
}

// spawn spawns the child's next incarnation, turning a panic of SpawnNamed
// (props with a guardian strategy) into an error.
func (a *supervisorActor) spawn(ctx actor.Context, c *child) (pid *actor.PID, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	var props *actor.Props
	if c.isSupervisor() {
		log := a.log
		if c.spec.Supervisor.Logger != nil {
			log = *c.spec.Supervisor.Logger
		}
		props = supervisorProps(a.system, c.spec.Name, c.spec.Supervisor.normalized(), log, c.cell, c)
	} else {
		props = c.spec.Props.Clone(c.cell.options()...)
	}
	return ctx.SpawnNamed(props, c.spec.Name)
}

func (a *supervisorActor) execStop(ctx actor.Context, s *step) {
	c := s.child
	if s.remove {
		c.remove = true
	}
	if !c.alive() {
		a.forgetIfRemoved(c)
		if s.reply != nil {
			s.reply(nil, nil)
		}
		return
	}
	if c.stopping {
		if c.timedOut { // a stuck child: do not wait for it again
			if s.reply != nil {
				s.reply(nil, fmt.Errorf("%w: %s", ErrShutdownTimeout, c.spec.Name))
			}
			return
		}
		a.cur = s // its stop is in flight: wait for it
		return
	}
	c.stopping, c.stopReason, c.state = true, s.reason, Stopping
	if c.isSupervisor() {
		ctx.Send(c.pid, &shutdownRequest{})
	} else {
		ctx.Stop(c.pid)
	}
	if c.spec.Shutdown != Infinity {
		self, inc := a.self, c.incarnation
		c.timer = time.AfterFunc(c.spec.Shutdown, func() {
			a.system.Root.Send(self, &stopTimeout{child: c, incarnation: inc})
		})
	}
	a.cur = s
}

// execExit applies the restart type and the strategy to an unexpected exit.
func (a *supervisorActor) execExit(ctx actor.Context, s *step) {
	c := s.child
	if c.incarnation != s.incarnation || c.alive() || !a.has(c) {
		return // already restarted (by a sibling's restart) or removed
	}
	restart := false
	switch c.spec.Restart {
	case Permanent:
		restart = true
	case Transient:
		restart = !s.normal
	}
	if !restart {
		if c.spec.Restart == Temporary || a.spec.Strategy == SimpleOneForOne {
			a.removeChild(c)
		}
		return
	}
	if !a.recordRestart() {
		a.giveUp(ctx, c, s.reason)
		return
	}
	a.queue = append(a.strategySteps(c), a.queue...)
}

// strategySteps returns the steps that restart c (after its exit) and the
// siblings the strategy restarts with it.
func (a *supervisorActor) strategySteps(c *child) []*step {
	var others []*child
	switch a.spec.Strategy {
	case OneForAll:
		for _, o := range a.children {
			if o != c {
				others = append(others, o)
			}
		}
	case RestForOne:
		if i := a.indexOf(c); i >= 0 {
			others = append(others, a.children[i+1:]...)
		}
	}
	var steps []*step
	for i := len(others) - 1; i >= 0; i-- {
		o := others[i]
		if o.alive() || o.spec.Restart == Temporary {
			steps = append(steps, &step{kind: stepStop, child: o, reason: "shutdown", escalate: true, remove: o.spec.Restart == Temporary})
		}
	}
	for _, o := range a.children { // start order
		if o == c || (o.spec.Restart != Temporary && contains(others, o)) {
			steps = append(steps, &step{kind: stepStart, child: o, restart: true})
		}
	}
	return steps
}

// recordRestart counts one restart toward the intensity; false means more
// than MaxRestarts restarts happened within Period.
func (a *supervisorActor) recordRestart() bool {
	now := time.Now()
	kept := a.restarts[:0]
	for _, t := range a.restarts {
		if now.Sub(t) < a.spec.Period {
			kept = append(kept, t)
		}
	}
	a.restarts = append(kept, now)
	return len(a.restarts) <= a.spec.MaxRestarts
}

// startFailed handles a child that terminated before acknowledging its start.
func (a *supervisorActor) startFailed(ctx actor.Context, s *step, reason string) {
	c := s.child
	switch {
	case a.mode == modeInit:
		a.fail(ctx, fmt.Sprintf("start_failed: %s: %s", c.spec.Name, reason))
	case s.dynamic:
		a.removeChild(c)
		s.reply(nil, fmt.Errorf("%w: %s: %s", ErrStartFailed, c.spec.Name, reason))
	case a.mode != modeRunning:
		if s.reply != nil {
			s.reply(nil, ErrStopped)
		}
	case s.restart || c.spec.Restart != Temporary:
		// A failed restart counts toward the intensity and is retried.
		if !a.recordRestart() {
			a.giveUp(ctx, c, reason)
			return
		}
		a.queue = append(a.strategySteps(c), a.queue...)
	default:
		a.removeChild(c)
	}
}

// onAck completes a child's start (cl: its cell; hint: the child it was
// made for, if known).
func (a *supervisorActor) onAck(ctx actor.Context, cl *cell, hint *child) {
	var c *child
	if hint != nil && hint.cell == cl && a.has(hint) {
		c = hint
	} else {
		for _, x := range a.children {
			if x.cell == cl {
				c = x
				break
			}
		}
	}
	if c == nil || c.state != Starting {
		return
	}
	c.state, c.startedAt = Running, time.Now()
	if c.restarting {
		a.publish(ChildRestarted, c, "", "")
	} else {
		a.publish(ChildStarted, c, "", "")
	}
	if s := a.cur; s != nil && s.kind == stepStart && s.child == c {
		a.cur = nil
		if s.reply != nil {
			s.reply(c.pid, nil)
		}
	}
	a.advance(ctx)
}

// exitReason says why c's current incarnation terminated.
func (a *supervisorActor) exitReason(c *child) (reason string, normal bool, stack string) {
	if c.stopping {
		return c.stopReason, true, ""
	}
	if c.killReason != "" {
		return c.killReason, false, ""
	}
	if r, n, st, ok := c.cell.exit(); ok {
		return r, n, st
	}
	return "stopped", false, ""
}

func (a *supervisorActor) onTerminated(ctx actor.Context, who *actor.PID) {
	c := a.byPID(who)
	if c == nil || !c.alive() {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.state == Starting && c.cell.isAcked() {
		a.onAck(ctx, c.cell, c) // its ack is still queued behind Terminated
		if !c.alive() {
			return
		}
	}
	reason, normal, stack := a.exitReason(c)
	if c.state == Starting && !c.stopping {
		c.state = Stopped
		a.publish(StartFailed, c, reason, stack)
		if s := a.cur; s != nil && s.kind == stepStart && s.child == c {
			a.cur = nil
			a.startFailed(ctx, s, reason)
		}
		a.advance(ctx)
		return
	}
	c.state = Stopped
	a.publish(ChildExited, c, reason, stack)
	switch {
	case c.stopping:
		a.forgetIfRemoved(c)
		if s := a.cur; s != nil && s.kind == stepStop && s.child == c {
			a.cur = nil
			if s.reply != nil {
				s.reply(nil, nil)
			}
		}
	case a.mode == modeInit || a.mode == modeRunning:
		a.queue = append(a.queue, &step{kind: stepExit, child: c, reason: reason, normal: normal, stack: stack, incarnation: c.incarnation})
	default:
		if c.spec.Restart == Temporary {
			a.removeChild(c)
		}
	}
	a.advance(ctx)
}

func (a *supervisorActor) onStopTimeout(ctx actor.Context, m *stopTimeout) {
	c := m.child
	if c.incarnation != m.incarnation || c.state != Stopping || c.timedOut {
		return
	}
	c.timedOut, c.timer = true, nil
	reason := fmt.Sprintf("did not stop within %s", c.spec.Shutdown)
	a.publish(ShutdownTimeout, c, reason, "")
	s := a.cur
	if s == nil || s.kind != stepStop || s.child != c {
		return
	}
	a.cur = nil
	if s.escalate && a.mode == modeRunning {
		a.giveUp(ctx, c, "shutdown_timeout: "+reason)
		return
	}
	if s.reply != nil {
		s.reply(nil, fmt.Errorf("%w: %s %s", ErrShutdownTimeout, c.spec.Name, reason))
	}
	a.advance(ctx)
}

// giveUp: restart intensity exceeded (or a stuck child during a restart).
func (a *supervisorActor) giveUp(ctx actor.Context, c *child, reason string) {
	a.publish(GaveUp, c, reason, "")
	a.fail(ctx, fmt.Sprintf("shutdown: reached max restart intensity (last: %s: %s)", c.spec.Name, reason))
}

// fail stops every child in reverse order and then fails to the parent.
func (a *supervisorActor) fail(ctx actor.Context, reason string) {
	a.mode = modeFailing
	a.abortQueue()
	a.queue = append(a.stopAllSteps(), &step{kind: stepFinish, reason: reason, normal: false})
	a.advance(ctx)
}

// shutdown is the orderly stop: children in reverse order, then itself.
func (a *supervisorActor) shutdown(ctx actor.Context) {
	if a.mode >= modeShutdown {
		return
	}
	a.mode = modeShutdown
	a.abortQueue()
	a.queue = append(a.stopAllSteps(), &step{kind: stepFinish, reason: "shutdown", normal: true})
	a.advance(ctx)
}

func (a *supervisorActor) stopAllSteps() []*step {
	var steps []*step
	for i := len(a.children) - 1; i >= 0; i-- {
		if c := a.children[i]; c.alive() {
			steps = append(steps, &step{kind: stepStop, child: c, reason: "shutdown"})
		}
	}
	return steps
}

// abortQueue drops pending steps, answering waiting callers.
func (a *supervisorActor) abortQueue() {
	pending := a.queue
	if a.cur != nil {
		pending = append([]*step{a.cur}, pending...)
	}
	a.cur, a.queue = nil, nil
	for _, s := range pending {
		if s.reply != nil {
			s.reply(nil, ErrStopped)
		}
		if s.dynamic && !s.child.alive() {
			a.removeChild(s.child)
		}
	}
}

func (a *supervisorActor) finish(ctx actor.Context, reason string, normal bool) {
	if !normal {
		a.publish(Escalated, nil, reason, "")
	}
	a.cell.recordExit(reason, normal, "")
	a.mode = modeStopped
	ctx.Stop(a.self)
}

// onStopping: the supervisor's actor is stopping (after finish, or stopped
// from outside, in which case protoactor stops the children unordered).
func (a *supervisorActor) onStopping() {
	a.mode = modeStopped
	a.abortQueue()
	for _, c := range a.children {
		if c.alive() && !c.stopping {
			c.stopping, c.stopReason, c.state = true, "shutdown", Stopping
		}
	}
}

func (a *supervisorActor) onStartChild(ctx actor.Context, m *startChildRequest) {
	reply := func(pid *actor.PID, err error) { m.reply <- startChildReply{pid: pid, err: err} }
	switch {
	case a.spec.Strategy != SimpleOneForOne:
		reply(nil, fmt.Errorf("%w: %s", ErrNotSimple, a.id))
		return
	case a.mode != modeRunning && a.mode != modeInit:
		reply(nil, ErrStopped)
		return
	}
	if old := a.byName(m.name); old != nil {
		if !old.leaving() {
			reply(nil, fmt.Errorf("%w: %s/%s", ErrAlreadyStarted, a.id, m.name))
			return
		}
		// The previous child of that name is exiting (it stopped itself, or
		// is being stopped) but its exit is not handled yet: start the new
		// one once it is, rather than fail a start that is bound to work.
		if !m.waits {
			m.waits = true
			a.log.Info().Str("child", m.name).Msg("supervisor: start waits for the previous child of that name to exit")
		}
		a.waiting = append(a.waiting, m)
		return
	}
	cs := a.spec.Children[0]
	cs.Name = m.name
	if m.props != nil {
		cs.Props, cs.Supervisor = m.props, nil
	}
	if cs.Props == nil && cs.Supervisor == nil {
		reply(nil, fmt.Errorf("%w: %s: no props for %q and the template has none", ErrInvalidSpec, a.id, m.name))
		return
	}
	c := &child{spec: cs.normalized(), state: Stopped}
	a.addChild(c)
	a.queue = append(a.queue, &step{kind: stepStart, child: c, dynamic: true, reply: reply})
	a.advance(ctx)
}

func (a *supervisorActor) onTerminateChild(ctx actor.Context, m *terminateChildRequest) {
	c := a.byName(m.name)
	if c == nil {
		m.reply <- fmt.Errorf("%w: child %s/%s", ErrNotFound, a.id, m.name)
		return
	}
	if a.mode != modeRunning && a.mode != modeInit {
		m.reply <- ErrStopped
		return
	}
	remove := a.spec.Strategy == SimpleOneForOne || c.spec.Restart == Temporary
	a.queue = append(a.queue, &step{kind: stepStop, child: c, reason: "shutdown", remove: remove,
		reply: func(_ *actor.PID, err error) { m.reply <- err }})
	a.advance(ctx)
}

func (a *supervisorActor) onKill(ctx actor.Context, m *killRequest) error {
	var c *child
	for _, x := range a.children {
		if x.pid != nil && x.pid.Id == m.id && x.alive() {
			c = x
			break
		}
	}
	if c == nil {
		return fmt.Errorf("%w: no live child %s", ErrNotFound, m.id)
	}
	if c.stopping || c.killReason != "" {
		return nil // already on its way out
	}
	c.killReason = "killed: " + m.reason
	if c.state == Running {
		c.state = Stopping // a Starting child stays Starting: its start fails
	}
	if c.isSupervisor() {
		ctx.Send(c.pid, &shutdownRequest{})
	} else {
		ctx.Stop(c.pid)
	}
	return nil
}

// snapshot lists the supervisor and its children (nested supervisors
// without their own children: Which asks them itself).
func (a *supervisorActor) snapshot() *TreeNode {
	state := Running
	if a.mode >= modeShutdown {
		state = Stopping
	} else if a.mode == modeInit {
		state = Starting
	}
	n := &TreeNode{Name: a.name, PID: a.self, IsSupervisor: true, Strategy: a.spec.Strategy, State: state,
		Restart: a.restart, Incarnation: a.incarnation, RestartCount: a.restartCount, StartedAt: a.startedAt}
	for _, c := range a.children {
		cn := &TreeNode{
			Name:         c.spec.Name,
			PID:          c.pid,
			IsSupervisor: c.isSupervisor(),
			Restart:      c.spec.Restart,
			State:        c.state,
			RestartCount: c.restartCount,
			Incarnation:  c.incarnation,
			StartedAt:    c.startedAt,
		}
		if c.isSupervisor() {
			cn.Strategy = c.spec.Supervisor.Strategy
		}
		n.Children = append(n.Children, cn)
	}
	return n
}

func (a *supervisorActor) publish(kind EventKind, c *child, reason, stack string) {
	e := &Event{Kind: kind, Supervisor: a.id, Reason: reason, Stack: stack, Time: time.Now()}
	if c != nil {
		e.Child, e.PID, e.RestartCount, e.Incarnation = c.spec.Name, c.pid, c.restartCount, c.incarnation
	}
	level := zerolog.InfoLevel
	switch kind {
	case ChildStarted:
		level = zerolog.DebugLevel
	case ChildExited:
		if reason != "normal" && reason != "shutdown" {
			level = zerolog.WarnLevel
		}
	case StartFailed, ShutdownTimeout, GaveUp, Escalated:
		level = zerolog.ErrorLevel
	}
	if ev := a.log.WithLevel(level); ev != nil {
		ev.Str("event", kind.String()).Str("child", e.Child).Str("reason", reason).
			Int("restart_count", e.RestartCount).Uint64("incarnation", e.Incarnation).Msg("supervisor event")
	}
	a.system.EventStream.Publish(e)
}

func (a *supervisorActor) indexOf(c *child) int {
	for i, x := range a.children {
		if x == c {
			return i
		}
	}
	return -1
}

func (a *supervisorActor) byName(name string) *child {
	return a.names[name]
}

// addChild appends c to the children (start order) and indexes its name.
func (a *supervisorActor) addChild(c *child) {
	if a.names == nil {
		a.names = map[string]*child{}
	}
	a.children = append(a.children, c)
	a.names[c.spec.Name] = c
}

// has reports whether c is one of the children.
func (a *supervisorActor) has(c *child) bool {
	return c != nil && a.names[c.spec.Name] == c
}

func (a *supervisorActor) byPID(pid *actor.PID) *child {
	if pid == nil {
		return nil
	}
	// A child's actor is spawned under the supervisor with its name.
	if i := strings.LastIndex(pid.Id, "/"); i >= 0 {
		if c := a.names[pid.Id[i+1:]]; c != nil && c.pid != nil && c.pid.Id == pid.Id && c.alive() {
			return c
		}
	}
	for _, c := range a.children {
		if c.pid != nil && pid != nil && c.pid.Id == pid.Id && c.alive() {
			return c
		}
	}
	return nil
}

func (a *supervisorActor) removeChild(c *child) {
	if a.names[c.spec.Name] == c {
		delete(a.names, c.spec.Name)
	}
	if i := a.indexOf(c); i >= 0 {
		// slices.Delete clears the freed tail: a removed child (its props,
		// its options, what they reference) is not kept alive by the
		// backing array of a simple_one_for_one supervisor that had
		// thousands of children.
		a.children = slices.Delete(a.children, i, i+1)
	}
}

func (a *supervisorActor) forgetIfRemoved(c *child) {
	if c.remove || c.spec.Restart == Temporary {
		a.removeChild(c)
	}
}

func contains(cs []*child, c *child) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

// dropStaleChild clears the slot protoactor's set of an actor's children
// left behind when it removed the child that just terminated (it does so
// before the Terminated message is handled): PIDSet.Remove shortens its
// slice without clearing the freed slot, and the *PID there caches its
// process, so every child removed last kept its whole dead actor (props,
// state) alive until a new child overwrote the slot: after thousands of
// children exited (a node's jobs hibernating) nearly all of them, ~1.8 KB
// a job at 20,000 jobs. Only this actor touches its own children set.
func dropStaleChild(ctx actor.Context) {
	kids := ctx.Children()
	if n := len(kids); n < cap(kids) {
		kids[:n+1][n] = nil
	}
}
