package actors

import (
	"errors"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/messages"
	"github.com/couchrep/couchrep/supervisor"
)

// ErrKilled is the exit reason of an actor killed by a KillRequest.
var ErrKilled = errors.New("killed")

// Props returns props for producer with couchrep's receive middleware
// installed (see the package documentation).
func Props(producer actor.Producer, opts ...actor.PropsOption) *actor.Props {
	opts = append([]actor.PropsOption{actor.WithReceiverMiddleware(killMiddleware)}, opts...)
	return actor.PropsFromProducer(producer, opts...)
}

// killMiddleware handles *messages.KillRequest for every actor.
func killMiddleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		req, ok := env.Message.(*messages.KillRequest)
		if !ok {
			next(c, env)
			return
		}
		ctx, ok := c.(actor.Context)
		if !ok {
			next(c, env)
			return
		}
		if env.Sender != nil {
			ctx.Send(env.Sender, &messages.KillResponse{Pid: ctx.Self().Id})
		}
		reason := req.GetReason()
		if reason == "" {
			reason = "requested"
		}
		supervisor.Exit(ctx, killedError(reason))
	}
}

type killed struct{ reason string }

func (k killed) Error() string { return "killed: " + k.reason }
func (k killed) Unwrap() error { return ErrKilled }

func killedError(reason string) error { return killed{reason: reason} }
