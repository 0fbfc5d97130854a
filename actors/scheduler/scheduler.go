// Package scheduler is the scheduler actor: fair-share priorities, backoff and the periodic rotation decisions (max_jobs, max_churn, interval) for this node's jobs.
package scheduler

import (
	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/actors/placeholder"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "scheduler"

// Spec returns the actor's child spec in the node's supervision tree.
// (A placeholder until the actor is built: it starts, stops and can be killed.)
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: placeholder.Props(Name, deps.Logger)}
}
