package supervisor

import (
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/ctxext"
	"github.com/rs/zerolog"
)

// A cell is shared by one incarnation of a supervised actor and its
// supervisor. protoactor delivers Terminated (a system message) ahead of the
// user messages a child sent before it terminated, and Terminated carries no
// reason, so the child's exit reason and its start acknowledgement are
// recorded here, where the supervisor reads them when Terminated arrives.
type cell struct {
	log      zerolog.Logger
	deferAck bool // a supervisor acknowledges itself once its children started

	mu       sync.Mutex
	acked    bool
	exited   bool
	stopping bool // the actor received Stopping
	reason   string
	normal   bool
	stack    string
	panicked bool

	onAck     func() // called once, on acknowledgement
	onStopped func() // called once, after the actor's Stopped handler
	stopOnce  sync.Once
}

// cellExtensionID is the context-extension slot holding an actor's cell.
var cellExtensionID = ctxext.NextContextExtensionID()

type cellExtension struct{ c *cell }

func (cellExtension) ExtensionID() ctxext.ContextExtensionID { return cellExtensionID }

// cellOf returns the cell of the actor owning ctx, or nil if it is not
// supervised by this package.
func cellOf(ctx actor.ExtensionContext) (c *cell) {
	defer func() {
		if recover() != nil { // protoactor indexes a slice without a bounds check
			c = nil
		}
	}()
	if ext, ok := ctx.Get(cellExtensionID).(cellExtension); ok {
		return ext.c
	}
	return nil
}

// options returns the props options that tie an actor to the cell: the
// context extension (for Exit) and the receive middleware.
func (c *cell) options() []actor.PropsOption {
	return []actor.PropsOption{
		actor.WithOnInit(func(ctx actor.Context) { ctx.Set(cellExtension{c}) }),
		actor.WithReceiverMiddleware(c.middleware),
	}
}

// recordExit records why the actor exits; the first reason wins.
func (c *cell) recordExit(reason string, normal bool, stack string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return
	}
	c.exited, c.reason, c.normal, c.stack = true, reason, normal, stack
}

// exit returns the recorded exit reason, if any.
func (c *cell) exit() (reason string, normal bool, stack string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason, c.normal, c.stack, c.exited
}

func (c *cell) hasExited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exited
}

// leaving reports whether the actor is on its way out: it recorded an
// exit reason or began stopping.
func (c *cell) leaving() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exited || c.stopping
}

func (c *cell) hasPanicked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.panicked
}

// ack marks the actor started and notifies whoever waits for it, once.
func (c *cell) ack() {
	c.mu.Lock()
	if c.acked {
		c.mu.Unlock()
		return
	}
	c.acked = true
	notify := c.onAck
	c.mu.Unlock()
	if notify != nil {
		notify()
	}
}

func (c *cell) isAcked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acked
}

// middleware is the receive middleware of every supervised actor (workers
// get it appended to their props, so it runs closest to the actor): it
// acknowledges a successful start, turns a panic into an exit reason with its
// stack and stops the actor (instead of protoactor's in-place restart, which
// would keep the old mailbox), and guards the lifecycle handlers.
func (c *cell) middleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(ctx actor.ReceiverContext, env *actor.MessageEnvelope) {
		switch env.Message.(type) {
		case *actor.Started:
			if c.invoke(ctx, env, next, true) && !c.deferAck && !c.hasExited() {
				c.ack()
			}
		case *actor.Stopping:
			c.mu.Lock()
			c.stopping = true
			c.mu.Unlock()
			c.invoke(ctx, env, next, false)
		case *actor.Restarting:
			c.invoke(ctx, env, next, false)
		case *actor.Stopped:
			c.invoke(ctx, env, next, false)
			c.stopOnce.Do(func() {
				if c.onStopped != nil {
					c.onStopped()
				}
			})
		default:
			if c.hasPanicked() {
				return // the actor is stopping after a panic: drop the rest
			}
			c.invoke(ctx, env, next, true)
		}
	}
}

// invoke runs next, recovering a panic into the cell's exit reason. After a
// panic in an ordinary handler the actor is stopped; a panic in a lifecycle
// handler (Stopping, Stopped) is only recorded, since the actor is already
// stopping and a re-panic there would wedge it.
func (c *cell) invoke(ctx actor.ReceiverContext, env *actor.MessageEnvelope, next actor.ReceiverFunc, stop bool) (ok bool) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		ok = false
		stack := string(debug.Stack())
		reason := fmt.Sprintf("panic: %v", r)
		c.mu.Lock()
		c.panicked = true
		c.mu.Unlock()
		c.recordExit(reason, false, stack)
		c.log.Error().Str("pid", ctx.Self().GetId()).Str("message", fmt.Sprintf("%T", env.Message)).
			Str("reason", reason).Str("stack", stack).Msg("actor panicked")
		if stop {
			ctx.ActorSystem().Root.Stop(ctx.Self())
		}
	}()
	next(ctx, env)
	return true
}
