package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"
)

// Supervisor is a handle on a running top-level supervisor.
type Supervisor struct {
	system *actor.ActorSystem
	pid    *actor.PID
	cell   *cell
	done   chan struct{}
}

// Start spawns a top-level supervisor named name under the actor system's
// root and returns once every child has started, in order. It fails with
// ErrInvalidSpec for a malformed spec, ErrAlreadyStarted if an actor of that
// name exists, ErrStartFailed (with the reason) if a child failed to start
// (the children already started are then stopped in reverse order), or the
// context's error (the supervisor is then told to stop).
func Start(ctx context.Context, system *actor.ActorSystem, name string, spec Spec) (*Supervisor, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := spec.validate(name); err != nil {
		return nil, err
	}
	log := zerolog.Nop()
	if spec.Logger != nil {
		log = *spec.Logger
	}
	started := make(chan struct{})
	s := &Supervisor{system: system, done: make(chan struct{})}
	s.cell = &cell{
		log:       log,
		deferAck:  true,
		onAck:     func() { close(started) },
		onStopped: func() { close(s.done) },
	}
	pid, err := system.Root.SpawnNamed(supervisorProps(system, name, spec.normalized(), log, s.cell,
		&child{spec: ChildSpec{Restart: Permanent}, incarnation: 1}), name)
	if err != nil {
		if errors.Is(err, actor.ErrNameExists) {
			return nil, fmt.Errorf("%w: %s", ErrAlreadyStarted, name)
		}
		return nil, fmt.Errorf("supervisor: spawn %s: %w", name, err)
	}
	s.pid = pid
	select {
	case <-started:
		return s, nil
	case <-s.done:
		select {
		case <-started: // started, then gave up at once
			return s, nil
		default:
		}
		reason, _, _, _ := s.cell.exit()
		return nil, fmt.Errorf("%w: %s: %s", ErrStartFailed, name, reason)
	case <-ctx.Done():
		system.Root.Send(pid, &shutdownRequest{})
		return nil, fmt.Errorf("supervisor: start %s: %w", name, ctx.Err())
	}
}

// PID is the supervisor's PID; its actor id is the name given to Start.
func (s *Supervisor) PID() *actor.PID { return s.pid }

// Done is closed when the supervisor has terminated, after Stop or after it
// gave up (see Err).
func (s *Supervisor) Done() <-chan struct{} { return s.done }

// Err says why the supervisor terminated: nil while it runs and after a clean
// Stop (or an external stop of its actor); an error wrapping ErrEscalated,
// with the reason, after it gave up.
func (s *Supervisor) Err() error {
	select {
	case <-s.done:
	default:
		return nil
	}
	reason, normal, _, ok := s.cell.exit()
	if !ok || normal {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrEscalated, s.pid.Id, reason)
}

// Stop stops the tree in order: the children in reverse start order, each
// within its shutdown timeout (a child that does not stop in time is
// reported with a ShutdownTimeout event and the others are stopped anyway),
// and waits until the supervisor has terminated or ctx ends. It returns Err()
// if the supervisor had already given up.
func (s *Supervisor) Stop(ctx context.Context) error {
	select {
	case <-s.done:
		return s.Err()
	default:
	}
	s.system.Root.Send(s.pid, &shutdownRequest{})
	select {
	case <-s.done:
		return s.Err()
	case <-ctx.Done():
		return fmt.Errorf("supervisor: stop %s: %w", s.pid.Id, ctx.Err())
	}
}

// Which lists the live tree under the supervisor sup (top-level or nested):
// the supervisor itself and, recursively, its children in start order.
func Which(ctx context.Context, system *actor.ActorSystem, sup *actor.PID) (*TreeNode, error) {
	node, err := call(ctx, system, sup, func(reply chan *TreeNode) any { return &whichRequest{reply: reply} })
	if err != nil {
		return nil, err
	}
	for _, c := range node.Children {
		if !c.IsSupervisor || c.PID == nil || c.State != Running {
			continue
		}
		sub, err := Which(ctx, system, c.PID)
		switch {
		case err == nil:
			c.Children = sub.Children
		case errors.Is(err, ErrNotFound), errors.Is(err, ErrStopped):
			// restarted or stopping meanwhile: show what its parent knows
		default:
			return nil, err
		}
	}
	return node, nil
}

// StartChild starts a dynamic child named name under the SimpleOneForOne
// supervisor sup, with props (nil: the template's props), and returns its
// PID once the child has acknowledged its start. When a child of that name
// is on its way out (it stopped itself, panicked, or is being stopped or
// killed) but its exit is not handled yet, the start waits for that exit.
// It fails with ErrNotSimple, ErrAlreadyStarted (a child of that name
// runs), ErrStartFailed or ErrNotFound.
func StartChild(ctx context.Context, system *actor.ActorSystem, sup *actor.PID, name string, props *actor.Props) (*actor.PID, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	r, err := call(ctx, system, sup, func(reply chan startChildReply) any {
		return &startChildRequest{name: name, props: props, reply: reply}
	})
	if err != nil {
		return nil, err
	}
	return r.pid, r.err
}

// TerminateChild stops the child name of sup (within its shutdown timeout)
// and does not restart it. A dynamic or temporary child is then forgotten
// (its name can be used again); a static one stays listed as stopped.
func TerminateChild(ctx context.Context, system *actor.ActorSystem, sup *actor.PID, name string) error {
	err, cerr := call(ctx, system, sup, func(reply chan error) any {
		return &terminateChildRequest{name: name, reply: reply}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// Kill makes the supervised actor pid exit abnormally with reason
// "killed: <reason>", as a chaos tool would; its supervisor (derived from
// the actor id "<supervisor id>/<name>") then applies the child's restart
// type and its strategy. Kill returns once the supervisor has sent the stop;
// await the events to see the tree heal. A nested supervisor is killed by an
// orderly stop of its children first.
func Kill(ctx context.Context, system *actor.ActorSystem, pid *actor.PID, reason string) error {
	if pid == nil {
		return fmt.Errorf("%w: nil pid", ErrNotFound)
	}
	i := strings.LastIndex(pid.Id, "/")
	if i <= 0 {
		return fmt.Errorf("%w: %s is not a supervised child", ErrNotFound, pid.Id)
	}
	parent := actor.NewPID(pid.Address, pid.Id[:i])
	err, cerr := call(ctx, system, parent, func(reply chan error) any {
		return &killRequest{id: pid.Id, reason: reason, reply: reply}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// Exit is called by a supervised actor from its Receive to stop itself: a
// nil reason is a normal exit (a permanent child is still restarted, and
// that counts toward the restart intensity), any other reason an abnormal
// one with reason.Error() as the exit reason. On an actor that is not
// supervised by this package, Exit just stops it.
func Exit(ctx actor.Context, reason error) {
	if ctx == nil {
		return
	}
	if c := cellOf(ctx); c != nil {
		if reason == nil {
			c.recordExit("normal", true, "")
		} else {
			c.recordExit(reason.Error(), false, "")
		}
	}
	ctx.Stop(ctx.Self())
}

// instance is a live supervisor actor, registered so that requests to a
// PID that is not (or no longer) a supervisor fail instead of waiting.
type instance struct {
	key     instanceKey
	stopped chan struct{}
	once    sync.Once
}

type instanceKey struct {
	system *actor.ActorSystem
	id     string
}

var instances sync.Map // instanceKey → *instance

func register(system *actor.ActorSystem, id string) *instance {
	inst := &instance{key: instanceKey{system, id}, stopped: make(chan struct{})}
	instances.Store(inst.key, inst)
	return inst
}

func (i *instance) unregister() {
	i.once.Do(func() {
		instances.CompareAndDelete(i.key, i)
		close(i.stopped)
	})
}

// call sends a request built around a reply channel to the supervisor sup
// and waits for the answer, the supervisor's end, or ctx.
func call[T any](ctx context.Context, system *actor.ActorSystem, sup *actor.PID, build func(chan T) any) (T, error) {
	var zero T
	if sup == nil {
		return zero, fmt.Errorf("%w: nil supervisor pid", ErrNotFound)
	}
	v, ok := instances.Load(instanceKey{system, sup.Id})
	if !ok {
		return zero, fmt.Errorf("%w: no supervisor %s", ErrNotFound, sup.Id)
	}
	inst := v.(*instance)
	reply := make(chan T, 1)
	system.Root.Send(sup, build(reply))
	select {
	case r := <-reply:
		return r, nil
	case <-inst.stopped:
		select {
		case r := <-reply:
			return r, nil
		default:
			return zero, fmt.Errorf("%w: %s", ErrStopped, sup.Id)
		}
	case <-ctx.Done():
		return zero, fmt.Errorf("supervisor: request to %s: %w", sup.Id, ctx.Err())
	}
}
