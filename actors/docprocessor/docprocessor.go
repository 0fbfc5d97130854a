// Package docprocessor is the doc_processor actor: it turns documents in _replicator databases on the watched CouchDB servers into jobs.
package docprocessor

import (
	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "doc_processor"

// Spec returns the actor's child spec in the node's supervision tree.
// (A placeholder until the actor is built: it starts, stops and can be killed.)
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: placeholder.Props(Name, deps.Logger)}
}
