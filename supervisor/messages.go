package supervisor

import "github.com/asynkron/protoactor-go/actor"

// Messages a supervisor actor understands. They stay inside the process
// (protoactor remote is off), so replies travel on buffered channels.

// childAck: the child owning cell acknowledged its start.
type childAck struct {
	cell  *cell
	child *child // the child cell was made for
}

// stopTimeout: the shutdown timer of child's incarnation fired.
type stopTimeout struct {
	child       *child
	incarnation uint64
}

// shutdownRequest asks a supervisor to stop its children in reverse order and
// then itself (its parent's orderly stop, or Supervisor.Stop).
type shutdownRequest struct{}

type whichRequest struct{ reply chan *TreeNode }

type startChildRequest struct {
	name  string
	props *actor.Props
	reply chan startChildReply
	// waits: the request waits for the previous child of that name to
	// exit (logged once).
	waits bool
}

type startChildReply struct {
	pid *actor.PID
	err error
}

type terminateChildRequest struct {
	name  string
	reply chan error
}

type killRequest struct {
	id     string
	reason string
	reply  chan error
}
