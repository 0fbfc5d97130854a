package jobserver

import (
	"context"
	"slices"
	"time"

	"github.com/couchrep/couchrep/internal/cluster"
	"github.com/couchrep/couchrep/internal/config"
	"github.com/couchrep/couchrep/internal/schedpolicy"
)

const (
	// shareRetry is how long the accept loop waits before it looks again
	// when the pending jobs are the other nodes' share.
	shareRetry = 200 * time.Millisecond
	// minShareGrace bounds from below how long a node leaves pending jobs
	// to the others while they take none (else it takes them itself).
	minShareGrace = time.Second
)

// unknownFree stands for the free slots of a peer whose heartbeat carries
// none yet (a node starting: it will accept).
const unknownFree = 1 << 30

// fairShare spreads a burst of pending jobs over the cluster's nodes: the
// accept loop takes a batch of at most this node's share of the pending jobs
// (schedpolicy.AcceptShare, with the other live replication nodes' held
// jobs and free slots from their heartbeats), where it took as many as it
// had free slots (up to a batch of 64: 60 jobs split 1/37/22 over three
// nodes). A node that holds its share leaves the pending jobs to the
// others; if they take none for a grace period (two of their heartbeat
// intervals: their held jobs would have grown by then), it takes them
// itself, so that a peer that is alive but does not accept never strands
// jobs. Alone, or when the members cannot be read, a node takes what it has
// slots for, as before. Used by the accept loop's goroutine only.
type fairShare struct {
	reg  *cluster.Registry // nil: no cluster (no bound)
	self string
	now  func() time.Time

	// The deferral under way (since zero: none): since when this node
	// left the pending jobs to the others, and what they held then.
	since     time.Time
	peersHeld int
	// seen is what next read of the peers' held jobs and the grace.
	seen  int
	grace time.Duration
}

// next returns the Share of the accept loop's next AcceptMany, with held
// the jobs this node holds and free its free slots; nil: no bound (no
// cluster, the members unreadable, or the others left the pending jobs
// waiting for the grace period).
func (f *fairShare) next(ctx context.Context, held, free int) func(int) int {
	if f.reg == nil {
		return nil
	}
	members, err := f.reg.Members(ctx)
	if err != nil {
		return nil // as before: no bound
	}
	var peers []schedpolicy.Load
	sum, grace := 0, minShareGrace
	for _, m := range members {
		if !m.Alive || m.GetName() == f.self || m.GetDraining() || !slices.Contains(m.GetTypes(), config.NodeTypeReplication) {
			continue
		}
		l := schedpolicy.Load{Held: int(m.GetHeldJobs()), Free: unknownFree}
		if m.FreeSlots != nil {
			l.Free = int(m.GetFreeSlots())
		}
		peers = append(peers, l)
		sum += l.Held
		grace = max(grace, 2*time.Duration(m.GetHeartbeatIntervalMs())*time.Millisecond)
	}
	f.seen, f.grace = sum, grace
	if !f.since.IsZero() {
		switch now := f.now(); {
		case sum > f.peersHeld:
			// The others are taking jobs: the deferral goes on.
			f.since, f.peersHeld = now, sum
		case now.Sub(f.since) >= grace:
			return nil // they take none: this node does
		}
	}
	self := schedpolicy.Load{Held: held, Free: free}
	return func(pending int) int { return schedpolicy.AcceptShare(pending, self, peers) }
}

// deferred notes that the batch found only the others' share pending.
func (f *fairShare) deferred() {
	if f.since.IsZero() {
		f.since, f.peersHeld = f.now(), f.seen
	}
}

// taken notes that a bounded batch took jobs or found none pending: no
// deferral under way.
func (f *fairShare) taken() { f.since = time.Time{} }
