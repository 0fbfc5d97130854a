// Package connpool is the connection_pool actor: the node's HTTP connection
// pool, handed to replication jobs as leases with per-endpoint limits,
// idle connections closed after connection_close_interval, and the leases of
// a job that dies reclaimed.
//
// # Design
//
// CouchDB has a global pool of connections keyed by host and port
// (couch_replicator_connection: acquire, release, close when the owner dies,
// close idle ones every connection_close_interval) and, per job and
// endpoint, at most http_connections of them in use (couch_replicator_httpc_pool).
// Here the actor owns the transports (one *http.Transport per pool key:
// endpoint host and port, proxy host and port, and a digest of the TLS and
// socket settings — CouchDB's key is host, port, proxy host, proxy port — each
// built by couch.NewTransport; their IdleConnTimeout is
// connection_close_interval) and the table of leases. A job asks once, with
// Acquire, for a Lease: an *http.Client whose round tripper takes one of
// http_connections slots of the request's endpoint before sending and gives
// it back when the response body is closed. So the hot path — every request
// of a replication — costs a channel send and receive, never a trip through
// the actor's mailbox.
//
// Slots are per endpoint as Go's transport sees one (scheme, host, port), not
// per database as CouchDB's per-#httpdb pools: a job whose source and target
// live on the same server shares one set of http_connections slots between
// them (the engine sends both through one *http.Client).
//
// The actor watches each lease's owner (actor.Watch). When the owner
// terminates, its leases end: waiting and in-flight requests are cancelled
// and the slots return. Stats reports what the actor counts.
//
// # Restarts
//
// State is lost when the actor restarts, like CouchDB's ETS tables: the new
// incarnation has a new transport and an empty lease table. Leases handed
// out earlier keep working (they hold their own slots and the old
// transport, whose idle connections close after connection_close_interval),
// but their owners are no longer watched. In the node's tree this is sound:
// connection_pool's supervisor is rest_for_one, so the jobs holding those
// leases are restarted too and acquire new ones. Acquire issued while the
// actor is between incarnations waits for the next one (or its context).
package connpool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/couchrep/couchrep/actors"
	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/supervisor"
)

// Name is the actor's name under the node's root supervisor.
const Name = "connection_pool"

// ConnBufferSize is the read and write buffer of each pooled connection,
// unless Config.NewTransport sets its own.
const ConnBufferSize = 1 << 10

// DefaultCloseInterval is CouchDB's connection_close_interval.
const DefaultCloseInterval = 90 * time.Second

// Errors callers branch on (with errors.Is).
var (
	// ErrReleased: a request through a lease its owner released.
	ErrReleased = errors.New("connpool: lease released")
	// ErrOwnerDied: a request through a lease whose owner actor terminated.
	ErrOwnerDied = errors.New("connpool: lease owner died")
	// ErrInvalidLease: Acquire without an owner or with max < 1.
	ErrInvalidLease = errors.New("connpool: invalid lease request")
)

// Config configures a connection_pool actor.
type Config struct {
	// CloseInterval closes connections idle for this long
	// (connection_close_interval); zero is DefaultCloseInterval.
	CloseInterval time.Duration
	// NewTransport builds the incarnation's transports, one per pool key
	// (endpoint, proxy and connection settings); nil is couch.NewTransport.
	// IdleTimeout is CloseInterval unless the options say otherwise.
	NewTransport func(couch.TransportOptions) (*http.Transport, error)
	// Logger receives the actor's logs.
	Logger zerolog.Logger
}

// Spec returns the actor's child spec in the node's supervision tree.
func Spec(deps actors.Deps) supervisor.ChildSpec {
	return supervisor.ChildSpec{Name: Name, Props: Props(Config{
		CloseInterval: deps.Config.Replicator.ConnectionCloseInterval,
		Logger:        deps.Logger,
	})}
}

// Props returns props for a connection_pool actor with cfg.
func Props(cfg Config) *actor.Props {
	if cfg.CloseInterval <= 0 {
		cfg.CloseInterval = DefaultCloseInterval
	}
	return actors.Props(func() actor.Actor {
		return &poolActor{cfg: cfg, log: cfg.Logger.With().Str("actor", Name).Logger()}
	})
}

// Stats is what the actor counts. Counts restart from zero with each
// incarnation.
type Stats struct {
	// Leases and Owners are the live leases and their distinct owners.
	Leases, Owners int
	// Acquired counts leases handed out; Released those their owner
	// released; Reclaimed those ended because their owner died.
	Acquired, Released, Reclaimed uint64
	// InFlight is how many requests hold a slot now, Requests how many got
	// one, Waited how many had to wait for one.
	InFlight int64
	// Requests: see InFlight.
	Requests uint64
	// Waited: see InFlight.
	Waited uint64
	// Endpoints is the usage of every live lease, by owner then endpoint.
	Endpoints []OwnerUsage
	// Transports are the pool keys of the transports built so far
	// (couch.TransportOptions.PoolKey: endpoint, proxy, settings digest;
	// no credentials), sorted.
	Transports []string
}

// OwnerUsage is one live lease's usage of one endpoint.
type OwnerUsage struct {
	// Owner is the lease owner's actor id.
	Owner string
	EndpointUsage
}

// counters are an incarnation's request counters, shared with its leases.
type counters struct {
	inFlight atomic.Int64
	requests atomic.Uint64
	waits    atomic.Uint64
}

func (c *counters) acquired() {
	if c != nil {
		c.inFlight.Add(1)
		c.requests.Add(1)
	}
}

func (c *counters) releasedSlot() {
	if c != nil {
		c.inFlight.Add(-1)
	}
}

func (c *counters) waited() {
	if c != nil {
		c.waits.Add(1)
	}
}

// Messages the actor understands (Go values: they never leave the process).
type (
	acquireRequest struct {
		owner *actor.PID
		max   int
		reply chan *Lease
	}
	releaseNotice struct{ lease *Lease }
	statsRequest  struct{ reply chan Stats }
)

type poolActor struct {
	cfg  Config
	log  zerolog.Logger
	inc  *actors.Incarnation
	trs  *transports
	ctrs *counters

	leases  map[*Lease]struct{}
	byOwner map[string]map[*Lease]struct{}

	acquiredN, releasedN, reclaimedN uint64
}

func (a *poolActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.start(ctx)
	case *acquireRequest:
		m.reply <- a.acquire(ctx, m)
	case *releaseNotice:
		if a.forget(ctx, m.lease) {
			a.releasedN++
		}
	case *actor.Terminated:
		a.reclaim(ctx, m.Who)
	case *statsRequest:
		m.reply <- a.stats()
	case *actor.Stopping:
		a.log.Debug().Int("leases", len(a.leases)).Msg("connpool: stopping; leases keep working unwatched")
		if a.trs != nil {
			a.trs.closeIdle()
		}
	case *actor.Stopped:
		if a.inc != nil {
			a.inc.End()
		}
	}
}

func (a *poolActor) start(ctx actor.Context) {
	a.trs = newTransports(a.cfg)
	a.ctrs = &counters{}
	a.leases, a.byOwner = map[*Lease]struct{}{}, map[string]map[*Lease]struct{}{}
	a.inc = actors.Publish(ctx.ActorSystem(), ctx.Self())
	a.log.Debug().Dur("close_interval", a.cfg.CloseInterval).Msg("connpool: started")
}

func pidKey(p *actor.PID) string { return p.Address + "/" + p.Id }

func (a *poolActor) acquire(ctx actor.Context, m *acquireRequest) *Lease {
	system, self := ctx.ActorSystem(), ctx.Self()
	l := newLease(m.owner, m.max, a.trs, a.ctrs, func(l *Lease) {
		system.Root.Send(self, &releaseNotice{lease: l})
	})
	k := pidKey(m.owner)
	set, ok := a.byOwner[k]
	if !ok {
		set = map[*Lease]struct{}{}
		a.byOwner[k] = set
		ctx.Watch(m.owner)
	}
	set[l] = struct{}{}
	a.leases[l] = struct{}{}
	a.acquiredN++
	a.log.Debug().Str("owner", m.owner.Id).Int("http_connections", m.max).Msg("connpool: lease acquired")
	return l
}

// forget drops a released lease, unwatching its owner when it holds no
// more; it reports whether the lease was this incarnation's.
func (a *poolActor) forget(ctx actor.Context, l *Lease) bool {
	if _, ok := a.leases[l]; !ok {
		return false // an earlier incarnation's lease, or reclaimed already
	}
	delete(a.leases, l)
	k := pidKey(l.owner)
	if set := a.byOwner[k]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(a.byOwner, k)
			ctx.Unwatch(l.owner)
		}
	}
	return true
}

// reclaim ends every lease of an owner that terminated.
func (a *poolActor) reclaim(_ actor.Context, who *actor.PID) {
	k := pidKey(who)
	set, ok := a.byOwner[k]
	if !ok {
		return
	}
	delete(a.byOwner, k)
	for l := range set {
		delete(a.leases, l)
		if l.end(fmt.Errorf("%w: %s", ErrOwnerDied, who.Id)) {
			a.reclaimedN++
		}
	}
	a.log.Info().Str("owner", who.Id).Int("leases", len(set)).Msg("connpool: owner died; leases reclaimed")
}

func (a *poolActor) stats() Stats {
	owners := map[string]struct{}{}
	s := Stats{Leases: len(a.leases), Acquired: a.acquiredN, Released: a.releasedN, Reclaimed: a.reclaimedN,
		InFlight: a.ctrs.inFlight.Load(), Requests: a.ctrs.requests.Load(), Waited: a.ctrs.waits.Load()}
	for l := range a.leases {
		owners[l.owner.Id] = struct{}{}
		for _, u := range l.Usage() {
			s.Endpoints = append(s.Endpoints, OwnerUsage{Owner: l.owner.Id, EndpointUsage: u})
		}
	}
	s.Owners = len(owners)
	s.Transports = a.trs.keys()
	sort.Slice(s.Endpoints, func(i, j int) bool {
		if s.Endpoints[i].Owner != s.Endpoints[j].Owner {
			return s.Endpoints[i].Owner < s.Endpoints[j].Owner
		}
		return s.Endpoints[i].Endpoint < s.Endpoints[j].Endpoint
	})
	return s
}

func sortUsage(u []EndpointUsage) {
	sort.Slice(u, func(i, j int) bool { return u[i].Endpoint < u[j].Endpoint })
}

// Pool is a handle on a connection_pool actor, usable from any goroutine.
type Pool struct {
	system *actor.ActorSystem
	pid    *actor.PID
}

// At returns a handle on the connection_pool actor pid of system.
func At(system *actor.ActorSystem, pid *actor.PID) Pool { return Pool{system: system, pid: pid} }

// Acquire returns a lease for owner that sends at most max concurrent
// requests to each endpoint (the job's http_connections). The lease ends
// when owner releases it or terminates. If the actor is between
// incarnations, Acquire waits for the next one; it gives up when ctx ends.
func (p Pool) Acquire(ctx context.Context, owner *actor.PID, max int) (*Lease, error) {
	if owner == nil || max < 1 {
		return nil, fmt.Errorf("%w: owner %v, max %d", ErrInvalidLease, owner, max)
	}
	return call(ctx, p, func(reply chan *Lease) any {
		return &acquireRequest{owner: owner, max: max, reply: reply}
	})
}

// Stats returns the actor's counters and every live lease's usage.
func (p Pool) Stats(ctx context.Context) (Stats, error) {
	return call(ctx, p, func(reply chan Stats) any { return &statsRequest{reply: reply} })
}

// call asks the current incarnation of p's actor (actors.Call: it follows
// the actor's incarnations and asks again when one ends before answering).
func call[T any](ctx context.Context, p Pool, build func(chan T) any) (T, error) {
	r, err := actors.Call(ctx, p.system, p.pid, build)
	if err != nil {
		return r, fmt.Errorf("connpool: %w", err)
	}
	return r, nil
}
