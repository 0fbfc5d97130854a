package actors

import (
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// Sentinel errors of the shared middleware.
var (
	// ErrKilled is the exit reason of an actor killed by a KillRequest.
	ErrKilled = errors.New("killed")
	// ErrUnhandled answers an Ask whose message type the actor does not
	// handle.
	ErrUnhandled = errors.New("actors: message type not handled")
)

// Ask is how the admin endpoint (and Node.Request) delivers a protobuf
// message to a named actor: the middleware unwraps it for the actor if the
// actor declared the message type with Handles, and otherwise answers the
// asker with an error wrapping ErrUnhandled, so an unknown message type is a
// clear error, never a silent timeout or a crash. The actor answers with
// ctx.Respond(reply) (a proto.Message, or an error).
type Ask struct {
	Msg proto.Message
}

// Option customises Props.
type Option func(*propsConfig)

type propsConfig struct {
	handles map[protoreflect.FullName]bool
	props   []actor.PropsOption
}

// Handles declares the protobuf message types the actor answers when they
// arrive in an Ask.
func Handles(msgs ...proto.Message) Option {
	return func(c *propsConfig) {
		for _, m := range msgs {
			c.handles[m.ProtoReflect().Descriptor().FullName()] = true
		}
	}
}

// WithPropsOptions passes protoactor props options through.
func WithPropsOptions(opts ...actor.PropsOption) Option {
	return func(c *propsConfig) { c.props = append(c.props, opts...) }
}

// Props returns props for producer with couchrep's receive middleware
// installed (see the package documentation).
func Props(producer actor.Producer, opts ...Option) *actor.Props {
	c := propsConfig{handles: map[protoreflect.FullName]bool{}}
	for _, o := range opts {
		o(&c)
	}
	mw := actor.WithReceiverMiddleware(middleware(c.handles))
	return actor.PropsFromProducer(producer, append([]actor.PropsOption{mw}, c.props...)...)
}

// Failed is what an actor's background goroutine sends its actor when the
// work it does for the actor failed for good (a server stopped serving, the
// store stayed unreachable): the middleware makes the actor exit with Err,
// so that its supervisor applies its restart strategy.
type Failed struct{ Err error }

// middleware handles Ask, *messages.KillRequest and *Failed for every actor.
func middleware(handles map[protoreflect.FullName]bool) actor.ReceiverMiddleware {
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			ctx, ok := c.(actor.Context)
			if !ok {
				next(c, env)
				return
			}
			msg := env.Message
			if ask, isAsk := msg.(*Ask); isAsk {
				if req, isKill := ask.Msg.(*messages.KillRequest); isKill {
					kill(ctx, env.Sender, req)
					return
				}
				name := ask.Msg.ProtoReflect().Descriptor().FullName()
				if !handles[name] {
					if env.Sender != nil {
						ctx.Send(env.Sender, fmt.Errorf("%w: %s does not handle %s", ErrUnhandled, ctx.Self().Id, name))
					}
					return
				}
				next(c, &actor.MessageEnvelope{Header: env.Header, Message: ask.Msg, Sender: env.Sender})
				return
			}
			switch m := msg.(type) {
			case *messages.KillRequest:
				kill(ctx, env.Sender, m)
				return
			case *Failed:
				supervisor.Exit(ctx, m.Err)
				return
			}
			next(c, env)
		}
	}
}

// kill answers a kill request, then exits abnormally with reason
// "killed: <reason>" so the supervisor applies its strategy.
func kill(ctx actor.Context, sender *actor.PID, req *messages.KillRequest) {
	if sender != nil {
		ctx.Send(sender, &messages.KillResponse{Pid: ctx.Self().Id})
	}
	reason := req.GetReason()
	if reason == "" {
		reason = "requested"
	}
	supervisor.Exit(ctx, killed{reason: reason})
}

type killed struct{ reason string }

func (k killed) Error() string { return "killed: " + k.reason }
func (k killed) Unwrap() error { return ErrKilled }
