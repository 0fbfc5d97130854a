// Package ratelimiter is the rate_limiter actor: a per (method, endpoint) AIMD
// request interval driven by 429 responses, as CouchDB's
// couch_replicator_rate_limiter.
//
// The actor owns the node's table of intervals (a replication.RateLimiter,
// which holds CouchDB's arithmetic), publishes it for the node's jobs and
// drops entries not updated for 25 s every 50 s, as CouchDB's cleanup does.
// Jobs reach the table through At (the job server hands its job actors the
// rate_limiter's PID), a couch.Limiter whose Wait, Success and
// Failure read and update it directly: the hot path (every request of every
// replication) never goes through the actor's mailbox. Snapshot and Reset
// ask the actor.
//
// A job passes the node's limiter to its engine:
//
//	replication.New(p, replication.Options{Limiter: ratelimiter.At(system, pid), ...})
//
// When the actor restarts its table is lost, like CouchDB's ETS tables, and
// the new incarnation starts empty. A couch.Limiter from At looks the
// current table up on each call, so it keeps working across restarts; while
// no incarnation runs it does not limit and its updates are dropped.
// Snapshot and Reset fail with ErrNotRunning while no incarnation runs; one
// in flight when the incarnation ends is asked again of the next
// (actors.Call), never left waiting for its whole context.
package ratelimiter

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/replicate"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "rate_limiter"

// ErrNotRunning: the rate_limiter actor is not running (between
// incarnations, or stopped).
var ErrNotRunning = errors.New("ratelimiter: not running")

// Config configures a rate_limiter actor.
type Config struct {
	// CleanupPeriod is how often entries not updated for
	// replication.RateLimitMaxInterval are dropped; zero is CouchDB's
	// replication.RateLimitCleanupPeriod (50 s).
	CleanupPeriod time.Duration
	// Clock returns the current time; nil is time.Now.
	Clock func() time.Time
	// Logger receives the actor's logs.
	Logger zerolog.Logger
}

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: Props(Config{Logger: deps.Logger})}
}

// Props returns props for a rate_limiter actor with cfg.
func Props(cfg Config) *actor.Props {
	if cfg.CleanupPeriod <= 0 {
		cfg.CleanupPeriod = replicate.RateLimitCleanupPeriod
	}
	return actors.Props(func() actor.Actor {
		return &limiterActor{cfg: cfg, log: cfg.Logger.With().Str("actor", Name).Logger()}
	})
}

// Messages the actor understands (Go values: they never leave the process).
type (
	// cleanupTick is sent by the incarnation owning table; a later
	// incarnation ignores it.
	cleanupTick struct {
		table *replicate.RateLimiter
	}
	snapshotRequest struct{ reply chan []replicate.RateLimit }
	resetRequest    struct {
		key   *couch.LimitKey
		reply chan int
	}
)

type limiterActor struct {
	cfg   Config
	log   zerolog.Logger
	table *replicate.RateLimiter
	slot  *slot
	inc   *actors.Incarnation
	timer *time.Timer
}

func (a *limiterActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.table = replicate.NewRateLimiter(a.cfg.Clock)
		a.slot = slotOf(ctx.ActorSystem(), ctx.Self())
		a.slot.table.Store(a.table)
		a.inc = actors.Publish(ctx.ActorSystem(), ctx.Self())
		a.schedule(ctx)
		a.log.Debug().Msg("ratelimiter: started with an empty table")
	case *cleanupTick:
		if m.table != a.table {
			return
		}
		if n := a.table.Cleanup(); n > 0 {
			a.log.Debug().Int("removed", n).Msg("ratelimiter: cleanup")
		}
		a.schedule(ctx)
	case *snapshotRequest:
		m.reply <- a.table.Snapshot()
	case *resetRequest:
		n := a.table.Reset(m.key)
		a.log.Info().Int("removed", n).Msg("ratelimiter: reset")
		m.reply <- n
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.slot != nil {
			a.slot.table.CompareAndSwap(a.table, nil)
		}
	case *actor.Stopped:
		if a.inc != nil {
			a.inc.End()
		}
	}
}

// schedule sends the next cleanup tick through the root context (the actor
// context must not be used from the timer's goroutine).
func (a *limiterActor) schedule(ctx actor.Context) {
	system, self, tick := ctx.ActorSystem(), ctx.Self(), &cleanupTick{table: a.table}
	a.timer = time.AfterFunc(a.cfg.CleanupPeriod, func() { system.Root.Send(self, tick) })
}

// slot holds the table of the current incarnation of one rate_limiter.
type slot struct {
	table atomic.Pointer[replicate.RateLimiter]
}

var slots actors.Local[slot]

// slotOf returns the slot of the rate_limiter pid of system, created on
// first use and kept for the life of the process.
func slotOf(system *actor.ActorSystem, pid *actor.PID) *slot {
	return slots.Get(system, pid, func() *slot { return &slot{} })
}

// Limiter is a handle on a rate_limiter actor. It implements couch.Limiter
// and is safe for concurrent use.
type Limiter struct {
	system *actor.ActorSystem
	pid    *actor.PID
	slot   *slot
}

var _ couch.Limiter = (*Limiter)(nil)

// At returns a handle on the rate_limiter actor pid of system.
func At(system *actor.ActorSystem, pid *actor.PID) *Limiter {
	return &Limiter{system: system, pid: pid, slot: slotOf(system, pid)}
}

// Wait implements couch.Limiter: it sleeps key's interval, or fails with
// replication.ErrMaxBackoff at the maximum interval.
func (l *Limiter) Wait(ctx context.Context, key couch.LimitKey) error {
	if t := l.slot.table.Load(); t != nil {
		return t.Wait(ctx, key)
	}
	return nil
}

// Success implements couch.Limiter.
func (l *Limiter) Success(key couch.LimitKey) {
	if t := l.slot.table.Load(); t != nil {
		t.Success(key)
	}
}

// Failure implements couch.Limiter.
func (l *Limiter) Failure(key couch.LimitKey) {
	if t := l.slot.table.Load(); t != nil {
		t.Failure(key)
	}
}

// Interval returns key's current interval (zero when unknown or when the
// actor is not running).
func (l *Limiter) Interval(key couch.LimitKey) time.Duration {
	if t := l.slot.table.Load(); t != nil {
		return t.Interval(key)
	}
	return 0
}

// Snapshot asks the actor for every key's interval.
func (l *Limiter) Snapshot(ctx context.Context) ([]replicate.RateLimit, error) {
	return ask(ctx, l, func(reply chan []replicate.RateLimit) any { return &snapshotRequest{reply: reply} })
}

// Reset asks the actor to forget key (every key when key is nil) and returns
// how many entries it removed.
func (l *Limiter) Reset(ctx context.Context, key *couch.LimitKey) (int, error) {
	return ask(ctx, l, func(reply chan int) any { return &resetRequest{key: key, reply: reply} })
}

// ask asks the current incarnation (actors.Call). It fails at once with
// ErrNotRunning when no incarnation runs; when the incarnation ends before
// answering (killed, crashed or stopped by its supervisor) the request is
// asked again of the next one, never left waiting for a reply that cannot
// come.
func ask[T any](ctx context.Context, l *Limiter, build func(chan T) any) (T, error) {
	var zero T
	if l.slot.table.Load() == nil {
		return zero, fmt.Errorf("%w: %s", ErrNotRunning, l.pid.Id)
	}
	r, err := actors.Call(ctx, l.system, l.pid, build)
	if err != nil {
		return zero, fmt.Errorf("ratelimiter: %w", err)
	}
	return r, nil
}
