package schedpolicy

// Load is what a node's share of the queue depends on: the jobs it holds
// (running, parked ones included) and how many more it can take (its free
// slots).
type Load struct {
	Held, Free int
}

// AcceptShare is how many of the pending jobs a node may accept now so
// that the nodes of a cluster end up holding about as many jobs each: the
// pending jobs are spread over self and the peers (the other live
// replication nodes that accept jobs: a drained or full node takes no part)
// by water-filling, each node filled up to one level of held jobs, none
// beyond its free slots, and self's share is what it lacks to reach that
// level. The accept loops of all nodes then take about equal parts of a
// burst of new jobs, whichever loop comes first (AcceptMany took a batch
// of up to 64 where it found them: 60 jobs split 1/37/22 over three
// nodes); the pending jobs of a dead node are spread over the survivors
// (it is no longer a peer).
//
// Peers' figures come from their heartbeats, so a little old: a peer that
// accepted since shows fewer held jobs than it has, which lowers the level
// and self's share: a stale view makes a node take less than its part, not
// more (the caller decides what to do when others leave pending jobs
// waiting). Alone (no peers) a node may take every pending job.
func AcceptShare(pending int, self Load, peers []Load) int {
	if pending <= 0 {
		return 0
	}
	if len(peers) == 0 {
		return pending
	}
	self.Free = max(0, self.Free)
	// taken is what the nodes would take at level l.
	taken := func(l int) int {
		t := min(max(0, l-self.Held), self.Free)
		for _, p := range peers {
			t += min(max(0, l-p.Held), max(0, p.Free))
		}
		return t
	}
	// The lowest level at which the nodes take every pending job (or all
	// they can).
	lo, hi := 0, self.Held+self.Free
	for _, p := range peers {
		hi = max(hi, p.Held+max(0, p.Free))
	}
	if taken(hi) < pending {
		// Not all fit: every node takes all it can.
		return self.Free
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if taken(mid) >= pending {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return min(max(0, lo-self.Held), self.Free)
}
