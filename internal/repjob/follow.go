package repjob

import (
	"context"
	"slices"
	"time"

	"github.com/couchrep/couchrep/internal/jobqueue"
)

// Follower tells a reader that keeps something of every job (the /metrics
// sums, a count of running jobs per node) which jobs to read again since
// its last look: the store's generation, shard by shard (GenerationShards:
// at most jobqueue.GenerationShards keys), says which known jobs may have
// been written, the changes index (ChangedIDs) which were added. At rest a
// look reads the shards only; after one job's write, that job and the few
// others of its shard. Every maxAge it asks for every job again (a node of
// an older version bumps other shards). Not safe for concurrent use.
type Follower struct {
	s      *Store
	maxAge time.Duration

	at      time.Time
	shards  map[int64]int64
	since   string
	byShard map[int64]map[string]struct{}

	// pending is what Commit makes current.
	pendingAt     time.Time
	pendingShards map[int64]int64
	pendingSince  string
}

// NewFollower returns a Follower of s's jobs that asks for every job again
// after maxAge.
func (s *Store) NewFollower(maxAge time.Duration) *Follower {
	return &Follower{s: s, maxAge: maxAge}
}

// Next says what the reader reads now: every job (full: it calls Seen for
// each and then Commit), or ids, the jobs that may have changed since
// (it reads them, calls Seen for those that exist and Gone for those that
// do not, then Commit). Nothing read and nothing to read is ids nil. A
// reader that fails before Commit gets the same answer (or more) next time.
func (f *Follower) Next(ctx context.Context) (full bool, ids []string, err error) {
	shards, err := f.s.GenerationShards(ctx)
	if err != nil {
		return false, nil, err
	}
	f.pendingShards = shards
	if f.byShard == nil || time.Since(f.at) >= f.maxAge {
		at := time.Now()
		head, err := f.s.ChangesHead(ctx)
		if err != nil {
			return false, nil, err
		}
		f.pendingAt, f.pendingSince = at, head
		return true, nil, nil
	}
	f.pendingAt = f.at
	set := map[string]bool{}
	moved := false
	for shard, v := range shards {
		if f.shards[shard] == v {
			continue
		}
		moved = true
		for id := range f.byShard[shard] {
			set[id] = true
		}
	}
	f.pendingSince = f.since
	if !moved {
		return false, nil, nil
	}
	since := f.since
	for {
		changed, next, err := f.s.ChangedIDs(ctx, since, 1000)
		if err != nil {
			return false, nil, err
		}
		for _, id := range changed {
			set[id] = true
		}
		since = next
		if len(changed) < 1000 {
			break
		}
	}
	f.pendingSince = since
	ids = make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return false, ids, nil
}

// Seen records that job id exists (read in full, or among Next's ids).
func (f *Follower) Seen(id string) {
	if f.byShard == nil {
		f.byShard = map[int64]map[string]struct{}{}
	}
	s := jobqueue.GenerationShard(id)
	m := f.byShard[s]
	if m == nil {
		m = map[string]struct{}{}
		f.byShard[s] = m
	}
	m[id] = struct{}{}
}

// Gone records that job id no longer exists; it reports whether it was
// known.
func (f *Follower) Gone(id string) bool {
	m := f.byShard[jobqueue.GenerationShard(id)]
	if _, ok := m[id]; !ok {
		return false
	}
	delete(m, id)
	return true
}

// Reset forgets every known job: call it before the Seen calls of a full
// read.
func (f *Follower) Reset() {
	f.byShard = map[int64]map[string]struct{}{}
	f.at = time.Time{} // every job again until a Commit
}

// Commit makes the look Next answered the last one.
func (f *Follower) Commit() {
	f.at, f.shards, f.since = f.pendingAt, f.pendingShards, f.pendingSince
}
