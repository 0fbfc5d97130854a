// Package eventbus is the node's event bus, the first child of the root
// supervisor: actors subscribe to it with a Subscribe message and receive,
// as ordinary messages, every protobuf event published on the node's actor
// system (supervisor steps as *messages.SupervisorEvent, job state changes,
// cluster membership changes, ...). Subscribers are watched: one that stops
// is dropped. A restarted bus starts with no subscribers, so subscribers
// (which are restarted after it under rest_for_one) subscribe again.
package eventbus

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "event_bus"

// Subscribe asks the bus to deliver events to PID: those whose protobuf full
// name is in Types, or every event if Types is empty. The bus answers
// Subscribed when asked with a request.
type Subscribe struct {
	PID   *actor.PID
	Types []protoreflect.FullName
}

// Subscribed acknowledges a Subscribe.
type Subscribed struct{}

// Unsubscribe stops deliveries to PID.
type Unsubscribe struct{ PID *actor.PID }

// Convert turns events that are not protobuf messages into their protobuf
// form (the node converts supervisor events); nil drops the event.
type Convert func(evt any) proto.Message

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps, convert Convert) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: Props(convert)}
}

// Props returns the bus's props.
func Props(convert Convert) *actor.Props {
	return actors.Props(func() actor.Actor { return &bus{convert: convert, subs: map[string]*subscriber{}} })
}

type subscriber struct {
	pid   *actor.PID
	types map[protoreflect.FullName]bool
}

// published is an event the stream handed to the bus's own mailbox.
type published struct{ msg proto.Message }

type bus struct {
	convert Convert
	subs    map[string]*subscriber
	stream  *eventstream.Subscription
}

func (b *bus) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		self, root := ctx.Self(), ctx.ActorSystem().Root
		b.stream = ctx.ActorSystem().EventStream.Subscribe(func(evt any) {
			var msg proto.Message
			if p, ok := evt.(proto.Message); ok {
				msg = p
			} else if b.convert != nil {
				msg = b.convert(evt)
			}
			if msg != nil {
				root.Send(self, published{msg: msg})
			}
		})
	case *actor.Stopping:
		if b.stream != nil {
			ctx.ActorSystem().EventStream.Unsubscribe(b.stream)
		}
	case *Subscribe:
		s := &subscriber{pid: m.PID, types: map[protoreflect.FullName]bool{}}
		for _, t := range m.Types {
			s.types[t] = true
		}
		if _, known := b.subs[m.PID.String()]; !known {
			ctx.Watch(m.PID)
		}
		b.subs[m.PID.String()] = s
		if ctx.Sender() != nil {
			ctx.Respond(&Subscribed{})
		}
	case *Unsubscribe:
		if _, known := b.subs[m.PID.String()]; known {
			ctx.Unwatch(m.PID)
			delete(b.subs, m.PID.String())
		}
	case *actor.Terminated:
		delete(b.subs, m.Who.String())
	case published:
		name := m.msg.ProtoReflect().Descriptor().FullName()
		for _, s := range b.subs {
			if len(s.types) == 0 || s.types[name] {
				ctx.Send(s.pid, m.msg)
			}
		}
	}
}

// Log logs a supervisor event at the level it deserves: starts at debug,
// abnormal exits at warn, give-ups, escalations, failed starts and shutdown
// timeouts at error.
func Log(log zerolog.Logger, e *supervisor.Event) {
	lvl := zerolog.InfoLevel
	switch e.Kind {
	case supervisor.ChildStarted:
		lvl = zerolog.DebugLevel
	case supervisor.GaveUp, supervisor.Escalated, supervisor.ShutdownTimeout, supervisor.StartFailed:
		lvl = zerolog.ErrorLevel
	case supervisor.ChildExited:
		if e.Reason != "normal" && e.Reason != "shutdown" {
			lvl = zerolog.WarnLevel
		}
	}
	ev := log.WithLevel(lvl).Str("event", e.Kind.String()).Str("supervisor", e.Supervisor).
		Str("child", e.Child).Int("restart_count", e.RestartCount)
	if e.Reason != "" {
		ev = ev.Str("reason", e.Reason)
	}
	if e.PID != nil {
		ev = ev.Str("pid", e.PID.Id)
	}
	ev.Msg("supervisor")
}
