// Package park is what the parked replication jobs of a node share: the
// wake-up sources that tell a parked job its source may have changed (Wake:
// a _db_updates watch of internal/dbupdates, or any other), and the pacing
// of their safety net (Rechecks): each parked job re-reads its source's
// update_seq once per [replicator] park_recheck, jittered, and the node
// sends at most a fixed number of those reads per second in all, however
// many jobs are parked.
//
// A job parks in two steps, owned elsewhere: the engine
// (internal/replicate, Options.Park) ends an idle continuous run with a
// final checkpoint and a Parked result; the job actor (actors/jobrunner)
// keeps the job running, waits on its Wake and its recheck timer, asks
// Parked.Moved whether the source really moved, and starts a new run from
// the checkpoint when it did.
package park

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Wake is a wake-up source of a parked job: C receives (signals coalesce:
// at most one waits) when the job's source may have changed; Close ends
// it. A source that can fail for good also has Err() error (non-nil once
// it no longer works, after a last signal): the job then goes back to a
// feed of its own. *dbupdates.Watch is one.
type Wake interface {
	C() <-chan struct{}
	Close()
}

// Notifier is a Wake that can also call a function at its signals, so
// that a parked job needs no goroutine waiting on C: OnSignal(f) makes
// every later signal call f on the source's goroutine (f must return at
// once), OnSignal(nil) stops that. *dbupdates.Watch is one; a Wake that is
// not has a goroutine of the job's relay C.
type Notifier interface {
	OnSignal(f func())
}

// Err is w's Err when it has one: why it no longer works, or nil.
func Err(w Wake) error {
	if e, ok := w.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}

// DefaultRate is the most rechecks a node sends per second, all parked
// jobs together (see Rechecks). A recheck is a GET /db; PouchDB Server
// spends 2.7 ms of CPU on one (BenchmarkParkRecheck), so 5 a second are
// 1.3 % of a core at most, whatever the number of parked jobs.
const DefaultRate = 5

// Rechecks paces the safety net of a node's parked jobs: Wait lets one
// recheck through at a time, at most rate a second in all. At 10,000
// parked jobs and park_recheck 1800 s the jobs ask about 5.6 a second:
// more jobs or a shorter period stretch everyone's period instead of
// loading the servers. Safe for concurrent use.
type Rechecks struct {
	gap time.Duration
	// gather bounds a look's wait for others of its server (Look);
	// zero is DefaultGather.
	gather time.Duration
	b      batcher

	mu   sync.Mutex
	next time.Time // the earliest time the next recheck may go
}

// NewRechecks returns a pacer of at most perSecond rechecks a second
// (DefaultRate if perSecond <= 0).
func NewRechecks(perSecond float64) *Rechecks {
	if perSecond <= 0 {
		perSecond = DefaultRate
	}
	return &Rechecks{gap: time.Duration(float64(time.Second) / perSecond)}
}

// SetGather sets the longest a look waits for others of its server to
// join its batch (Look; DefaultGather when d <= 0). For tests.
func (r *Rechecks) SetGather(d time.Duration) {
	r.b.mu.Lock()
	r.gather = d
	r.b.mu.Unlock()
}

// Wait blocks until the node may send one more recheck, or ctx is done
// (its error). A nil Rechecks never waits.
func (r *Rechecks) Wait(ctx context.Context) error {
	if r == nil {
		return ctx.Err()
	}
	r.mu.Lock()
	now := time.Now()
	at := r.next
	if at.Before(now) {
		at = now
	}
	r.next = at.Add(r.gap)
	r.mu.Unlock()
	if d := at.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return ctx.Err()
}

// Jitter is a parked job's wait before its next recheck: uniform in
// [period/2, 3·period/2), so that jobs parked together do not recheck
// together.
func Jitter(period time.Duration) time.Duration {
	if period <= 0 {
		return 0
	}
	return period/2 + rand.N(period)
}

// AdoptJitter is the wait before the first recheck of a parked job a node
// adopts (another node's lease expired, or this node restarted) and puts
// straight to sleep without reading its source: uniform in [period/8,
// period/2). Its wake-up source starts watching only now, so a change
// between the previous node's last look and this watch would be signalled
// by nothing; the early recheck finds it (paced node-wide by Rechecks like
// any recheck, spread over the window so that ten thousand adopted jobs do
// not look at once) instead of the next regular one, up to 1½ periods
// later. The lower bound keeps the adoption itself free of requests to the
// sources.
func AdoptJitter(period time.Duration) time.Duration {
	if period <= 0 {
		return 0
	}
	return period/8 + rand.N(period*3/8+1)
}
