package supervisor

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// EventKind says what a supervisor did.
type EventKind int

const (
	// ChildStarted: a child acknowledged its first start (its Started
	// handler returned, or a nested supervisor started all its children).
	ChildStarted EventKind = iota + 1
	// ChildExited: a child terminated; Reason says why ("normal", "panic:
	// ...", "killed: ...", "stopped", "shutdown", an Exit error's text).
	ChildExited
	// ChildRestarted: a child acknowledged a restart (because of its own
	// exit or a sibling's, per the strategy) and is running again.
	ChildRestarted
	// StartFailed: a child terminated before acknowledging its start.
	StartFailed
	// ShutdownTimeout: a child did not stop within its shutdown timeout.
	ShutdownTimeout
	// GaveUp: the supervisor exceeded its restart intensity (or a child did
	// not stop in time during a restart); it now stops all its children.
	GaveUp
	// Escalated: the supervisor fails to its parent (or, at the top,
	// terminates with Err wrapping ErrEscalated) after giving up or after a
	// child failed to start during its own start.
	Escalated
)

// String returns the snake_case name of the kind, e.g. "child_restarted".
func (k EventKind) String() string {
	switch k {
	case ChildStarted:
		return "child_started"
	case ChildExited:
		return "child_exited"
	case ChildRestarted:
		return "child_restarted"
	case StartFailed:
		return "start_failed"
	case ShutdownTimeout:
		return "shutdown_timeout"
	case GaveUp:
		return "gave_up"
	case Escalated:
		return "escalated"
	default:
		return fmt.Sprintf("event(%d)", int(k))
	}
}

// Event reports one step a supervisor took. Supervisors publish every event
// on their actor system's event stream (system.EventStream.Publish(*Event));
// subscribe with system.EventStream.Subscribe. Handlers run on the
// supervisor's goroutine: they must not block.
type Event struct {
	// Kind is what happened.
	Kind EventKind
	// Supervisor is the actor id of the supervisor that acted, e.g.
	// "couchrep_sup" or "couchrep_sup/job_server".
	Supervisor string
	// Child is the child's name ("" for supervisor-wide events).
	Child string
	// Reason is the exit reason or the cause of the step.
	Reason string
	// Stack is the goroutine stack of a panic that made the child exit
	// (ChildExited and StartFailed events only; empty otherwise).
	Stack string
	// RestartCount is how many times the child has been restarted since
	// its supervisor (this incarnation of it) started.
	RestartCount int
	// PID is the child's PID (equal across incarnations).
	PID *actor.PID
	// Incarnation is the child's incarnation the event is about (1 on the
	// first start, +1 on each restart).
	Incarnation uint64
	// Time is when the supervisor acted.
	Time time.Time
}

// String formats the event for logs and test failures.
func (e *Event) String() string {
	s := fmt.Sprintf("%s %s", e.Supervisor, e.Kind)
	if e.Child != "" {
		s += " " + e.Child
	}
	if e.Reason != "" {
		s += fmt.Sprintf(" (%s)", e.Reason)
	}
	return s
}
