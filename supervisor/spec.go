package supervisor

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// Strategy says which children a supervisor restarts when one of them exits
// and has to be restarted.
type Strategy int

const (
	// OneForOne restarts only the child that exited.
	OneForOne Strategy = iota + 1
	// OneForAll stops every other child (in reverse start order) and then
	// starts all of them again (in start order).
	OneForAll
	// RestForOne stops the children started after the one that exited (in
	// reverse order) and then starts it and them again (in order).
	RestForOne
	// SimpleOneForOne supervises dynamic children of one template spec,
	// started with StartChild and stopped with TerminateChild; each is
	// restarted on its own, as with OneForOne.
	SimpleOneForOne
)

// String returns the OTP name of the strategy, e.g. "rest_for_one".
func (s Strategy) String() string {
	switch s {
	case OneForOne:
		return "one_for_one"
	case OneForAll:
		return "one_for_all"
	case RestForOne:
		return "rest_for_one"
	case SimpleOneForOne:
		return "simple_one_for_one"
	default:
		return fmt.Sprintf("strategy(%d)", int(s))
	}
}

// Restart is a child's restart type: when its supervisor restarts it after
// it exits.
type Restart int

const (
	// Permanent children are always restarted, whatever the exit reason
	// (also after a normal exit). The zero value of Restart means Permanent.
	Permanent Restart = iota + 1
	// Transient children are restarted only after an abnormal exit (a panic,
	// Exit with an error, Kill, an external stop).
	Transient
	// Temporary children are never restarted; once they exit they are
	// removed from their supervisor.
	Temporary
)

// String returns the OTP name of the restart type, e.g. "transient".
func (r Restart) String() string {
	switch r {
	case 0, Permanent:
		return "permanent"
	case Transient:
		return "transient"
	case Temporary:
		return "temporary"
	default:
		return fmt.Sprintf("restart(%d)", int(r))
	}
}

// Infinity as a ChildSpec.Shutdown means "wait for the child to stop however
// long it takes". It is the default for nested supervisors, which stop their
// own children within those children's timeouts.
const Infinity time.Duration = -1

// Default values applied to zero fields of a Spec or ChildSpec.
const (
	// DefaultWorkerShutdown is the shutdown timeout of a worker whose
	// ChildSpec.Shutdown is zero.
	DefaultWorkerShutdown = 5 * time.Second
	// DefaultMaxRestarts and DefaultPeriod are OTP's default restart
	// intensity, used when Spec.Period is zero.
	DefaultMaxRestarts = 1
	// DefaultPeriod: see DefaultMaxRestarts.
	DefaultPeriod = 5 * time.Second
)

// ChildSpec describes one child of a supervisor.
type ChildSpec struct {
	// Name is the child's name, unique among its siblings; the child's actor
	// id is "<supervisor id>/<Name>". It must not contain "/".
	Name string
	// Props spawns a worker. Exactly one of Props and Supervisor is set
	// (except in a SimpleOneForOne template, where both may be nil and
	// StartChild supplies the props).
	Props *actor.Props
	// Supervisor makes the child a nested supervisor with this spec.
	Supervisor *Spec
	// Restart is the child's restart type; zero means Permanent.
	Restart Restart
	// Shutdown is how long the supervisor waits for the child to stop before
	// it reports a ShutdownTimeout event. Zero means DefaultWorkerShutdown
	// for workers and Infinity for supervisors.
	Shutdown time.Duration
}

// Spec describes a supervisor: its strategy, its restart intensity and its
// children, in start order.
type Spec struct {
	// Strategy is the restart strategy; it must be set.
	Strategy Strategy
	// MaxRestarts and Period are the restart intensity: more than
	// MaxRestarts restarts (of all children together) within Period make
	// the supervisor give up: it stops its children and fails to its parent.
	MaxRestarts int
	// Period: see MaxRestarts. A zero Period selects OTP's defaults,
	// MaxRestarts = 1 and Period = 5s.
	Period time.Duration
	// Children are started in this order and stopped in reverse order.
	// A SimpleOneForOne supervisor has exactly one child spec, the template
	// of its dynamic children; it starts none of them itself.
	Children []ChildSpec
	// Logger receives the supervisor's structured logs. Nil means the parent
	// supervisor's logger (at the top: no logging).
	Logger *zerolog.Logger
}

// Errors callers can branch on (with errors.Is).
var (
	// ErrEscalated is wrapped by Supervisor.Err when the top supervisor gave
	// up (restart intensity exceeded or a shutdown timeout during a restart).
	ErrEscalated = errors.New("supervisor: escalated")
	// ErrNotFound: no such supervisor, child or live child PID.
	ErrNotFound = errors.New("supervisor: not found")
	// ErrNotSimple: StartChild on a supervisor that is not SimpleOneForOne.
	ErrNotSimple = errors.New("supervisor: not a simple_one_for_one supervisor")
	// ErrAlreadyStarted: a child or a top supervisor of that name exists.
	ErrAlreadyStarted = errors.New("supervisor: already started")
	// ErrInvalidSpec: a Spec, ChildSpec or child name is malformed.
	ErrInvalidSpec = errors.New("supervisor: invalid spec")
	// ErrStartFailed: a child (or the whole tree, for Start) failed to start.
	ErrStartFailed = errors.New("supervisor: start failed")
	// ErrStopped: the supervisor stopped (or began stopping) before it could
	// answer the request.
	ErrStopped = errors.New("supervisor: supervisor stopped")
	// ErrShutdownTimeout: TerminateChild gave up waiting for the child; it
	// is still stopping.
	ErrShutdownTimeout = errors.New("supervisor: shutdown timeout")
)

// normalized returns a copy of the spec with defaults applied.
func (s Spec) normalized() Spec {
	if s.Period == 0 {
		s.MaxRestarts, s.Period = DefaultMaxRestarts, DefaultPeriod
	}
	children := make([]ChildSpec, len(s.Children))
	for i, c := range s.Children {
		children[i] = c.normalized()
	}
	s.Children = children
	return s
}

// normalized returns a copy of the child spec with defaults applied.
func (c ChildSpec) normalized() ChildSpec {
	if c.Restart == 0 {
		c.Restart = Permanent
	}
	switch {
	case c.Shutdown < 0:
		c.Shutdown = Infinity
	case c.Shutdown == 0 && c.Supervisor != nil:
		c.Shutdown = Infinity
	case c.Shutdown == 0:
		c.Shutdown = DefaultWorkerShutdown
	}
	return c
}

// validate checks a spec and, recursively, its nested supervisors.
func (s Spec) validate(path string) error {
	if s.Strategy < OneForOne || s.Strategy > SimpleOneForOne {
		return fmt.Errorf("%w: %s: unknown strategy %d", ErrInvalidSpec, path, int(s.Strategy))
	}
	if s.MaxRestarts < 0 || s.Period < 0 {
		return fmt.Errorf("%w: %s: negative restart intensity", ErrInvalidSpec, path)
	}
	if s.Strategy == SimpleOneForOne {
		if len(s.Children) != 1 {
			return fmt.Errorf("%w: %s: simple_one_for_one needs exactly one template child spec, got %d", ErrInvalidSpec, path, len(s.Children))
		}
		t := s.Children[0]
		if t.Props != nil && t.Supervisor != nil {
			return fmt.Errorf("%w: %s: template sets both Props and Supervisor", ErrInvalidSpec, path)
		}
		if t.Supervisor != nil {
			return t.Supervisor.validate(path + "/" + t.Name)
		}
		return validRestart(t.Restart, path)
	}
	seen := make(map[string]bool, len(s.Children))
	for _, c := range s.Children {
		if err := validName(c.Name); err != nil {
			return fmt.Errorf("%w (in %s)", err, path)
		}
		if seen[c.Name] {
			return fmt.Errorf("%w: %s: duplicate child name %q", ErrInvalidSpec, path, c.Name)
		}
		seen[c.Name] = true
		if (c.Props == nil) == (c.Supervisor == nil) {
			return fmt.Errorf("%w: %s/%s: exactly one of Props and Supervisor must be set", ErrInvalidSpec, path, c.Name)
		}
		if err := validRestart(c.Restart, path+"/"+c.Name); err != nil {
			return err
		}
		if c.Supervisor != nil {
			if err := c.Supervisor.validate(path + "/" + c.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

func validRestart(r Restart, path string) error {
	if r < 0 || r > Temporary {
		return fmt.Errorf("%w: %s: unknown restart type %d", ErrInvalidSpec, path, int(r))
	}
	return nil
}

// validName checks an actor name: non-empty and without "/", which
// protoactor uses to separate a parent's id from its child's name.
func validName(name string) error {
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%w: bad name %q (empty or containing \"/\")", ErrInvalidSpec, name)
	}
	return nil
}
