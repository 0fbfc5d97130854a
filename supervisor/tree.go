package supervisor

import (
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// ChildState is where a child is in its life cycle, as its supervisor sees it.
type ChildState int

const (
	// Starting: spawned, its start not yet acknowledged.
	Starting ChildState = iota + 1
	// Running: started and not being stopped.
	Running
	// Stopping: its supervisor asked it to stop (or it is being killed).
	Stopping
	// Stopped: not running (never started, exited without restart, or
	// terminated with TerminateChild).
	Stopped
)

// String returns the state's name, e.g. "running".
func (s ChildState) String() string {
	switch s {
	case Starting:
		return "starting"
	case Running:
		return "running"
	case Stopping:
		return "stopping"
	case Stopped:
		return "stopped"
	default:
		return fmt.Sprintf("state(%d)", int(s))
	}
}

// TreeNode is one node of a supervision tree as listed by Which.
type TreeNode struct {
	// Name is the child name (the top supervisor's name at the root).
	Name string
	// PID is the actor's PID (that of its last incarnation if stopped; nil if
	// it never started).
	PID *actor.PID
	// IsSupervisor is true for supervisors.
	IsSupervisor bool
	// Strategy is the supervisor's strategy (supervisors only).
	Strategy Strategy
	// Restart is the child's restart type.
	Restart Restart
	// State is the child's state.
	State ChildState
	// RestartCount is how many times the child was restarted by this
	// incarnation of its supervisor.
	RestartCount int
	// Incarnation is 1 on the first start and grows by one on each restart.
	Incarnation uint64
	// StartedAt is when the current incarnation acknowledged its start.
	StartedAt time.Time
	// Children are a supervisor's children in start order.
	Children []*TreeNode
}

// Walk calls fn for the node and every node below it, depth first in start
// order, with each node's path of names from n ("top/job_server/jobs_sup").
func (n *TreeNode) Walk(fn func(path string, node *TreeNode)) {
	n.walk("", fn)
}

func (n *TreeNode) walk(prefix string, fn func(string, *TreeNode)) {
	path := n.Name
	if prefix != "" {
		path = prefix + "/" + n.Name
	}
	fn(path, n)
	for _, c := range n.Children {
		c.walk(path, fn)
	}
}

// String renders the tree, one node per line, indented by depth.
func (n *TreeNode) String() string {
	var b strings.Builder
	n.render(&b, 0)
	return b.String()
}

func (n *TreeNode) render(b *strings.Builder, depth int) {
	fmt.Fprintf(b, "%s%s", strings.Repeat("  ", depth), n.Name)
	if n.IsSupervisor {
		fmt.Fprintf(b, " (%s)", n.Strategy)
	}
	fmt.Fprintf(b, " %s %s restarts=%d incarnation=%d\n", n.Restart, n.State, n.RestartCount, n.Incarnation)
	for _, c := range n.Children {
		c.render(b, depth+1)
	}
}
