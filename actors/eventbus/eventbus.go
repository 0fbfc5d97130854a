// Package eventbus is the node's event bus: publish/subscribe of cluster, job, document and supervisor events. It starts first, so every other actor can use it.
package eventbus

import (
	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "event_bus"

// Spec returns the actor's child spec in the node's supervision tree.
// (A placeholder until the actor is built: it starts, stops and can be killed.)
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: placeholder.Props(Name, deps.Logger)}
}
