package replicate

import (
	"context"
	"errors"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/couchrep/couchrep/internal/couch"
	"github.com/couchrep/couchrep/internal/pause"
)

// ErrMaxBackoff is the crash reason when an endpoint keeps answering 429
// until the rate limiter's interval reaches its maximum (CouchDB's
// max_backoff).
var ErrMaxBackoff = errors.New("replication: max_backoff: endpoint kept rate limiting")

// CouchDB's couch_replicator_rate_limiter constants, in milliseconds as
// CouchDB computes them.
const (
	// RateLimitBaseInterval is BASE_INTERVAL: the smallest non-zero
	// interval and the additive step below 100 ms.
	RateLimitBaseInterval = 20 * time.Millisecond
	// RateLimitMaxInterval is MAX_INTERVAL: reaching it fails requests with
	// ErrMaxBackoff.
	RateLimitMaxInterval = 25 * time.Second
	// RateLimitSensitivity is SENSITIVITY_TIME_WINDOW: updates arriving
	// within it of the previous one are ignored.
	RateLimitSensitivity = 80 * time.Millisecond
	// RateLimitCleanupPeriod is how often the node's rate_limiter drops
	// entries not updated for RateLimitMaxInterval (MAX_INTERVAL*2).
	RateLimitCleanupPeriod = 2 * RateLimitMaxInterval

	rlBaseMs        = 20
	rlMaxMs         = 25000
	rlSensitivityMs = 80
	rlDecayAfterMs  = 1000 // TIME_DECAY_THRESHOLD
	rlDecayFactor   = 2    // TIME_DECAY_FACTOR
	rlBackoffFactor = 1.2  // BACKOFF_FACTOR
)

// RateLimit is one key's state in a RateLimiter.
type RateLimit struct {
	// Key is the (endpoint, method) the interval applies to.
	Key couch.LimitKey
	// Interval is what every request for Key waits first.
	Interval time.Duration
	// Updated is when Interval last changed.
	Updated time.Time
}

// RateLimiter is CouchDB's AIMD rate limiter (couch_replicator_rate_limiter)
// keyed by (endpoint, method). A 429 multiplies a key's interval by 1.2
// (starting from 20 ms, capped at 25 s); a success first decays it by twice
// the time since the last update when that exceeds a second, then subtracts
// a step (20 ms up to 100 ms, 40 ms up to 1 s, 100 ms up to 10 s, then
// 1 s), floored at 20 ms, the key being forgotten when the result is not
// positive. Updates within 80 ms of the previous one are ignored. Every
// request first waits its key's interval; at 25 s it fails with
// ErrMaxBackoff instead. Intervals are whole milliseconds, rounded as
// CouchDB rounds them.
//
// A RateLimiter implements couch.Limiter and is safe for concurrent use.
type RateLimiter struct {
	now func() time.Time

	mu      sync.Mutex
	entries map[couch.LimitKey]rlEntry
}

type rlEntry struct {
	ms      int64 // interval
	updated time.Time
}

// NewRateLimiter returns an empty limiter reading the time from now (nil is
// time.Now).
func NewRateLimiter(now func() time.Time) *RateLimiter {
	if now == nil {
		now = time.Now
	}
	return &RateLimiter{entries: map[couch.LimitKey]rlEntry{}, now: now}
}

// Interval returns key's current interval (zero for an unknown key).
func (l *RateLimiter) Interval(key couch.LimitKey) time.Duration {
	l.mu.Lock()
	e := l.entries[key]
	l.mu.Unlock()
	return time.Duration(e.ms) * time.Millisecond
}

// Wait implements couch.Limiter: it sleeps key's interval, or returns
// ErrMaxBackoff once the interval reached RateLimitMaxInterval.
func (l *RateLimiter) Wait(ctx context.Context, key couch.LimitKey) error {
	d := l.Interval(key)
	if d >= RateLimitMaxInterval {
		return ErrMaxBackoff
	}
	return pause.For(ctx, d)
}

// sinceMs is CouchDB's Now - Timestamp in whole milliseconds.
func sinceMs(now, then time.Time) int64 {
	return now.UnixMilli() - then.UnixMilli()
}

// Failure implements couch.Limiter: a 429 for key.
func (l *RateLimiter) Failure(key couch.LimitKey) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if ok && sinceMs(now, e.updated) <= rlSensitivityMs {
		return
	}
	i := int64(math.Round(float64(max(e.ms, rlBaseMs)) * rlBackoffFactor))
	l.entries[key] = rlEntry{ms: min(i, rlMaxMs), updated: now}
}

// Success implements couch.Limiter: a response other than 429 for key.
func (l *RateLimiter) Success(key couch.LimitKey) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.entries[key]
	if !ok {
		return
	}
	dt := sinceMs(now, e.updated)
	if dt <= rlSensitivityMs {
		return
	}
	i := e.ms
	if dt > rlDecayAfterMs {
		i = max(i-rlDecayFactor*dt, 0)
	}
	i -= additiveStep(i)
	switch {
	case i <= 0:
		delete(l.entries, key)
	default:
		l.entries[key] = rlEntry{ms: max(i, rlBaseMs), updated: now}
	}
}

// additiveStep is CouchDB's additive_factor.
func additiveStep(ms int64) int64 {
	switch {
	case ms > 10000:
		return rlBaseMs * 50
	case ms > 1000:
		return rlBaseMs * 5
	case ms > 100:
		return rlBaseMs * 2
	default:
		return rlBaseMs
	}
}

// Snapshot returns every key's state, ordered by endpoint and method.
func (l *RateLimiter) Snapshot() []RateLimit {
	l.mu.Lock()
	out := make([]RateLimit, 0, len(l.entries))
	for k, e := range l.entries {
		out = append(out, RateLimit{Key: k, Interval: time.Duration(e.ms) * time.Millisecond, Updated: e.updated})
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key.Endpoint != out[j].Key.Endpoint {
			return out[i].Key.Endpoint < out[j].Key.Endpoint
		}
		return out[i].Key.Method < out[j].Key.Method
	})
	return out
}

// Reset forgets key (every key when key is nil) and returns how many
// entries it removed.
func (l *RateLimiter) Reset(key *couch.LimitKey) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if key != nil {
		if _, ok := l.entries[*key]; !ok {
			return 0
		}
		delete(l.entries, *key)
		return 1
	}
	n := len(l.entries)
	clear(l.entries)
	return n
}

// Cleanup forgets the keys not updated for RateLimitMaxInterval, as
// CouchDB's periodic cleanup does, and returns how many it removed.
func (l *RateLimiter) Cleanup() int {
	limit := l.now().UnixMilli() - rlMaxMs
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k, e := range l.entries {
		if e.updated.UnixMilli() < limit {
			delete(l.entries, k)
			n++
		}
	}
	return n
}
