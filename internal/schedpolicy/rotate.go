package schedpolicy

import (
	"slices"
	"sync/atomic"
	"time"
)

// RunningJob is what Rotate needs to know of a job running on this node.
type RunningJob struct {
	ID         string
	Continuous bool
	// Started is when the job last started on this node.
	Started time.Time
}

// Decision is the outcome of a rescheduling tick.
type Decision struct {
	// Stop are the jobs to stop and resubmit, in the order chosen.
	Stop []string
	// Start is how many jobs this node's acceptors may take once the stops
	// are done (free slots up to MaxJobs).
	Start int
}

// stopOrder puts the longest-running jobs first (CouchDB's longest_running
// order); the id breaks ties so that decisions are deterministic.
//
// CouchDB 3.2+ sorts by {-fair-share priority, last_started} instead, so a
// database over its share loses its jobs first. Here fair share is entirely
// on the start side (deadlines in the queue): applying it on the stop side
// too acts on the same error twice, and in the simulations it made the split
// swing by ±30% from one 20-interval window to the next, where
// longest-running-first keeps it within a few percent (same long-run
// fairness either way).
func stopOrder(a, b RunningJob) int {
	switch {
	case !a.Started.Equal(b.Started):
		return a.Started.Compare(b.Started)
	case a.ID < b.ID:
		return -1
	case a.ID > b.ID:
		return 1
	}
	return 0
}

// Peers is what a node knows of the other live replication nodes of its
// cluster when it decides a rotation (their membership records: each
// heartbeat carries the node's free slots).
type Peers struct {
	// N is how many other live replication nodes there are.
	N int
	// Free is the sum of their free slots (a drained node has none).
	Free int
	// Full is how many of them have no free slot (drained ones not
	// counted), and FullBefore how many of those sort before this node
	// by name: the full nodes share the rotation for the queue's pending
	// jobs rather than each rotate for all of them.
	Full, FullBefore int
}

// Rotate decides which of this node's running jobs to stop, as CouchDB's
// reschedule (stop_excess_jobs, then rotate_jobs), for a node alone: it is
// RotateIn with no peers.
func Rotate(running []RunningJob, pending int, p Policy, now time.Time) Decision {
	return RotateIn(running, pending, 0, Peers{}, p, now)
}

// RotateIn decides which of this node's running jobs to stop, as CouchDB's
// reschedule (stop_excess_jobs, then rotate_jobs), in a cluster:
//
//   - above MaxJobs, the excess is stopped: continuous jobs first, one-shot
//     jobs only if there are not enough continuous ones;
//   - then, with pending jobs waiting (pending counts the due jobs in the
//     queue), min(pending - free slots, running, MaxChurn - excess)
//     continuous jobs are stopped; one-shot jobs are never rotated out, and
//     jobs that ran less than MinRunTime are kept;
//   - in both cases the longest-running jobs go first;
//   - Start is the number of free slots after the stops.
//
// With peers (other live replication nodes sharing the queue), the pending
// jobs are the whole cluster's: a node rotates only when its own slots are
// all taken, and only for the pending jobs beyond the peers' free slots,
// split among the full nodes (Peers.Full: each rotating for all of them
// would stop as many jobs too many per full node, and those would run
// again at once), bounded by running and MaxChurn - excess. A node with free slots takes pending jobs rather than stop
// its own (the jobs it stopped went back to the queue it accepts from:
// they would run again at once, and on this node), and pending jobs that
// other nodes' free slots will take are no reason to rotate. Woken jobs
// (hibernated parked jobs of this node waiting for one of its slots) count
// as pending jobs but need this node's slots: the peers' free slots do not
// serve them. With no peers this is CouchDB's rule exactly, pending and
// woken counted alike.
//
// It is O(r log r) in the number r of running jobs and independent of the
// number of pending jobs.
func RotateIn(running []RunningJob, pending, woken int, peers Peers, p Policy, now time.Time) Decision {
	var cont, oneshot []RunningJob
	for _, j := range running {
		if j.Continuous {
			cont = append(cont, j)
		} else {
			oneshot = append(oneshot, j)
		}
	}
	slices.SortFunc(cont, stopOrder)
	slices.SortFunc(oneshot, stopOrder)

	var stop []string
	excess := max(0, len(running)-p.MaxJobs)
	nc := min(excess, len(cont))
	for _, j := range cont[:nc] {
		stop = append(stop, j.ID)
	}
	cont = cont[nc:]
	for _, j := range oneshot[:min(excess-nc, len(oneshot))] {
		stop = append(stop, j.ID)
	}

	left := len(running) - len(stop)
	churn := max(0, p.MaxChurn-excess)
	if slots := p.MaxJobs - left; slots >= 0 && (peers.N == 0 || slots == 0) {
		// Woken jobs take this node's free slots first; the queue's
		// pending jobs the rest and the peers' free slots; the full nodes
		// (this one among them when it has peers) split the rest, the
		// remainder going to the first by name.
		queued := max(0, pending-max(0, slots-woken)-max(0, peers.Free))
		if peers.N > 0 && queued > 0 {
			nodes := 1 + max(0, peers.Full)
			share := queued / nodes
			if max(0, peers.FullBefore) < queued%nodes {
				share++
			}
			queued = share
		}
		k := min(max(0, woken-slots)+queued, left, churn)
		for _, j := range cont {
			if k <= 0 {
				break
			}
			if p.MinRunTime > 0 && now.Sub(j.Started) < p.MinRunTime {
				continue
			}
			stop = append(stop, j.ID)
			k--
		}
	}
	return Decision{Stop: stop, Start: max(0, p.MaxJobs-(len(running)-len(stop)))}
}

// FreeSlots is a node's count of free job slots: its scheduler sets it as
// jobs start and exit, its heartbeat publishes it to the other nodes
// (RotateIn's Peers). Safe for concurrent use; the zero value knows
// nothing yet.
type FreeSlots struct{ v atomic.Int64 } // free + 1; 0: unknown

// Set records n free slots (negative counts as none).
func (f *FreeSlots) Set(n int) { f.v.Store(int64(max(0, n)) + 1) }

// Get returns the free slots last set, and false if none were.
func (f *FreeSlots) Get() (int, bool) {
	v := f.v.Load()
	return int(v - 1), v > 0
}
