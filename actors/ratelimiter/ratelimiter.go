// Package ratelimiter is the rate_limiter actor: a per (method, endpoint) AIMD request interval driven by 429 responses, as CouchDB's couch_replicator_rate_limiter.
package ratelimiter

import (
	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "rate_limiter"

// Spec returns the actor's child spec in the node's supervision tree.
// (A placeholder until the actor is built: it starts, stops and can be killed.)
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: placeholder.Props(Name, deps.Logger)}
}
