// Package startlimit bounds how many replication jobs of a node start at
// once against one server ([replicator] startup_concurrency).
//
// A job's start-up is the burst of requests before it idles: the source's
// and target's infos and checkpoints, then the catch-up of its changes
// since the checkpoint. Ten thousand jobs accepted at once (one _bulk_docs
// of _replicator documents, a node restart, a failover) would otherwise
// send ten thousand such bursts to one server at the same moment. The
// limiter queues the jobs of each server, first come first served, and
// lets n of them start at a time; the others wait (running, to every view)
// until one is through its start-up. The requests of the jobs starting
// (each sends a few at once) and of every job's checkpoints (the jobs
// started in one second checkpoint together, and park together) pass a
// second bound, Request: at most n of them in flight per server, so that
// the server never has more than n such requests of the node at once.
package startlimit

import (
	"context"
	"net/url"
	"sync"
)

// Limiter is a node's start-up limit: at most n jobs starting at once per
// server. The zero value and a nil *Limiter limit nothing.
type Limiter struct {
	mu      sync.Mutex
	n       int
	servers map[string]*queue // jobs starting, per server
	reqs    map[string]*queue // their requests in flight, per server
}

// server is one server's jobs starting and waiting.
type queue struct {
	busy    int
	waiting []*waiter
}

type waiter struct {
	ready chan struct{}
	// granted: a slot was handed to this waiter (under Limiter.mu).
	granted bool
}

// New returns a limiter letting n jobs start at once per server; n <= 0
// limits nothing.
func New(n int) *Limiter {
	return &Limiter{n: n, servers: map[string]*queue{}, reqs: map[string]*queue{}}
}

// SetLimit changes n (a configuration reload); waiters the new limit
// admits start at once.
func (l *Limiter) SetLimit(n int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n = n
	for _, m := range []map[string]*queue{l.servers, l.reqs} {
		for key, s := range m {
			l.admit(m, key, s)
		}
	}
}

// Stats is what a limiter holds now, over every server.
type Stats struct {
	Starting int // jobs holding a slot
	Waiting  int // jobs waiting for one
	Servers  int // servers with either
}

// Stats returns the jobs starting and waiting now.
func (l *Limiter) Stats() Stats {
	if l == nil {
		return Stats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{Servers: len(l.servers)}
	for _, s := range l.servers {
		st.Starting += s.busy
		st.Waiting += len(s.waiting)
	}
	return st
}

// Acquire waits for a start-up slot at server (a key from ServerOf) and
// returns the function that gives it back (idempotent), or ctx's error if
// ctx ended first.
func (l *Limiter) Acquire(ctx context.Context, server string) (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	return l.acquire(ctx, l.servers, server)
}

// Request waits until a request of a job in its start-up, or of a
// checkpoint, may be sent to server (a key from ServerOf: scheme and
// host): at most n such requests in flight per server, first come first
// served. It returns the function
// that ends the request (idempotent), or ctx's error if ctx ended first.
// A job holds its start-up slot (Acquire) while its requests take these:
// a request waits for nothing else while it holds one, so neither bound
// waits on the other. It has the shape of couch.Gate.
func (l *Limiter) Request(ctx context.Context, server string) (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	return l.acquire(ctx, l.reqs, server)
}

func (l *Limiter) acquire(ctx context.Context, m map[string]*queue, server string) (release func(), err error) {
	l.mu.Lock()
	if l.n <= 0 {
		l.mu.Unlock()
		return func() {}, nil
	}
	s := m[server]
	if s == nil {
		s = &queue{}
		m[server] = s
	}
	if s.busy < l.n && len(s.waiting) == 0 {
		s.busy++
		l.mu.Unlock()
		return l.releaser(m, server), nil
	}
	w := &waiter{ready: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	l.mu.Unlock()
	select {
	case <-w.ready:
		return l.releaser(m, server), nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		if w.granted {
			// The slot came as ctx ended: pass it on.
			l.release(m, server)
		} else {
			s.waiting = remove(s.waiting, w)
			l.drop(m, server, s)
		}
		return nil, context.Cause(ctx)
	}
}

func (l *Limiter) releaser(m map[string]*queue, server string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.release(m, server)
			l.mu.Unlock()
		})
	}
}

// release gives a slot of server in m back; l.mu is held.
func (l *Limiter) release(m map[string]*queue, server string) {
	s := m[server]
	if s == nil {
		return
	}
	s.busy--
	l.admit(m, server, s)
}

// admit hands free slots of s to its first waiters; l.mu is held.
func (l *Limiter) admit(m map[string]*queue, server string, s *queue) {
	for len(s.waiting) > 0 && (l.n <= 0 || s.busy < l.n) {
		w := s.waiting[0]
		s.waiting[0] = nil
		s.waiting = s.waiting[1:]
		s.busy++
		w.granted = true
		close(w.ready)
	}
	l.drop(m, server, s)
}

// drop forgets s once nothing holds or waits for it; l.mu is held.
func (l *Limiter) drop(m map[string]*queue, server string, s *queue) {
	if s.busy <= 0 && len(s.waiting) == 0 {
		delete(m, server)
	}
}

func remove(l []*waiter, w *waiter) []*waiter {
	for i, x := range l {
		if x == w {
			return append(l[:i], l[i+1:]...)
		}
	}
	return l
}

// ServerOf is the limiter's key of the server of a database URL: its
// scheme, host and port, without credentials or path ("" for a URL that
// does not parse, which then shares one key with every other such URL).
func ServerOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}
