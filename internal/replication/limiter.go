package replication

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
)

// ErrMaxBackoff is the crash reason when an endpoint keeps answering 429
// until the rate limiter's interval reaches its maximum (CouchDB's
// max_backoff).
var ErrMaxBackoff = errors.New("replication: max_backoff: endpoint kept rate limiting")

// CouchDB's couch_replicator_rate_limiter constants.
const (
	rlMinInterval   = 20 * time.Millisecond
	rlMaxInterval   = 25 * time.Second
	rlSensitivity   = 80 * time.Millisecond
	rlDecayWindow   = time.Second
	rlMultiplier    = 1.2
	rlMaxIntervalMs = 25000
)

// rateLimiter is CouchDB's AIMD rate limiter keyed by (endpoint, method):
// a 429 multiplies the interval by 1.2 (min 20 ms), a success subtracts a
// step; every request first waits the current interval.
type rateLimiter struct {
	mu      sync.Mutex
	entries map[couch.LimitKey]*rlEntry
	now     func() time.Time
}

type rlEntry struct {
	interval time.Duration
	updated  time.Time
}

func newRateLimiter(now func() time.Time) *rateLimiter {
	return &rateLimiter{entries: map[couch.LimitKey]*rlEntry{}, now: now}
}

// Wait implements couch.Limiter.
func (l *rateLimiter) Wait(ctx context.Context, key couch.LimitKey) error {
	l.mu.Lock()
	var d time.Duration
	if e, ok := l.entries[key]; ok {
		d = e.interval
	}
	l.mu.Unlock()
	if d >= rlMaxInterval {
		return ErrMaxBackoff
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Failure implements couch.Limiter.
func (l *rateLimiter) Failure(key couch.LimitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	e, ok := l.entries[key]
	if ok && now.Sub(e.updated) < rlSensitivity {
		return
	}
	if !ok {
		e = &rlEntry{}
		l.entries[key] = e
	}
	i := time.Duration(float64(max(e.interval, rlMinInterval)) * rlMultiplier)
	e.interval, e.updated = min(i, rlMaxInterval), now
}

// Success implements couch.Limiter.
func (l *rateLimiter) Success(key couch.LimitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if !ok {
		return
	}
	now := l.now()
	dt := now.Sub(e.updated)
	if dt < rlSensitivity {
		return
	}
	i := e.interval
	if dt > rlDecayWindow {
		i -= 2 * dt
	}
	switch {
	case i > 10*time.Second:
		i -= time.Second
	case i > time.Second:
		i -= 100 * time.Millisecond
	case i > 100*time.Millisecond:
		i -= 40 * time.Millisecond
	default:
		i -= 20 * time.Millisecond
	}
	if i <= 0 {
		delete(l.entries, key)
		return
	}
	e.interval, e.updated = max(i, rlMinInterval), now
}
