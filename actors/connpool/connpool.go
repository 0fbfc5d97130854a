// Package connpool is the connection_pool actor: per-endpoint HTTP connection pools with acquire/release, idle close and owner monitoring.
package connpool

import (
	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "connection_pool"

// Spec returns the actor's child spec in the node's supervision tree.
// (A placeholder until the actor is built: it starts, stops and can be killed.)
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: placeholder.Props(Name, deps.Logger)}
}
