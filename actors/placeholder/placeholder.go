// Package placeholder is an actor that only starts, stops and can be killed.
// The node uses it for the children of the supervision tree whose real
// behaviour a later part of couchrep provides, so the tree has its final
// shape from the start.
package placeholder

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
)

// Props returns props for a placeholder actor called name.
func Props(name string, logger zerolog.Logger) *actor.Props {
	return actors.Props(func() actor.Actor {
		return &placeholder{log: logger.With().Str("actor", name).Logger()}
	})
}

type placeholder struct {
	log zerolog.Logger
}

func (p *placeholder) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		p.log.Debug().Str("pid", ctx.Self().Id).Msg("started")
	case *actor.Stopping:
		p.log.Debug().Str("pid", ctx.Self().Id).Msg("stopping")
	}
}
