// Package supervisor builds Erlang/OTP-style supervision trees on
// protoactor-go (github.com/asynkron/protoactor-go/actor).
//
// protoactor has supervision hooks and one-for-one / all-for-one strategies,
// but not OTP's semantics: it restarts an actor in place (same mailbox, so
// queued messages survive the crash), it has no rest-for-one, no ordered
// start, no restart types, no shutdown timeouts, and its restart counters are
// per child and stop the child when exceeded instead of failing the
// supervisor. This package layers OTP's rules on top of it.
//
// # Trees
//
// A Spec lists a supervisor's children (ChildSpec) in start order, its
// Strategy and its restart intensity (MaxRestarts within Period). A child is
// a worker (actor.Props) or a nested supervisor (another Spec). Start spawns
// the top supervisor under the actor system's root and returns once the whole
// tree has started:
//
//	sup, err := supervisor.Start(ctx, system, "couchrep_sup", supervisor.Spec{
//		Strategy:    supervisor.RestForOne,
//		MaxRestarts: 10,
//		Period:      time.Second,
//		Children: []supervisor.ChildSpec{
//			{Name: "event_bus", Props: eventBusProps},
//			{Name: "job_server", Supervisor: &supervisor.Spec{...}},
//		},
//	})
//	...
//	err = sup.Stop(ctx) // children in reverse order, each within its Shutdown
//
// A child's actor id is "<supervisor id>/<name>" ("couchrep_sup/event_bus"),
// so a restarted child has a PID equal to its predecessor's: messages sent to
// the name reach the current incarnation. Which lists the tree (state,
// restart type, restart count and incarnation of every node).
//
// # Start and stop order
//
// Children start one at a time, in order: the next child is spawned only
// after the previous one has acknowledged its start. A worker acknowledges
// when its handler for *actor.Started has returned without panicking (a
// receive middleware the supervisor adds to a copy of its props does this);
// a nested supervisor acknowledges once all its own children have started.
// A child that panics or exits in Started fails to start: during Start the
// children already started are stopped in reverse order and Start returns
// ErrStartFailed; during a restart the failure counts toward the intensity
// and the restart is tried again.
//
// Children stop in reverse order, each within its ChildSpec.Shutdown (5 s
// for workers, Infinity for supervisors, which stop their own children in
// order). Go cannot kill a goroutine, so an actor blocked in its Receive
// cannot be forced to stop: when the timeout expires during an orderly stop
// the supervisor publishes a ShutdownTimeout event and goes on with the next
// child (it terminates itself only once the stuck child does); when it
// expires during a restart, the supervisor gives up and escalates. Actors
// must therefore never block in Receive: run blocking work in goroutines
// under a context that Stopping cancels.
//
// # Exits and restarts
//
// A child exits normally with Exit(ctx, nil) and abnormally with Exit(ctx,
// err), by panicking (the panic and its stack become the exit reason
// "panic: <value>" and the Event's Stack), by Kill ("killed: <reason>", as a
// chaos tool would) or by an external system.Root.Stop ("stopped").
// Supervisors never use protoactor's in-place restart: a failed child is
// stopped, and when its Terminated arrives the supervisor applies OTP's rules:
//
//   - Restart types: Permanent children are always restarted (also after a
//     normal exit), Transient ones only after an abnormal exit, Temporary ones
//     never (they are removed once they exit).
//   - Strategies: OneForOne restarts the child alone; OneForAll stops all
//     other children (reverse order) and starts all of them (in order);
//     RestForOne does so for the children started after it;
//     SimpleOneForOne has only dynamic children of one template spec, added
//     with StartChild and removed with TerminateChild, each restarted alone.
//     A StartChild for the name of a child that is on its way out (its
//     exit not yet handled) waits for that exit instead of failing with
//     ErrAlreadyStarted.
//   - Intensity: every restart (including a normal exit's restart and a
//     failed restart) counts for the supervisor as a whole; more than
//     MaxRestarts within Period make it give up: it stops all its children in
//     reverse order and exits abnormally to its parent, which treats that as
//     an abnormal exit of that child. At the top, Done is closed and Err
//     wraps ErrEscalated with the reason. A zero Period means OTP's default
//     of 1 restart in 5 s.
//
// The supervisor does this work as a queue of steps (stop a child, start a
// child, apply an exit) processed one at a time, each waiting for the child's
// acknowledgement, its Terminated or its shutdown timer, so its Receive never
// blocks and it keeps answering Which, Kill and StartChild meanwhile.
// Exits that arrive while a restart is in progress are applied after it, in
// arrival order.
//
// # Events
//
// Every start, exit, restart, start failure, shutdown timeout, give-up and
// escalation is published as an *Event on the actor system's event stream
// (system.EventStream), with the supervisor's id, the child's name, the
// reason and the child's restart count. Subscribers run on the supervisor's
// goroutine and must not block. A ChildRestarted event means the restarted
// child has acknowledged its start: a test or a chaos tool awaits it to
// know that a kill has healed.
//
// # Sharing the reason with the supervisor
//
// protoactor delivers a child's Terminated (a system message) ahead of any
// user message the child sent before it, and Terminated carries no reason.
// Each incarnation of a child therefore shares a small record with its
// supervisor (reached by the child through a context extension, by the
// supervisor directly) holding its start acknowledgement and exit reason.
package supervisor
