// Package actors holds couchrep's actors, one sub-package per actor kind, and
// the pieces every one of them shares.
//
// Every actor of a node is spawned with Props from this package, which wraps
// the actor's own producer with couchrep's receive middleware:
//
//   - a *messages.KillRequest is answered with a *messages.KillResponse and the
//     actor then exits abnormally with reason "killed: <reason>", so its
//     supervisor applies its restart strategy (this is what
//     `couchrepctl kill` sends);
//   - an Ask (how the admin endpoint delivers a protobuf request to a named
//     actor) is unwrapped for the actor if it declared the message type with
//     Handles, and answered with an error wrapping ErrUnhandled otherwise;
//   - a *Failed, which an actor's background goroutine sends its actor when
//     its work failed for good, makes the actor exit with that error, so its
//     supervisor applies its restart strategy.
//
// Actors never block in Receive: I/O runs in goroutines under a context that
// is cancelled when the actor stops, and results come back to the actor as
// messages.
package actors
