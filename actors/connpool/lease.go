package connpool

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/redact"
)

// Lease is an owner's share of the node's connection pool: an *http.Client
// that sends at most Max concurrent requests to each endpoint (scheme, host
// and port, as CouchDB's pool keys connections) over the pool's shared
// transport. A request holds its slot until its response body is closed;
// further requests wait for a slot (first come, first served) or for their
// context. Acquire and release of slots never go through the actor.
//
// A Lease ends when its owner releases it or when the owner actor dies (the
// pool watches it): requests waiting for a slot or in flight are cancelled
// and later ones fail with ErrReleased.
type Lease struct {
	owner *actor.PID
	max   int
	trs   *transports
	pool  *counters // the incarnation's counters (nil-safe)

	ctx    context.Context // done when the lease ends
	cancel context.CancelCauseFunc
	client *http.Client

	mu sync.Mutex
	// endpoints are the slots by the URL's raw scheme and host; spellings
	// of one endpoint share them. A slice: a lease sees one or two hosts
	// (and a map costs an idle job hundreds of bytes).
	endpoints []hostSlots
	// used are the pooled transports ClientFor handed out (CloseIdle).
	used     []*http.Transport
	notify   func(*Lease) // tells the actor about Release; set once
	released atomic.Bool
}

// slots bounds the requests of one lease to one endpoint.
type slots struct {
	sem      chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	total    atomic.Uint64
}

func newLease(owner *actor.PID, max int, trs *transports, c *counters, notify func(*Lease)) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &Lease{owner: owner, max: max, trs: trs, pool: c, ctx: ctx, cancel: cancel,
		notify: notify}
	l.client = &http.Client{Transport: l}
	return l
}

// Client returns the lease's HTTP client with default connection settings
// (certificates verified against the system's roots, no proxy). It stays
// usable across restarts of the connection_pool actor; it stops working
// when the lease ends. Replication jobs use ClientFor.
func (l *Lease) Client() *http.Client { return l.client }

// ClientFor returns the lease's HTTP client for the endpoint u with the
// connection settings o (TLS, proxy, timeouts, socket options): its
// requests take the lease's slots of u's endpoint and go through the
// pool's transport for (u, o), built on first use and shared with every
// lease that asks for the same key. An error means o cannot make a
// transport (an unreadable CA file, a client key that does not decrypt).
func (l *Lease) ClientFor(u *url.URL, o couch.TransportOptions) (*http.Client, error) {
	tr, err := l.trs.get(u, o)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if !slices.Contains(l.used, tr) {
		l.used = append(l.used, tr)
	}
	l.mu.Unlock()
	return &http.Client{Transport: leaseTransport{l: l, tr: tr}}, nil
}

// CloseIdle closes the idle connections of the pooled transports the
// lease's clients use (those of its endpoints, shared with every lease of
// the same endpoints; each transport at most once a second): a job that
// parks leaves the node holding connections only for the jobs that work,
// not for connection_close_interval after a thousand jobs parked together.
// Requests in flight are not touched; a later request opens a new
// connection.
func (l *Lease) CloseIdle() {
	l.mu.Lock()
	used := slices.Clone(l.used)
	l.mu.Unlock()
	l.trs.closeIdleOf(used)
}

// leaseTransport sends a lease's requests over one pooled transport.
type leaseTransport struct {
	l  *Lease
	tr http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t leaseTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.l.roundTrip(t.tr, req)
}

// Owner is the actor the lease belongs to.
func (l *Lease) Owner() *actor.PID { return l.owner }

// Max is the most concurrent requests the lease sends to one endpoint
// (http_connections).
func (l *Lease) Max() int { return l.max }

// Done is closed when the lease ends (released, or its owner died).
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err is nil while the lease is live, then ErrReleased or ErrOwnerDied.
func (l *Lease) Err() error { return context.Cause(l.ctx) }

// Release ends the lease: requests in flight are cancelled, and the pool
// forgets it. Releasing twice is harmless.
func (l *Lease) Release() {
	if !l.end(ErrReleased) {
		return
	}
	if l.notify != nil {
		l.notify(l)
	}
}

// end ends the lease with cause; it reports whether this call ended it.
func (l *Lease) end(cause error) bool {
	if !l.released.CompareAndSwap(false, true) {
		return false
	}
	l.cancel(cause)
	return true
}

// EndpointUsage is one endpoint's slot usage under a lease.
type EndpointUsage struct {
	// Endpoint is "scheme://host:port".
	Endpoint string
	// InFlight is how many requests hold a slot now.
	InFlight int
	// Peak is the most requests that held a slot at once.
	Peak int
	// Requests counts the requests that got a slot.
	Requests uint64
}

// Usage returns the lease's per-endpoint slot usage, ordered by endpoint.
func (l *Lease) Usage() []EndpointUsage {
	l.mu.Lock()
	out := make([]EndpointUsage, 0, len(l.endpoints))
	for i, e := range l.endpoints {
		if l.aliasOfEarlier(i) {
			continue
		}
		s := e.s
		out = append(out, EndpointUsage{Endpoint: e.key, InFlight: int(s.inFlight.Load()),
			Peak: int(s.peak.Load()), Requests: s.total.Load()})
	}
	l.mu.Unlock()
	sortUsage(out)
	return out
}

type hostKey struct{ scheme, host string }

// hostSlots are the slots of one spelling of an endpoint.
type hostSlots struct {
	host hostKey
	key  string // EndpointKey
	s    *slots
}

// aliasOfEarlier reports whether endpoints[i] shares its slots with an
// earlier entry (another spelling of the same endpoint); l.mu is held.
func (l *Lease) aliasOfEarlier(i int) bool {
	for _, e := range l.endpoints[:i] {
		if e.s == l.endpoints[i].s {
			return true
		}
	}
	return false
}

// slotsFor returns the slots of u's endpoint; spellings of one endpoint
// ("H", "h:80") share them.
func (l *Lease) slotsFor(u *url.URL) *slots {
	hk := hostKey{u.Scheme, u.Host}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.endpoints {
		if e.host == hk {
			return e.s
		}
	}
	key := EndpointKey(u)
	var s *slots
	for _, e := range l.endpoints {
		if e.key == key {
			s = e.s
			break
		}
	}
	if s == nil {
		s = &slots{sem: make(chan struct{}, l.max)}
	}
	l.endpoints = append(l.endpoints, hostSlots{host: hk, key: key, s: s})
	return s
}

// EndpointKey is the pool's key for u: "scheme://host:port" with the default
// port made explicit and credentials dropped.
func EndpointKey(u *url.URL) string { return couch.HostKey(u) }

// RoundTrip implements http.RoundTripper: it takes a slot for the request's
// endpoint, sends the request on the pool's default transport and gives the
// slot back when the response body is closed (or at once on an error).
func (l *Lease) RoundTrip(req *http.Request) (*http.Response, error) {
	tr, err := l.trs.get(nil, couch.TransportOptions{TLS: couch.TLSOptions{Verify: true, MaxDepth: -1}})
	if err != nil {
		closeReqBody(req)
		return nil, err
	}
	return l.roundTrip(tr, req)
}

func (l *Lease) roundTrip(tr http.RoundTripper, req *http.Request) (*http.Response, error) {
	if err := context.Cause(l.ctx); err != nil {
		closeReqBody(req)
		return nil, fmt.Errorf("connpool: %s %s: %w", req.Method, redact.URL(req.URL.String()), err)
	}
	s := l.slotsFor(req.URL)
	select {
	case s.sem <- struct{}{}:
	default:
		l.pool.waited()
		select {
		case s.sem <- struct{}{}:
		case <-req.Context().Done():
			closeReqBody(req)
			return nil, context.Cause(req.Context())
		case <-l.ctx.Done():
			closeReqBody(req)
			return nil, fmt.Errorf("connpool: %s %s: %w", req.Method, redact.URL(req.URL.String()), context.Cause(l.ctx))
		}
	}
	n := s.inFlight.Add(1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	s.total.Add(1)
	l.pool.acquired()

	// The request is cancelled when the lease ends (its owner died).
	ctx, cancel := context.WithCancelCause(req.Context())
	h := &slotBody{lease: l, s: s, cancel: cancel}
	h.stop = context.AfterFunc(l.ctx, h.abort)
	resp, err := tr.RoundTrip(req.WithContext(ctx))
	if err != nil {
		h.done()
		if cause := context.Cause(l.ctx); cause != nil && req.Context().Err() == nil {
			return nil, fmt.Errorf("connpool: %s %s: %w", req.Method, redact.URL(req.URL.String()), cause)
		}
		return nil, err
	}
	h.ReadCloser = resp.Body
	resp.Body = h
	return resp, nil
}

// slotBody is one request's hold on a slot; it gives the slot back when the
// response body is closed.
type slotBody struct {
	io.ReadCloser
	lease  *Lease
	s      *slots
	cancel context.CancelCauseFunc
	stop   func() bool
	once   sync.Once
}

// abort cancels the request because its lease ended.
func (b *slotBody) abort() { b.cancel(context.Cause(b.lease.ctx)) }

func (b *slotBody) done() {
	b.once.Do(func() {
		b.stop()
		b.cancel(nil)
		b.s.inFlight.Add(-1)
		<-b.s.sem
		b.lease.pool.releasedSlot()
	})
}

func (b *slotBody) Close() error {
	err := b.ReadCloser.Close()
	b.done()
	return err
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
