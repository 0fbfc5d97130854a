package actors

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// Local keeps one value per actor, keyed by actor system and actor id, that
// outlives the actor's incarnations: state a restarted actor takes over, or
// that Go callers reach without a message round trip. Values live as long as
// the process.
type Local[T any] struct {
	m sync.Map // localKey → *T
}

type localKey struct {
	system *actor.ActorSystem
	id     string
}

// Get returns the value for pid in system, made by newT on first use.
func (l *Local[T]) Get(system *actor.ActorSystem, pid *actor.PID, newT func() *T) *T {
	k := localKey{system, pid.Id}
	if v, ok := l.m.Load(k); ok {
		return v.(*T)
	}
	v, _ := l.m.LoadOrStore(k, newT())
	return v.(*T)
}
